"""Figures for reports, drawn with matplotlib's non-interactive backend and written atomically."""

from __future__ import annotations

from pathlib import Path

from mascot.artifacts import Artifact, atomic_path, file_sha256


def reward_curve(log_history: list[dict], reward_names: list[str], out: Path, title: str = "GRPO reward") -> Artifact:
    """The total reward per step (mean ± sd over the step's completions, and a moving mean) and each
    reward term's mean per step."""
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [entry["step"] for entry in log_history]
    figure, (total, terms) = plt.subplots(1, 2, figsize=(10, 3.6), constrained_layout=True)
    mean = [entry["reward"] for entry in log_history]
    sd = [entry.get("reward_std", 0.0) for entry in log_history]
    total.plot(steps, mean, color="C0", linewidth=0.8, label="weighted reward (step mean)")
    total.fill_between(steps, [m - s for m, s in zip(mean, sd, strict=True)],
                       [m + s for m, s in zip(mean, sd, strict=True)], color="C0", alpha=0.15, label="± sd")
    window = max(1, len(steps) // 10)
    if window > 1:  # each step sees a few prompts only, so the trend needs smoothing to show
        trend = np.convolve(mean, np.ones(window) / window, mode="valid")
        total.plot(steps[window - 1:], trend, color="C3", linewidth=2, label=f"moving mean of {window} steps")
    total.set(title=title, xlabel="step", ylabel="reward")
    total.legend(loc="best")
    for index, name in enumerate(reward_names):
        terms.plot(steps, [entry.get(f"rewards/{name}/mean") for entry in log_history], color=f"C{index + 1}",
                   label=name)
    terms.set(title="reward terms (unweighted means)", xlabel="step")
    terms.legend(loc="best")
    with atomic_path(out) as temporary:
        figure.savefig(temporary, format="png", dpi=110)
    plt.close(figure)
    return Artifact(path=out, sha256=file_sha256(out))
