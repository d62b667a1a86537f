"""A stage's metrics reach wandb as numbers, histograms and tables, without importing pandas on the way."""

from __future__ import annotations

import subprocess
import sys
import textwrap

LOG = textwrap.dedent("""
    import sys
    import wandb
    from mascot import tracking

    run = wandb.init(project="t", mode="offline", dir=sys.argv[1])
    folder = tracking.log_metrics("stage1", {
        "pairs": 12, "margin": tracking.Histogram(values=[0.4 - 0.1, 0.7 - 0.4]),  # 0.3, but for their last bits
        "scores": tracking.Histogram(counts=[1, 2], edges=[1.0, 3.0, 5.0]),
        "accuracy": [{"persona": "beacon", "accuracy": 0.75}, {"persona": "catalyst", "accuracy": 0.5}]})
    run.finish()
    print(folder == run.dir, "pandas" in sys.modules, "pyarrow" in sys.modules)
""")


def test_histograms_and_tables_are_logged_without_importing_pandas(tmp_path):
    # A fresh process: pytest's own has pandas already (datasets imports it).
    result = subprocess.run([sys.executable, "-c", LOG, str(tmp_path)], capture_output=True, text=True, timeout=120,
                            check=False, env={"WANDB_SILENT": "true", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["True", "False", "False"]
    # Offline wandb keeps its records in one binary log, where metric names are plain bytes.
    record = next(tmp_path.glob("wandb/offline-run-*/run-*.wandb")).read_bytes()
    for name in (b"stage1/pairs", b"stage1/margin", b"stage1/scores", b"stage1/accuracy", b"histogram", b"table-file"):
        assert name in record, name
