"""Figures for reports, drawn with matplotlib's non-interactive backend and written atomically."""

from __future__ import annotations

from pathlib import Path

from mascot.artifacts import Artifact, atomic_path, file_sha256


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(figure, out: Path) -> Artifact:
    with atomic_path(out) as temporary:
        figure.savefig(temporary, format="png", dpi=110)
    figure.clear()
    _pyplot().close(figure)
    return Artifact(path=out, sha256=file_sha256(out))


def _error(entry: dict) -> list[list[float]] | None:
    """An interval as errorbar's asymmetric extent (a percentile bootstrap's is asymmetric); none without one."""
    if entry["ci_low"] is None:
        return None  # too few clusters for an interval: the dot alone
    return [[entry["mean"] - entry["ci_low"]], [entry["ci_high"] - entry["mean"]]]


def _interval_dot(axes, y: float, entry: dict, color: str, label: str | None = None) -> None:
    """A mean as a dot and its interval as a bar."""
    axes.errorbar(entry["mean"], y, xerr=_error(entry), fmt="o", color=color, ecolor=color, elinewidth=1.5, capsize=3,
                  markersize=5, label=label)


def system_dot_plot(entries: dict[tuple[str, str], dict], systems: list[str], labels: dict[str, str],
                    metrics: list[str], title: str, out: Path) -> Artifact:
    """One panel per criterion: every system's mean (dot) and interval over contexts (bar), on 0–100.
    `entries[(system, metric)]` is a summary entry (mean, ci_low, ci_high, n, contexts, seeds)."""
    plt = _pyplot()
    shown = [s for s in systems if any((s, m) in entries for m in metrics)]
    figure, panels = plt.subplots(1, len(metrics), figsize=(2.3 * len(metrics) + 1.6, 0.38 * len(shown) + 1.6),
                                  sharey=True, squeeze=False, constrained_layout=True)
    for axes, metric in zip(panels[0], metrics, strict=True):
        for y, system in enumerate(shown):
            if (entry := entries.get((system, metric))) is not None and entry["mean"] is not None:
                _interval_dot(axes, y, entry, "C3" if system == "mascot" else "C0")
        axes.set_title(metric.replace("_", " "), fontsize=9)
        axes.set_xlim(0, 100)
        axes.grid(axis="x", alpha=0.3)
        axes.set_xlabel("score (0–100)", fontsize=8)
    panels[0][0].set_yticks(range(len(shown)), [labels[s] for s in shown], fontsize=8)
    panels[0][0].invert_yaxis()
    figure.suptitle(title, fontsize=10)
    return _save(figure, out)


def ablation_plot(entries: dict[tuple[str, str, str], dict], systems: list[str], labels: dict[str, str],
                  metrics: list[tuple[str, str]], title: str, out: Path) -> Artifact:
    """MASCOT beside its ablations on the headline criteria and the overall scores of both levels: per
    (level, metric) a group of dots with intervals, one per system. `entries[(system, level, metric)]`."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(1.5 * len(metrics) + 2.5, 3.6), constrained_layout=True)
    width = 0.7 / max(1, len(systems))
    for index, system in enumerate(systems):
        for x, (level, metric) in enumerate(metrics):
            entry = entries.get((system, level, metric))
            if entry is None or entry["mean"] is None:
                continue
            offset = x + (index - (len(systems) - 1) / 2) * width
            axes.errorbar(offset, entry["mean"], yerr=_error(entry), fmt="o", color=f"C{index}", capsize=3,
                          markersize=5, label=labels[system] if x == 0 else None)
    axes.set_xticks(range(len(metrics)), [f"{metric.replace('_', ' ')}\n({level})" for level, metric in metrics],
                    fontsize=8)
    axes.set_ylim(0, 100)
    axes.set_ylabel("score (0–100)")
    axes.grid(axis="y", alpha=0.3)
    axes.legend(fontsize=8, loc="best")
    axes.set_title(title, fontsize=10)
    return _save(figure, out)


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
