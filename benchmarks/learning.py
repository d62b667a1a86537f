"""Benchmark: the known-optimum checks at their full budget, with their figures.

    python benchmarks/learning.py [--check director|speaker] [--steps 60] [--samples 16] [--seed 0] [--cache DIR]

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
"""

from __future__ import annotations

import argparse
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
    parser.add_argument("--cache", type=Path, default=None, help="where the tiny models are built (default: the "
                        "profile's cache)")
    args = parser.parse_args()

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
    overrides = {key: value for key, value in {"learning_rate": args.learning_rate, "beta": args.beta,
                                               "batch_size": args.batch_size}.items() if value is not None}
    failed = False
    roster = load_roster(profile.data.roster)
    for check in args.check or CHECKS:
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="mascot-learning-") as scratch:
            if check == "director":
                policy = check_policy(profile.train.director, profile.train.director.model, args.steps, args.seed)
                result = run_director_check(policy.model_copy(update=overrides), roster, Path(scratch),
                                            samples_per_prompt=args.samples, seed=args.seed)
            elif check == "chain":
                director = check_director(profile, args.steps, args.seed).model_copy(update=overrides)
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


if __name__ == "__main__":
    main()
