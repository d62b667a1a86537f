"""The docs' one-machine commands, run exactly as written (tests/doc_blocks.py says which blocks run).

Each page runs in a fresh PREFECT_HOME, from the repository root, in the project's virtualenv, as
a user following it in a new shell. Only environment variables differ from that user's: the
server's port (PREFECT_SERVER_API_PORT), the config (CONFIG: a test-sized tiny profile), and the
caches conftest.py moves. A documented command that stops working fails here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from doc_blocks import DOCUMENTS, REPO, shell_blocks
from loopback_servers import end_process_group, free_port
from stage1_runs import write_config

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent


def user_environment(tmp_path: Path, port: int, config: Path) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items()
           if name not in {"PREFECT_API_URL", "PREFECT_PROFILE", "PREFECT_PROFILES_PATH"}}
    return {**env, "PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_API_PORT": str(port),
            "CONFIG": str(config), "PATH": f"{BIN}{os.pathsep}{env['PATH']}"}


@contextmanager
def following(document: str, env: dict[str, str], logs: Path) -> Iterator[None]:
    """The page's blocks in order: `run` blocks to completion, `background` ones left running until the
    `with` block ends, when they and the server are stopped."""
    background: list[tuple[subprocess.Popen, str]] = []
    try:
        for block in shell_blocks(document):
            if block.mode == "run":
                done = subprocess.run(["bash", "-euo", "pipefail", "-c", block.text], cwd=REPO, env=env,
                                      capture_output=True, text=True, timeout=600, check=False)
                assert done.returncode == 0, (f"{block.where} exited {done.returncode}:\n{block.text}\n"
                                              f"{(done.stdout + done.stderr)[-5000:]}")
            elif block.mode == "background":
                with (logs / f"background-{block.line}.log").open("w") as log:
                    process = subprocess.Popen(["bash", "-euo", "pipefail", "-c", block.text], cwd=REPO, env=env,
                                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
                background.append((process, block.where))
        for process, where in background:  # a long-running command that died at once would pass otherwise
            assert process.poll() is None, f"{where} exited {process.returncode}; see {logs}"
        yield
    finally:
        for process, _ in background:
            if process.poll() is None:
                end_process_group(process)
        subprocess.run([str(BIN / "mascot"), "server", "stop"], env=env, capture_output=True, timeout=60,
                       check=False)


def flow_run_states(port: int) -> list[tuple[str, str]]:
    runs = httpx.post(f"http://127.0.0.1:{port}/api/flow_runs/filter", json={}).raise_for_status().json()
    return sorted((run["name"], run["state"]["type"]) for run in runs)


@pytest.mark.parametrize("document", [d for d in DOCUMENTS if any(b.mode == "run" for b in shell_blocks(d))])
def test_the_documented_commands_run_as_written(document, tmp_path, tiny_models):
    port = free_port()
    config = write_config(tmp_path, "docs")  # 4 contexts, K=4, the session's tiny models
    env = user_environment(tmp_path, port, config)
    with following(document, env, tmp_path):
        if document == "deployments/README.md":  # read from the server, not from what the CLI printed
            assert flow_run_states(port) == [("stage1/tiny", "COMPLETED")]
            assert (tmp_path / "runs" / "tiny" / "stage1" / "pairs.parquet").exists()
    assert not (tmp_path / "prefect" / "mascot-server.json").exists(), "the server was left running"
