"""MASCOT: multi-agent socio-collaborative companions, as a resumable pipeline.

The library is plain Python. Prefect lives only in the top-level `tasks/` and `flows/` packages.
"""

__version__ = "0.1.0"
