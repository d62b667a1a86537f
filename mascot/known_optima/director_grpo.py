"""Check 1: the Director's GRPO alone, against a planted reward whose optimum is known.

The world is the Director's prompt at the opening of each emotional-support sample context: the
training split's contexts are trained on, the validation and test splits' are held out. The planted
reward is 1 when a sampled completion is a valid directive that names the target persona, else 0,
so the best policy always names the target. The target is chosen from the untrained Director's own
samples at the training prompts: a persona whose base share is between 0.15 and 0.5 (`TARGET_SHARE`),
since a persona that sampling never reaches gives GRPO no group with a reward to compare.

Three arms train from the same base with `mascot.train.grpo.train_grpo_policy`, the trainer Stage 1's
Speaker and Stage 2's Director use, on the same prompts and settings (the profile's Director's, its `credit`
among them):

- `planted`: the held-out share of the target must rise, its interval above 0;
- `flipped`: the reward times -1, so the share must fall, its interval below 0;
- `shuffled`: the same rewards permuted across the completions of each batch, so that they say nothing
  about the completion they reach; the share must stay, its interval containing 0. It trains `SHUFFLED_RUNS`
  runs with their own seeds, since its claim is about such training, not one run's noise.

The measurement samples `samples_per_prompt` directives per held-out prompt from the base policy and from
each trained one, with the same request seeds, and gives the per-prompt difference in target share a
paired bootstrap interval over the held-out prompts (one per context, so prompts are independent units);
the shuffled arm's interval is Student's t over its runs' mean differences.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mascot.config import DirectorConfig, GRPOPolicyConfig
from mascot.data import SAMPLES_DIR, load_contexts
from mascot.dialogue.directives import active_personas, director_messages, parse_directive
from mascot.dialogue.turns import opening_turns
from mascot.known_optima import EXPECTED, moved_as_expected
from mascot.llm import make_backend, run_requests
from mascot.llm.structured import ReplyError
from mascot.queries import request_seed
from mascot.roster import Roster
from mascot.stage2.director import credit_until
from mascot.stats import mean_over_runs, paired_difference
from mascot.train.grpo import policy_backend, train_grpo_policy

TARGET_SHARE = (0.15, 0.5)  # a target sampling reaches often enough to learn from, and can still gain
# The profile's Director settings but for these: 16 completions (4 prompts x 4) per step halve the gradient's noise,
# and a KL coefficient of 1.0, not the profile's 0.04, keeps a run's policy near the base where its reward says
# nothing. Sampled at the profile's temperature of 0.7, a share moves far further per step than at 1.0: with a KL
# coefficient of 0.1 the shuffled control's runs drifted by -0.13 to +0.10 in 30 steps (learning rates 3e-4 to 3e-3),
# at 1.0 and 1e-3 by +0.006 and +0.031, while the planted arm still rose by +0.15 and +0.33 (2026-12-07, the tiny
# build of docs/models.md, seeds 0 and 1).
CHECK_SETTINGS = {"learning_rate": 1e-3, "beta": 1.0, "batch_size": 16, "num_generations": 4}
# The shuffled control's claim is about training on rewards that say nothing, not about one run: one run's policy
# does move, by the noise of its own samples (a random walk), and its held-out samples, drawn with the base's seeds,
# detect a move of 0.01. So it trains this many runs (seeds seed, seed + 1, ...), and its interval is over them.
SHUFFLED_RUNS = 3
ARMS = ("planted", "flipped", "shuffled")
SOURCE, HELD_OUT_SPLITS = "empathetic_dialogues", ("validation", "test")


@dataclass(frozen=True)
class Prompt:
    id: str
    messages: list[dict[str, str]]


@dataclass(frozen=True)
class DirectorWorld:
    """The Director's prompts at the openings of the sample contexts, for training and held out."""

    roster: Roster
    training: list[Prompt]
    held_out: list[Prompt]


def director_world(roster: Roster, source: str = SOURCE) -> DirectorWorld:
    """The world of a roster's domain: `source`'s sample contexts (empathetic_dialogues, or qmsum for meetings)."""
    def prompts(split: str) -> list[Prompt]:
        return [Prompt(f"{split}/{context.id}", director_messages(roster, opening_turns(context)))
                for context in load_contexts(source, SAMPLES_DIR / source, split=split)]

    return DirectorWorld(roster, prompts("train"), [p for split in HELD_OUT_SPLITS for p in prompts(split)])


def check_policy(director: DirectorConfig, model: str | Path, steps: int, seed: int = 0) -> DirectorConfig:
    """A profile's Director settings (`train.director`) for this check: `CHECK_SETTINGS`, `steps` steps of GRPO
    on `model` (a resolved folder), no checkpoint before the last step."""
    return director.model_copy(update={**CHECK_SETTINGS, "model": str(model), "max_steps": steps,
                                       "save_steps": steps, "seed": seed})


def named_speaker(text: str, roster: Roster) -> str | None:
    """The persona a completion's directive names, or None when it is no valid directive."""
    try:
        return parse_directive(text, roster).next_speaker
    except ReplyError:
        return None


class PlantedReward:
    """TRL's reward-function form: `sign` for a directive naming `target`, 0 otherwise. With `shuffle_seed`
    the batch's rewards are permuted across its completions (the control that keeps a reward's values and
    cuts their link to the completions)."""

    def __init__(self, roster: Roster, target: str, sign: float = 1.0, shuffle_seed: int | None = None):
        self.roster, self.target, self.sign = roster, target, sign
        self.shuffle = random.Random(shuffle_seed) if shuffle_seed is not None else None
        self.__name__ = "planted"  # TRL logs a reward function under its name

    def __call__(self, prompts: list, completions: list, **_: Any) -> list[float]:
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        rewards = [self.sign * float(named_speaker(text, self.roster) == self.target) for text in texts]
        if self.shuffle is not None:
            self.shuffle.shuffle(rewards)
        return rewards


def sample_speakers(policy: GRPOPolicyConfig, adapter: Path | None, world: DirectorWorld, prompts: list[Prompt],
                    samples_per_prompt: int, seed: int) -> dict[str, list[str | None]]:
    """Per prompt, the persona each of `samples_per_prompt` sampled directives names (None: invalid), sampled
    as GRPO's rollouts sample; the seeds depend on the prompt only, so every policy meets the same ones."""
    config = policy_backend(policy, adapter)
    backend = make_backend(config)

    async def one(prompt: Prompt) -> list[str | None]:
        texts = await backend.generate(prompt.messages, n=samples_per_prompt, params=config.params,
                                       seed=request_seed(seed, prompt.id, "known_optimum"))
        return [named_speaker(text, world.roster) for text in texts]

    async def every() -> list[list[str | None]]:
        return list(await asyncio.gather(*(one(prompt) for prompt in prompts)))

    return dict(zip((p.id for p in prompts), run_requests(every()), strict=True))


def shares(speakers: dict[str, list[str | None]], roster: Roster) -> dict[str, float]:
    """Each persona's share of all samples (invalid samples count in the denominator), and `invalid`'s."""
    counts = Counter(s for named in speakers.values() for s in named)
    total = sum(len(named) for named in speakers.values())
    return {**{p.id: counts[p.id] / total for p in active_personas(roster)}, "invalid": counts[None] / total}


def pick_target(base_shares: dict[str, float], roster: Roster) -> str:
    """The persona whose base share lies in `TARGET_SHARE` and is nearest its middle (roster order breaks ties)."""
    low, high = TARGET_SHARE
    fits = [p.id for p in active_personas(roster) if low <= base_shares[p.id] <= high]
    if not fits:
        raise ValueError(f"no persona has a base share between {low} and {high} as the Director's choice "
                         f"({base_shares}): a target sampling rarely reaches cannot be learned in a short run")
    return min(fits, key=lambda pid: abs(base_shares[pid] - (low + high) / 2))


@dataclass
class ArmResult:
    arm: str
    expected: str  # "rise", "fall" or "stay"
    base_share: float
    trained_share: float
    difference: dict  # one run: mascot.stats.paired_difference over held-out prompts; more: mean_over_runs
    train_seconds: float = 0.0
    runs: int = 1

    @property
    def passed(self) -> bool:
        return moved_as_expected(self.difference, self.expected)


@dataclass
class DirectorCheck:
    target: str
    base_shares: dict[str, float]  # at the training prompts, from which the target was picked
    arms: list[ArmResult] = field(default_factory=list)
    settings: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(arm.passed for arm in self.arms)

    def lines(self) -> list[str]:
        shares_text = ", ".join(f"{pid} {share:.2f}" for pid, share in self.base_shares.items())
        out = [f"check 1, Director GRPO alone: target {self.target}; base shares at training prompts: {shares_text}"]
        for arm in self.arms:
            d = arm.difference
            out.append(f"  {arm.arm:<9} target share {arm.base_share:.3f} -> {arm.trained_share:.3f}: "
                       f"{d['mean']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] over {d['n']} "
                       f"{'training runs' if arm.runs > 1 else 'held-out prompts'}; "
                       f"expected to {arm.expected}: {'pass' if arm.passed else 'FAIL'} ({arm.train_seconds:.0f} s)")
        return out




def run_director_check(policy: DirectorConfig, roster: Roster, out: Path, *, samples_per_prompt: int = 8,
                       seed: int = 0, arms: tuple[str, ...] = ARMS, confidence: float = 0.95,
                       resamples: int = 2000) -> DirectorCheck:
    """Pick the target from the base Director's samples, train each arm under `out`, and measure it."""
    import time

    world = director_world(roster)
    base_training = sample_speakers(policy, None, world, world.training, samples_per_prompt, seed)
    base_shares = shares(base_training, roster)
    target = pick_target(base_shares, roster)
    check = DirectorCheck(target, base_shares, settings={
        "steps": policy.max_steps, "learning_rate": policy.learning_rate, "batch_size": policy.batch_size,
        "num_generations": policy.num_generations, "beta": policy.beta, "temperature": policy.temperature,
        "credit": policy.credit, "samples_per_prompt": samples_per_prompt,
        "training_prompts": len(world.training), "held_out_prompts": len(world.held_out), "seed": seed})
    base = sample_speakers(policy, None, world, world.held_out, samples_per_prompt, seed)
    before = [_share(base[p.id], target) for p in world.held_out]
    prompts = [{"prompt": p.messages, "prompt_id": p.id} for p in world.training]
    for arm in arms:
        runs, seconds, after = SHUFFLED_RUNS if arm == "shuffled" else 1, 0.0, []
        for run in range(runs):
            folder = out / arm / f"run{run}"
            reward = PlantedReward(roster, target, sign=-1.0 if arm == "flipped" else 1.0,
                                   shuffle_seed=seed + run if arm == "shuffled" else None)
            started = time.perf_counter()
            adapter = train_grpo_policy(policy.model_copy(update={"seed": policy.seed + run}), prompts, [reward],
                                        [1.0], folder / "adapter", folder / "checkpoints",
                                        name=f"known-optimum-director-{arm}", credit_until=credit_until(policy))
            seconds += time.perf_counter() - started
            assert adapter is not None  # one process: this one writes the adapter
            trained = sample_speakers(policy, adapter.path, world, world.held_out, samples_per_prompt, seed)
            after.append([_share(trained[p.id], target) for p in world.held_out])
        difference = (paired_difference(before, after[0], confidence, resamples, seed) if runs == 1 else
                      mean_over_runs([_mean(shares) - _mean(before) for shares in after], confidence))
        check.arms.append(ArmResult(arm, EXPECTED[arm], _mean(before), _mean([_mean(shares) for shares in after]),
                                    difference, seconds, runs))
    return check


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _share(named: list[str | None], target: str) -> float:
    return sum(speaker == target for speaker in named) / len(named)
