"""Check 2: the whole Stage 2 chain, against a planted group judge whose best Director is known.

The world: emotional-support contexts whose user message ends with a cue of one of three classes, each
fitting one persona: asking to be listened to fits the Anchor, asking what to do next the Catalyst,
sharing progress the Beacon (`CUES`). The cue class is in each context's metadata, for the judge only.
Held-out contexts carry the cues in situations and sentences that no training context has, so a chain
that learned its training states by heart gains nothing there; one that learned the cues does.

The chain is Stage 2's own, step for step (`mascot.stage2`): branched episodes from each context's
opening, the planted group judge (`mascot.judges.planted`) scores every trajectory, trajectory pairs,
the group reward model, the GRPO Director against it, and the held-out comparison of the base Director
and the trained one. Only the judge and the world are planted. The Director's choice is all the judge
looks at, so an episode is one block of one companion turn.

Three arms share the episodes and differ only in the judge:

- `planted`: the group reward model must reach `MIN_RM_ACCURACY` held-out pair accuracy; the trained
  Director's held-out share of directives naming the fitting persona must rise (interval above 0), its
  group-RM gain too, and its most named persona must differ between cue classes;
- `flipped`: the judge scores the opposite, so the fitting share must fall (interval below 0);
- `shuffled`: the judge scores by a coin, so the share must stay (interval containing 0).

Intervals are paired bootstrap intervals over held-out states (one per context).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from mascot.artifacts import Artifact
from mascot.config import (
    BackendConfig,
    DirectorConfig,
    DirectorEvalConfig,
    EpisodeConfig,
    JudgeConfig,
    RunConfig,
)
from mascot.data.context import Context, Message
from mascot.data.contexts import write_context_table
from mascot.judges.panel import PanelSpec
from mascot.known_optima import EXPECTED, moved_as_expected
from mascot.queries import context_ids
from mascot.roster import load_roster
from mascot.stage2.branching import CastSpec, Setting, generate_shard
from mascot.stage2.director import train_director
from mascot.stage2.director_eval import Directors, compare_directors, evaluate_directors
from mascot.stage2.trajectories import build_group_pairs, judge_trajectories
from mascot.stats import paired_difference
from mascot.train.reward_model import train_reward_model

# cue class -> (the persona that fits it, the phrases that carry the cue). A context's message is a situation, then a
# sentence that frames a phrase (`TRAINING_FRAMES` or `HELD_OUT_FRAMES`): held-out contexts have situations and
# sentences that no training context has, so a chain that learned its training states by heart gains nothing there.
# Their phrases are the training ones: held-out phrases that shared only the key word ("a person who will listen")
# were beyond the tiny group RM, which ranked 48-68% of such held-out pairs (2026-12-06, one tiny build).
CUES = {
    "listen": ("anchor", ["someone to just listen", "a friend to listen for a while", "you to listen to me"]),
    "next_step": ("catalyst", ["a next step to take", "some idea what to do next", "to work out what is next"]),
    "progress": ("beacon", ["a chance to say im proud of my progress", "a moment to share something im proud of",
                            "to say im proud of myself"]),
}
TRAINING_FRAMES = ["honestly i think i need {}.", "right now what i want is {}.", "can i ask for {}?"]
HELD_OUT_FRAMES = ["tbh all i am after is {}.", "i guess i would like {} today."]
# Situations are a person and an event; training and held-out contexts have different pairs of them. Many situations
# keep the group RM from telling the training states apart by their situation instead of by their cue.
PEOPLE = ["my sister", "my boss", "my best friend", "my dad", "my flatmate", "my teacher"]
EVENTS = ["called me last night", "has been distant lately", "said something that hurt", "got some bad news",
          "is moving away", "forgot my birthday"]
SITUATIONS = [f"{person} {event}." for event in EVENTS for person in PEOPLE]
TRAINING_SITUATIONS, HELD_OUT_SITUATIONS = SITUATIONS[::3] + SITUATIONS[1::3], SITUATIONS[2::3]
MIN_RM_ACCURACY = 0.9
ARMS = {"planted": None, "flipped": "flipped", "shuffled": "shuffled"}  # arm -> the judge's control
# The world's episode: from the opening, one block of one companion turn, six branches; nothing else plays.
EPISODES = EpisodeConfig(block_turns=1, prefix_blocks=0, states=1, mode="block", trajectory_blocks=1,
                         user_turns=False, branches=6, max_directive_attempts=1, contexts_per_shard=64)
# As check 1's (`director_grpo.CHECK_SETTINGS`): a step that shows within a CI budget what the profile's takes longer
# to show, and a firm KL anchor that keeps the shuffled control in place.
CHECK_SETTINGS = {"learning_rate": 3e-3, "beta": 0.1, "batch_size": 16, "num_generations": 4, "rollouts": 1}
# The Director learns from the group RM alone. The format reward is not what this check is about, and it moves the
# choice in every arm: with its profile weight (0.5) the fitting share rose by +0.06 to +0.09 under the planted, the
# flipped and the shuffled judge alike (30 steps, 2026-12-06, the build before docs/models.md's tokenizer), and by +0.000
# under the last two without it.
CHECK_REWARD_WEIGHTS = {"group_rm": 1.0, "format": 0.0}
# The group RM must learn an interaction (which persona, after which cue) from a few hundred pairs, and whether it
# finds it depends on its seed at a large step. Held-out pair accuracy over training seeds 0, 1 and 2 (2026-12-06, the
# tiny build of docs/models.md, 686 pairs): at 3e-3 x 3 epochs 93%, 100%, 82% under the planted judge and 45%, 76%,
# 38% under the flipped one; at 1e-3 x 6 epochs 97%, 91%, 98% and 95%, 91%, 98%. (At 1e-4 x 10 epochs it stayed at
# chance, 48%, on the build before.)
CHECK_RM_SETTINGS = {"learning_rate": 1e-3, "epochs": 6}
# The judge reads who speaks, not what: a short reply keeps the rollouts cheap, and gives the group RM less noise to
# learn by heart (12 tokens left it at chance on held-out pairs).
SPEAKER_TOKENS = 4


def cue_contexts() -> tuple[list[Context], set[str]]:
    """The world's contexts, and the ids of the held-out ones: every situation once per cue class."""
    contexts, held_out = [], set()
    for cue, (_, phrases) in CUES.items():
        for split, situations, frames in (("train", TRAINING_SITUATIONS, TRAINING_FRAMES),
                                          ("test", HELD_OUT_SITUATIONS, HELD_OUT_FRAMES)):
            for index, situation in enumerate(situations):
                message = f"{situation} {frames[index % len(frames)].format(phrases[index % len(phrases)])}"
                contexts.append(_context(f"cue-{cue}-{split}-{index}", split, message, cue))
                if split == "test":
                    held_out.add(contexts[-1].id)
    return contexts, held_out


def _context(context_id: str, split: str, message: str, cue: str) -> Context:
    return Context(id=context_id, domain="emotional_support", source="known_optimum", split=split,
                   history=[Message(role="user", content=message)], metadata={"cue": cue})


def preferred() -> dict[str, str]:
    return {cue: persona for cue, (persona, _) in CUES.items()}


@dataclass
class ChainArm:
    arm: str
    expected: str
    rm_accuracy: float
    fit_before: float
    fit_after: float
    fit_difference: dict  # paired over held-out states
    group_rm_difference: dict  # the Stage 2 report's Director gain: metrics.json scores.group_rm.difference
    choices: dict[str, dict[str, float]]  # cue class -> persona -> the trained Director's share of held-out samples
    base_choices: dict[str, dict[str, float]]  # the same for the base Director
    # policy ("base", "director") -> its share of valid held-out directives, and the fitting share among them: the
    # Director's own choice, apart from the fallback's random persona, which the fitting share above also counts
    validity: dict[str, float]
    valid_fit: dict[str, float | None]
    seconds: float = 0.0

    @property
    def moved(self) -> bool:
        return moved_as_expected(self.fit_difference, self.expected)

    @property
    def choice_depends_on_cue(self) -> bool:
        modes = {max(shares, key=shares.get) for shares in self.choices.values() if shares}
        return len(modes) > 1

    @property
    def passed(self) -> bool:
        if self.expected != "rise":
            return self.moved
        return (self.moved and self.rm_accuracy >= MIN_RM_ACCURACY and self.group_rm_difference["ci_low"] > 0
                and self.choice_depends_on_cue)


@dataclass
class ChainCheck:
    arms: list[ChainArm] = field(default_factory=list)
    settings: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(arm.passed for arm in self.arms)

    def lines(self) -> list[str]:
        out = [f"check 2, the whole Stage 2 chain: cues {', '.join(f'{c}->{p}' for c, p in preferred().items())}"]
        for arm in self.arms:
            d, g = arm.fit_difference, arm.group_rm_difference
            out.append(f"  {arm.arm:<9} group RM held-out accuracy {arm.rm_accuracy:.2f}; fitting share "
                       f"{arm.fit_before:.3f} -> {arm.fit_after:.3f}: {d['mean']:+.3f} [{d['ci_low']:+.3f}, "
                       f"{d['ci_high']:+.3f}] over {d['n']} held-out states; group RM gain {g['mean']:+.3f} "
                       f"[{g['ci_low']:+.3f}, {g['ci_high']:+.3f}]; expected to {arm.expected}: "
                       f"{'pass' if arm.passed else 'FAIL'} ({arm.seconds:.0f} s)")
            out.append(f"            valid directives {arm.validity['base']:.2f} -> {arm.validity['director']:.2f}, "
                       f"fitting among them {_rate(arm.valid_fit['base'])} -> {_rate(arm.valid_fit['director'])}")
            out.append(f"            choices by cue, base: {_choices(arm.base_choices)}; trained: {_choices(arm.choices)}")
        return out


def _rate(share: float | None) -> str:
    return "none valid" if share is None else f"{share:.3f}"


def _choices(choices: dict[str, dict[str, float]]) -> str:
    return "; ".join(f"{cue}: " + " ".join(f"{p} {s:.2f}" for p, s in shares.items()) for cue, shares in choices.items())


def run_chain_check(profile: RunConfig, director: DirectorConfig, out: Path, *, samples_per_prompt: int = 8,
                    arms: tuple[str, ...] = tuple(ARMS), seed: int = 0) -> ChainCheck:
    """Play the world's episodes once, then run each arm's judge, pairs, group RM, Director and evaluation under
    `out`. `profile` (its `tiny:` models resolved, `resolve_tiny_models`) gives the roster, the base Director, the
    group rubric and the group RM's settings; `director` the GRPO Director's (`check_director`)."""
    assert profile.stage2 is not None
    contexts_list, held_out = cue_contexts()
    contexts = write_context_table(contexts_list, held_out, out / "contexts.parquet")
    stage2 = profile.stage2.model_copy(update={"episodes": EPISODES})
    speaker = BackendConfig(kind="transformers", model=director.model, device=stage2.director.device,
                            params=stage2.director.params.model_copy(update={"max_new_tokens": SPEAKER_TOKENS}))
    cast = CastSpec(roster=load_roster(profile.data.roster), director=stage2.director, speaker=speaker,
                    user=stage2.user, max_directive_attempts=EPISODES.max_directive_attempts, profiles=[])
    setting = Setting(cast=cast, episodes=EPISODES, seed=seed, contexts=contexts,
                      requests=out / "requests.sqlite")
    episodes = generate_shard(setting, [c.id for c in contexts_list], out / "episodes.parquet")
    evaluation = DirectorEvalConfig(samples_per_prompt=samples_per_prompt, rollouts=1)
    check = ChainCheck(settings={"steps": director.max_steps, "learning_rate": director.learning_rate,
                                 "batch_size": director.batch_size, "num_generations": director.num_generations,
                                 "beta": director.beta, "temperature": director.temperature, "credit": director.credit,
                                 "training_contexts": len(contexts_list) - len(held_out),
                                 "held_out_contexts": len(held_out), "branches": EPISODES.branches,
                                 "samples_per_prompt": samples_per_prompt, "seed": seed})
    for arm in arms:
        started, folder = time.perf_counter(), out / arm
        judge = JudgeConfig(kind="planted", name=f"planted-{arm}", prefer=preferred(), control=ARMS[arm])
        panel = PanelSpec.load([judge], stage2.rubric, level="block")
        judgments = judge_trajectories(panel, setting, episodes, folder / "judgments.parquet")
        pairs = build_group_pairs(stage2, cast.roster, episodes, contexts, judgments, folder / "pairs.parquet")
        group_rm = train_reward_model(profile.train.group_rm.model_copy(update=CHECK_RM_SETTINGS), pairs, contexts, folder / "group_rm",
                                      group_by="persona", name="group_rm")
        adapter = train_director(director, setting, episodes, group_rm, folder / "director")
        assert group_rm is not None and adapter is not None  # one process: this one writes them
        scored = evaluate_directors(evaluation, Directors(policy=director, adapter=adapter,
                                                          weights=director.reward_weights),
                                    setting, episodes, group_rm, folder / "director_eval-scored.parquet")
        compared = compare_directors(evaluation, seed, scored, contexts, folder / "director_eval")
        check.arms.append(_measure(arm, group_rm, compared, contexts_list, evaluation, seed,
                                   time.perf_counter() - started))
    return check


def check_director(profile: RunConfig, steps: int, seed: int = 0) -> DirectorConfig:
    """The profile's Director settings (`train.director`) for this check: `CHECK_SETTINGS`, `CHECK_REWARD_WEIGHTS`
    and `steps` steps."""
    director = profile.train.director
    return director.model_copy(update={
        **CHECK_SETTINGS, "max_steps": steps, "save_steps": steps, "seed": seed,
        "reward_weights": director.reward_weights.model_copy(update=CHECK_REWARD_WEIGHTS)})


def _measure(arm: str, group_rm: Artifact, compared: Artifact, contexts: list[Context],
             evaluation: DirectorEvalConfig, seed: int, seconds: float) -> ChainArm:
    cue_of = {c.id: c.metadata["cue"] for c in contexts}
    fitting = preferred()
    samples = pl.read_parquet(compared.path / "samples.parquet").with_columns(
        cue=context_ids(pl.col("state_id")).replace_strict(cue_of))
    samples = samples.with_columns(fits=pl.col("next_speaker") == pl.col("cue").replace_strict(fitting))
    per_state = samples.group_by("state_id", "policy").agg(pl.col("fits").mean()).pivot(
        on="policy", index="state_id", values="fits").sort("state_id")
    before, after = per_state["base"].to_list(), per_state["director"].to_list()
    choices = {policy: {cue: {persona: count / rows.height for persona, count in sorted(Counter(rows["next_speaker"]).items())}
                        for (cue,), rows in sorted(samples.filter(pl.col("policy") == policy).group_by("cue"),
                                                   key=lambda item: item[0])}
               for policy in ("base", "director")}
    by_policy = samples.group_by("policy").agg(pl.col("valid").mean(), pl.col("fits").filter(pl.col("valid")).mean())
    validity = dict(zip(by_policy["policy"], by_policy["valid"], strict=True))
    valid_fit = dict(zip(by_policy["policy"], by_policy["fits"], strict=True))
    metrics = json.loads((compared.path / "metrics.json").read_text())
    rm = json.loads((group_rm.path / "metrics.json").read_text())
    return ChainArm(arm, EXPECTED[arm], rm["held_out"]["accuracy"]["value"], sum(before) / len(before),
                    sum(after) / len(after), paired_difference(before, after, evaluation.confidence,
                                                               evaluation.bootstrap_resamples, seed),
                    metrics["scores"]["group_rm"]["difference"], choices["director"], choices["base"], validity,
                    valid_fit, seconds)
