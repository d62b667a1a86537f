"""A training step in another environment's Python (`python:` in a trainer's section): it runs in a process of that
interpreter, which imports this checkout's `mascot` from a link in the launch folder, and hands its result back.

This machine has one environment, so the "other" interpreter is this one's, started as a separate process: what the
test reads is the process the call ran in and the `mascot` it imported there, not what `launched` says of itself."""

from __future__ import annotations

import os
import pkgutil
import re
import sys
from pathlib import Path

import pytest

import mascot
from mascot.train import launch


def test_a_step_with_another_python_runs_in_a_process_of_it_and_imports_this_checkouts_mascot(tiny_config, tmp_path,
                                                                                             monkeypatch):
    monkeypatch.chdir(tmp_path)  # a working directory without the checkout, whose mascot `python -m` would import
    speaker = tiny_config.train.speaker.model_copy(update={"python": Path(sys.executable), "use_cpu": True})
    assert launch.launched(speaker, os.getpid) != os.getpid()
    imported = Path(launch.launched(speaker, pkgutil.resolve_name, "mascot:__file__"))
    assert imported.parts[-3:] == ("path", "mascot", "__init__.py") and "mascot-launch-" in str(imported)
    with pytest.raises(launch.LaunchError, match=rf"_exit in {re.escape(sys.executable)} exited with status 3.*remove "
                                                 r"accelerate_config and python"):
        launch.launched(speaker, os._exit, 3)  # os._exit: sys.exit may be wrapped by the test run, and then not pickle
    # without python, the step runs in the flow's process
    assert launch.launched(tiny_config.train.speaker.model_copy(update={"use_cpu": True}), os.getpid) == os.getpid()


def test_the_other_environment_gets_only_the_mascot_package_first_on_its_path(tiny_config, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/opt/kept")
    speaker = tiny_config.train.speaker.model_copy(update={"python": Path(sys.executable)})
    environment = launch.launch_environment(speaker, tmp_path)
    assert environment["PYTHONPATH"].split(os.pathsep) == [str(tmp_path / "path"), "/opt/kept"]
    assert sorted(p.name for p in (tmp_path / "path").iterdir()) == ["mascot"]
    # the link is to the package the flow runs; the folder above it (maybe site-packages) stays off the path
    assert (tmp_path / "path" / "mascot").resolve() == Path(mascot.__file__).resolve().parent
    # this environment's own steps get no link and keep their path
    assert launch.launch_environment(tiny_config.train.speaker, tmp_path / "x")["PYTHONPATH"] == "/opt/kept"
