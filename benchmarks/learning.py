"""Benchmark: the known-optimum checks at their full budget, with their figures.

    python benchmarks/learning.py [--check director|chain|speaker] [--steps 60] [--samples 16] [--seed 0] [--cache DIR]
                                  [--learning-rate LR] [--beta B] [--batch-size N] [--generations G]
                                  [--temperature T] [--credit directive|choice]
    python benchmarks/learning.py --builds 3 [--config configs/tiny.yaml]

Builds (or finds in the cache) the tiny models of configs/tiny.yaml and runs each known-optimum check
(`mascot.known_optima`) with the tiny profile's trainer settings, more steps than the tests give it, and
more samples per held-out prompt. For each check it prints the planted optimum, then one line per arm:
the held-out measure before and after training, the paired difference with its 95% bootstrap interval
over held-out prompts, what the arm must show, and whether it did. It exits 1 if an arm fails.

Check 1 (`director`): the Director's GRPO alone against a planted reward (`mascot.known_optima.director_grpo`).
Check 2 (`chain`): the whole Stage 2 chain against a planted group judge (`mascot.known_optima.stage2_chain`).
Check 3 (`speaker`): the persona reward model and the Speaker's GRPO against a planted persona judge
(`mascot.known_optima.speaker_persona`): first the reward model's held-out pair accuracy and persona-swap accuracy,
then the arms. `--samples` is the replies per held-out prompt; the reward model trains with the profile's epochs.
The overrides change the trained policy's settings in every check run; `--credit` (checks 1 and 2) sets which of
a directive's tokens the Director's GRPO loss reads (`train.director.credit`: the whole directive, or its choice).

`--builds N` runs no check: it builds the profile's tiny models from seeds 0 to N-1 (`tiny.seed`) and runs the
profile's whole pipeline on each build, as `make demo` does, under the run name `<run>-build<seed>`. For each
build it prints the three learning figures with their intervals: the Speaker's held-out gain on the persona
reward model, the GRPO Director's held-out gain on the group reward model (each over the held-out contexts'
clusters) and the evaluation's primary endpoint (by default MASCOT against the untrained multi-agent
group). A figure survives a rebuild when its interval stays above 0 in every build. A second table gives each
build's links of the chain (`chain_links`), with "flat" where the interval reaches chance: the persona reward
model's held-out pair accuracy and persona swap, the group reward model's held-out pair accuracy, the reward's
spread between a state's directives, and the base and trained Directors' valid directives.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHECKS = ("director", "chain", "speaker")

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", choices=CHECKS, action="append", help="run only this check (repeatable)")
    parser.add_argument("--steps", type=int, default=60, help="GRPO steps per arm")
    parser.add_argument("--samples", type=int, default=16, help="directives (replies) sampled per held-out prompt "
                        "and policy")
    parser.add_argument("--seed", type=int, default=0, help="training and sampling seed")
    parser.add_argument("--learning-rate", type=float, default=None, help="override the check's learning rate")
    parser.add_argument("--beta", type=float, default=None, help="override the check's KL coefficient")
    parser.add_argument("--batch-size", type=int, default=None, help="override the completions per step")
    parser.add_argument("--generations", type=int, default=None, help="override the completions per prompt")
    parser.add_argument("--temperature", type=float, default=None, help="override the policy's sampling temperature, "
                        "in training and in the held-out measurement")
    parser.add_argument("--credit", choices=("directive", "choice"), default=None, help="the tokens of a "
                        "directive the Director's GRPO loss reads (checks 1 and 2; default: the profile's)")
    parser.add_argument("--cache", type=Path, default=None, help="where the tiny models are built (default: the "
                        "profile's cache)")
    parser.add_argument("--builds", type=int, default=0, help="instead of the checks: run the profile's pipeline on "
                        "tiny models built from this many seeds, and print each build's learning figures")
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "tiny.yaml", help="the profile --builds "
                        "runs (default: configs/tiny.yaml)")
    args = parser.parse_args()
    if args.builds:
        sys.exit(run_builds(args.config, args.builds))

    from mascot.config import load_config
    from mascot.known_optima.director_grpo import check_policy, run_director_check
    from mascot.known_optima.speaker_persona import (
        build_speaker_world,
        check_persona_rm,
        check_reward_model,
        check_speaker,
        run_speaker_check,
    )
    from mascot.known_optima.stage2_chain import check_director, run_chain_check
    from mascot.roster import load_roster
    from mascot.train.tiny import resolve_tiny_models

    profile = load_config(REPO / "configs" / "tiny.yaml")
    if args.cache:
        profile = profile.model_copy(update={"cache": profile.cache.model_copy(update={"dir": args.cache})})
    profile = resolve_tiny_models(profile)
    overrides = {key: value for key, value in {
        "learning_rate": args.learning_rate, "beta": args.beta, "batch_size": args.batch_size,
        "num_generations": args.generations, "temperature": args.temperature}.items() if value is not None}
    credit = {} if args.credit is None else {"credit": args.credit}  # a Director's setting, not the Speaker's
    failed = False
    roster = load_roster(profile.data.roster)
    for check in args.check or CHECKS:
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="mascot-learning-") as scratch:
            if check == "director":
                policy = check_policy(profile.train.director, profile.train.director.model, args.steps, args.seed)
                result = run_director_check(policy.model_copy(update=overrides | credit), roster, Path(scratch),
                                            samples_per_prompt=args.samples, seed=args.seed)
            elif check == "chain":
                director = check_director(profile, args.steps, args.seed).model_copy(update=overrides | credit)
                result = run_chain_check(profile, director, Path(scratch), samples_per_prompt=args.samples,
                                         seed=args.seed)
            else:
                world = build_speaker_world(profile.data, profile.stage1, profile.generation, roster,
                                            Path(scratch) / "world", args.seed)
                reward_model = check_reward_model(profile.train.persona_rm, profile.train.persona_rm.model)
                persona_rm = check_persona_rm(world, reward_model, Path(scratch) / "persona_rm")
                print("\n".join(persona_rm.lines()), flush=True)
                failed |= not persona_rm.passed
                policy = check_speaker(profile.train.speaker, profile.train.speaker.model, args.steps,
                                       args.seed).model_copy(update=overrides)
                result = run_speaker_check(world, persona_rm, policy, Path(scratch) / "speaker",
                                           samples_per_prompt=args.samples, seed=args.seed,
                                           chat_template_kwargs=reward_model.chat_template_kwargs)
        print("\n".join(result.lines()))
        print(f"  {check}: {'pass' if result.passed else 'FAIL'} in {time.perf_counter() - started:.0f} s; "
              f"settings {result.settings}")
        failed |= not result.passed
    sys.exit(1 if failed else 0)


def run_builds(profile_path: Path, builds: int) -> int:
    """Run the profile's pipeline on `builds` tiny builds (seeds 0 to builds - 1); print each one's figures."""
    import yaml

    from mascot.config import load_config

    profile = load_config(profile_path)
    if profile.tiny is None:
        raise SystemExit(f"{profile_path} builds no tiny models: --builds rebuilds a tiny profile's models")
    rows = []
    with tempfile.TemporaryDirectory(prefix="mascot-builds-") as scratch:
        for seed in range(builds):
            # The profile as loaded (every path absolute), with another seed for the tiny models.
            document = profile.model_dump(mode="json", exclude_unset=True, by_alias=True)
            document.setdefault("tiny", {})["seed"] = seed
            config = Path(scratch) / f"build{seed}.yaml"
            config.write_text(yaml.safe_dump(document, sort_keys=False))
            name = f"{profile.run.name}-build{seed}"
            print(f"build {seed}: mascot run pipeline --config {profile_path} (tiny.seed {seed}) --run-name {name}",
                  flush=True)
            started = time.perf_counter()
            done = subprocess.run([str(Path(sys.executable).parent / "mascot"), "run", "pipeline", "--config",
                                   str(config), "--run-name", name], check=False, capture_output=True, text=True)
            if done.returncode != 0:
                print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
                raise SystemExit(f"build {seed}: the pipeline failed (exit {done.returncode})")
            rows.append((seed, time.perf_counter() - started, learning_figures(profile.run.output_dir / name)))
    print(f"\n{profile_path.name}: learning figures per build (mean [95% interval]; n)")
    print(f"{'build':<6} {'minutes':>7}  {'Speaker persona-RM gain':<34} {'Director group-RM gain':<34} "
          f"{'MASCOT - untrained group (primary)':<34}")
    survived = True
    for seed, seconds, figures in rows:
        cells = [_figure(figures[key]) for key in ("speaker", "director", "primary")]
        print(f"{seed:<6} {seconds / 60:>7.1f}  " + " ".join(f"{cell:<34}" for cell in cells))
        survived &= all((figures[key] or {}).get("ci_low") is not None and figures[key]["ci_low"] > 0
                        for key in ("speaker", "director"))
    print("the Speaker's and the Director's gains " + ("have their intervals above 0 in every build" if survived
                                                        else "do NOT have their intervals above 0 in every build"))
    print(f"\nthe links of the chain per build (95% interval; flat: it reaches chance)\n{'build':<6} "
          + " ".join(f"{name:<32}" for name in LINKS))
    for seed, _, _ in rows:
        links = chain_links(profile.run.output_dir / f"{profile.run.name}-build{seed}")
        print(f"{seed:<6} " + " ".join(f"{links[name]:<32}" for name in LINKS))
    return 0 if survived else 1


LINKS = ("persona RM pairs", "persona swap", "judge: first speaker", "group RM pairs", "directive spread (sd)",
         "valid: base -> trained")


def chain_links(run_dir: Path) -> dict[str, str]:
    """Where a build's learning can go flat, read from its run directory: each reward model's held-out pair
    accuracy, the persona reward model's persona swap (does it read the persona at all?), the first speaker the group
    judge favours most (does the judge reward a choice?), the spread of the group reward model's score between a
    state's distinct valid directives (does the reward model?), and how many of the Directors' first directives were
    valid. An accuracy is flat where its interval reaches 0.5, the spread where its interval reaches 0, the judge's
    first speakers where every one's interval holds 0."""
    def read(*parts: str) -> dict:
        return json.loads(run_dir.joinpath(*parts).read_text())

    persona_rm, group_rm = read("stage1", "persona_rm", "metrics.json"), read("stage2", "group_rm", "metrics.json")
    director = read("stage2", "director_eval", "metrics.json")
    validity = director["validity"]
    return {"persona RM pairs": _accuracy(persona_rm["held_out"]["accuracy"]),
            "persona swap": _accuracy(persona_rm["held_out"]["persona_swap"]["accuracy"]),
            "judge: first speaker": _first_choice(read("stage2", "summary.json").get("first_speakers")),
            "group RM pairs": _accuracy(group_rm["held_out"]["accuracy"]),
            "directive spread (sd)": _spread(director["signal"]),
            "valid: base -> trained": f"{validity['base']['value']:.1%} -> {validity['director']['value']:.1%}"}


def _first_choice(first_speakers: dict | None) -> str:
    """The persona the group judge scores highest as first speaker (the report's `first_speakers`), with its interval."""
    if not first_speakers:
        return "not in this run's report"
    best, figure = max(first_speakers.items(), key=lambda item: item[1]["value"])
    if figure["ci_low"] is None:
        return f"{best} {figure['value']:+.3f} [no interval]"
    flat = " flat" if all(f["ci_low"] is None or f["ci_low"] <= 0 <= f["ci_high"] for f in first_speakers.values()) else ""
    return f"{best} {figure['value']:+.3f} [{figure['ci_low']:+.3f}, {figure['ci_high']:+.3f}]{flat}"


def _spread(signal: dict) -> str:
    interval = signal.get("directive_sd_ci")
    if signal.get("directive_sd") is None:
        return "none (needs 2 rollouts and a state with 2 valid directives)"
    if not interval:
        return f"{signal['directive_sd']:.3f} [no interval]"
    flat = " flat" if interval[0] <= 0 else ""
    return f"{signal['directive_sd']:.3f} [{interval[0]:.3f}, {interval[1]:.3f}]{flat}"


def _accuracy(accuracy: dict) -> str:
    flat = " flat" if accuracy["ci_low"] <= 0.5 <= accuracy["ci_high"] else ""
    return f"{accuracy['value']:.1%} [{accuracy['ci_low']:.1%}, {accuracy['ci_high']:.1%}]{flat}"


def learning_figures(run_dir: Path) -> dict[str, dict | None]:
    """A run's three learning figures, read from its run directory, each with its interval over the held-out
    contexts' clusters: the Speaker's held-out persona-RM gain, the Director's held-out group-RM gain and the
    evaluation's primary endpoint (None where the evaluation computed none)."""
    def read(*parts: str) -> dict:
        return json.loads(run_dir.joinpath(*parts).read_text())

    speaker = read("stage1", "speaker_eval", "metrics.json")["scores"]["persona_rm"]["difference_by_context"]
    director = read("stage2", "director_eval", "metrics.json")["scores"]["group_rm"]["by_context"]
    primary = (read("eval", "summary.json").get("primary") or {}).get("comparison")
    return {"speaker": {**speaker, "mean": speaker["value"]}, "director": {**director, "mean": director["value"]},
            "primary": primary}


def _figure(figure: dict | None) -> str:
    from mascot.evaluation.report import bracket

    if figure is None or figure.get("mean") is None:
        return "undefined"
    n = figure.get("clusters") or figure.get("n")
    return f"{figure['mean']:+.3f} {bracket(figure, '+.3f')}; n={n}"  # no interval from one cluster


if __name__ == "__main__":
    main()
