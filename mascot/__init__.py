"""MASCOT: multi-agent socio-collaborative companions, as a resumable pipeline.

The library is plain Python. Prefect lives only in the top-level `tasks/` and `flows/` packages.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("mascot")  # one source: the git tag, through setuptools-scm at install time
except PackageNotFoundError:  # imported from a checkout that was never installed
    __version__ = "0+unknown"
