"""Check 3: the persona reward model and the GRPO Speaker, against a planted persona judge whose optimum is known.

The planted judge (`PlantedPersonaJudge`) scores a reply for a persona by the persona's own vocabulary: the
number of distinct entries of its roster `lexicon` the reply uses, minus the number of the other personas'
entries it uses. The best reply for a persona is in its own words and in no other persona's. The vocabularies
are the roster's lexicons rather than words planted for the check: the emotional-support lexicons are disjoint
(`disjoint_lexicons` refuses a roster whose are not), and the tiny LM was warm-started on text that contains
them, so sampling reaches each persona's words at a base rate GRPO can build on (0.1 to 0.3 entries per 6-token reply),
where a list of words the model never writes would give GRPO no group with a reward to compare.

The world is Stage 1's, built by Stage 1's own steps: the profile's contexts (`write_contexts`, its held-out
split), `WORLD_K` short candidates per (context, persona) query sampled by the tiny LM under the persona's speaker
prompt (`sample_shard`), judged by the planted judge, the pairs of largest margin (`build_pairs`), and the persona
reward model trained on the training contexts' pairs (`train_reward_model`). The check then asks, on held-out contexts:

- the reward model's held-out pair accuracy is at least `MIN_PAIR_ACCURACY`;
- persona swap: a held-out reply the planted judge places in its own persona's voice (more of its own entries
  than of the other persona's) scores higher under its own persona's prompt than under the other's in at least
  `MIN_SWAP_ACCURACY` of the comparisons (`mascot.stage1.persona_swap`, the Stage 1 report's test), with its
  Wilson interval; beside both, what linear readers of the same pairs reach (`linear_reference`), which tells
  pairs that cannot teach the judge from a reward model that cannot learn it;
- the Speaker's GRPO (`train_grpo_policy` on Stage 1's Speaker prompts, rewarded by the persona reward model):
  the persona x vocabulary table of the held-out replies (mean entries of each persona's vocabulary per reply,
  under each persona's prompt) moves towards its diagonal. The measure is the diagonal minus the off-diagonal,
  per held-out context (each persona's own-entry rate minus its rate of the others' entries, averaged over the
  context's persona prompts, which share its text and are not independent), before and after training, with
  a paired bootstrap interval over the held-out contexts. Three arms, as in check 1: `planted` must rise (the
  interval above 0), `flipped` (the reward model's score times -1) must fall, `shuffled` (the scores permuted
  across the completions of each batch) must stay (the interval containing 0).
"""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import polars as pl

from mascot.artifacts import Artifact, write_parquet
from mascot.config import BackendConfig, DataConfig, GRPOPolicyConfig, RewardModelConfig, Stage1Config
from mascot.data.contexts import held_out_ids, write_contexts
from mascot.judges.base import JudgeItem, Judgment
from mascot.judges.panel import JudgePanel, judgments_frame
from mascot.known_optima import EXPECTED, moved_as_expected
from mascot.known_optima.linear_reference import Pair, linear_reference
from mascot.llm import make_backend, run_requests
from mascot.queries import Queries, Query, context_ids
from mascot.roster import Persona, Roster
from mascot.rubrics import Criterion, Rubric
from mascot.stage1.candidates import sample_candidates, sample_shard
from mascot.stage1.pairs import build_pairs
from mascot.stage1.persona_swap import held_out_persona_swap, persona_swap_accuracy, swap_comparisons
from mascot.stage1.speaker import speaker_prompts
from mascot.stats import paired_difference
from mascot.train.grpo import policy_backend, train_grpo_policy
from mascot.train.reward_model import RewardModelScorer, train_reward_model

MIN_PAIR_ACCURACY, MIN_SWAP_ACCURACY = 0.9, 0.8
# The world's replies are short and many, and each query keeps its pairs of largest margin. The judge reads a few
# words, and each other token of a reply is noise that a reward model can learn by heart: on 40-token replies (K=8,
# all pairs) the tiny reward model stayed at chance on held-out pairs, and a linear reader of every token reached 90%.
# On 6-token replies, K=96 and 24 pairs per query it ranks 94-97% of them (docs/stage1.md). Sampling them is cheap
# (seconds), and the cap keeps the pairs, and so the reward model's training, as few as K=8 gave.
REPLY_TOKENS, WORLD_K, PAIRS_PER_QUERY = 6, 96, 24
# The profile's Speaker settings but for these, as check 1 sets the Director's: a larger step than the profile's
# 5e-4, and a firmer KL anchor than its 0.04, which keeps the shuffled control in place. A persona's words are a
# choice conditioned on the prompt, which LoRA on the attention alone learned too slowly (docs/stage1.md): LoRA on
# every linear layer, and 8 completions per prompt (32 per step), so that a group holds a reply in the persona's
# words more often, against the reward model's spread within the judge's classes.
CHECK_SETTINGS = {"learning_rate": 3e-3, "beta": 0.1, "batch_size": 32, "num_generations": 8}
LORA_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ARMS = ("planted", "flipped", "shuffled")
CRITERION = "persona_vocabulary"
PLANTED_RUBRIC = Rubric(
    domain="emotional_support", name="Planted persona vocabulary", scale_min=0, scale_max=1,
    criteria=[Criterion(id=CRITERION, name="Persona vocabulary",
                        description="Distinct entries of the persona's lexicon used, minus the other personas'.",
                        anchors={0: "None of the persona's own words.", 1: "The persona's own words."})])


@cache
def _entry_pattern(entry: str) -> re.Pattern:
    return re.compile(rf"(?<![a-z0-9']){re.escape(entry.lower())}(?![a-z0-9'])")


def lexicon_hits(text: str, lexicon: list[str]) -> int:
    """How many distinct entries of `lexicon` the text uses, as whole words, ignoring case."""
    lower = text.lower()
    return sum(1 for entry in lexicon if _entry_pattern(entry).search(lower))


def disjoint_lexicons(roster: Roster) -> list[Persona]:
    """The roster's active personas, each with a lexicon, no entry shared between two of them."""
    personas = roster.active
    seen: dict[str, str] = {}
    for persona in personas:
        if not persona.lexicon:
            raise ValueError(f"persona '{persona.id}' has no lexicon: the planted judge rewards a persona's lexicon")
        for entry in persona.lexicon:
            key = entry.lower()
            if seen.setdefault(key, persona.id) != persona.id:
                raise ValueError(f"lexicon entry {entry!r} belongs to both '{seen[key]}' and '{persona.id}': the "
                                 "planted judge needs disjoint vocabularies")
    return personas


class PlantedPersonaJudge:
    """A judge (`mascot.judges.base.Judge`) that knows the optimum: a reply's own-lexicon entries minus the other
    personas' entries. It scores `PLANTED_RUBRIC`'s one criterion, so Stage 1's panel tables hold it."""

    name = "planted_persona"

    def __init__(self, roster: Roster):
        self.personas = disjoint_lexicons(roster)

    def score(self, text: str, persona: str) -> float:
        own = [p for p in self.personas if p.id == persona]
        if not own:
            raise ValueError(f"persona '{persona}' is not an active persona of the roster")
        others = sum(lexicon_hits(text, p.lexicon) for p in self.personas if p.id != persona)
        return float(lexicon_hits(text, own[0].lexicon) - others)

    async def judge(self, item: JudgeItem, seed: int) -> Judgment:
        score = self.score(item.candidate, item.persona.id)
        return Judgment.succeeded(item, self.name, {CRITERION: score}, f"own minus others' lexicon entries: {score:g}")


@dataclass(frozen=True)
class SpeakerWorld:
    """Stage 1's artifacts, built by its own steps with the planted judge."""

    roster: Roster
    queries: Queries
    contexts: Artifact
    candidates: Artifact
    judgments: Artifact
    pairs: Artifact


def build_speaker_world(data: DataConfig, stage1: Stage1Config, generation: BackendConfig, roster: Roster,
                        out: Path, seed: int = 0) -> SpeakerWorld:
    """contexts -> `WORLD_K` candidates of `REPLY_TOKENS` per query (the tiny LM under each persona's prompt) ->
    planted judgments -> `PAIRS_PER_QUERY` pairs per query, each written under `out` as Stage 1 writes it."""
    generation = generation.model_copy(update={"params": generation.params.model_copy(
        update={"max_new_tokens": REPLY_TOKENS})})
    stage1 = stage1.model_copy(update={"k": WORLD_K, "max_pairs_per_query": PAIRS_PER_QUERY})
    contexts = write_contexts(data, seed, out / "contexts.parquet")
    queries = Queries(contexts=contexts, roster=roster)
    candidates = sample_shard(generation, stage1.k, seed, queries, out / "requests.sqlite", out / "candidates.parquet")
    by_id = {q.id: q for q in queries.load()}
    items = [JudgeItem(query_id=row["query_id"], candidate_idx=row["candidate_idx"],
                       context=by_id[row["query_id"]].context, persona=by_id[row["query_id"]].persona,
                       candidate=row["text"]) for row in candidates.read_parquet().iter_rows(named=True)]
    judged = run_requests(JudgePanel([PlantedPersonaJudge(roster)]).judge_all(items, seed))
    judgments = write_parquet(judgments_frame(judged, PLANTED_RUBRIC), out / "judgments.parquet")
    pairs = build_pairs(stage1, queries, candidates, judgments, out / "pairs.parquet")
    return SpeakerWorld(roster, queries, contexts, candidates, judgments, pairs)


def train_persona_rm(config: RewardModelConfig, world: SpeakerWorld, out: Path) -> Artifact:
    """The persona reward model on the world's pairs, as Stage 1 trains it, with the report's swap test."""
    trained = train_reward_model(config, world.pairs, world.contexts, out, group_by="persona", name="persona_rm",
                                 held_out_measures={"persona_swap": held_out_persona_swap})
    assert trained is not None  # one process: this one writes the model
    return trained


def planted_swap_comparisons(world: SpeakerWorld) -> list[dict[str, Any]]:
    """The swap test's comparisons whose answer the planted judge knows: every held-out candidate against each
    other persona's prompt of its context, where it uses more of its own persona's entries than of the other's."""
    held_out = world.queries.held_out()
    queries = held_out.load()
    prompts = {p["query_id"]: p["prompt"] for p in speaker_prompts(held_out)}
    replies = world.candidates.read_parquet().filter(pl.col("query_id").is_in([q.id for q in queries]))
    lexicon = {p.id: p.lexicon for p in world.roster.active}
    return [c for c in swap_comparisons(replies, prompts)
            if lexicon_hits(c["text"], lexicon[c["persona"]]) > lexicon_hits(c["text"], lexicon[c["other"]])]


class ArmReward:
    """A reward function of TRL's form, with the arm's control: `sign` times the reward model's score; with
    `shuffle_seed` the batch's rewards are permuted across its completions."""

    def __init__(self, reward: Any, sign: float = 1.0, shuffle_seed: int | None = None):
        self.reward, self.sign = reward, sign
        self.shuffle = random.Random(shuffle_seed) if shuffle_seed is not None else None
        self.__name__ = reward.__name__  # TRL logs a reward function under its name

    def __call__(self, prompts: list, completions: list, **kwargs: Any) -> list[float]:
        rewards = [self.sign * value for value in self.reward(prompts, completions, **kwargs)]
        if self.shuffle is not None:
            self.shuffle.shuffle(rewards)
        return rewards


def vocabulary_use(policy: GRPOPolicyConfig, adapter: Path | None, queries: list[Query], samples_per_prompt: int,
                   seed: int) -> dict[str, dict[str, float]]:
    """Per held-out query, the mean entries of each persona's vocabulary in `samples_per_prompt` replies, sampled
    as GRPO's rollouts are; the seeds depend on the query only, so every policy meets the same ones."""
    config = policy_backend(policy, adapter)
    sampled = run_requests(sample_candidates(make_backend(config), queries, samples_per_prompt, config.params, seed))
    lexicons = {q.persona.id: q.persona.lexicon for q in queries}
    return {s.query.id: {persona: sum(lexicon_hits(t, lexicon) for t in s.texts) / len(s.texts)
                         for persona, lexicon in lexicons.items()} for s in sampled}


def diagonal_minus_off_diagonal(use: dict[str, dict[str, float]]) -> dict[str, float]:
    """Per context: each persona prompt's own-vocabulary rate minus its mean rate of the other vocabularies,
    averaged over the context's persona prompts."""
    per_context: dict[str, list[float]] = {}
    for query_id, rates in sorted(use.items()):
        context_id, persona = Query.split_id(query_id)
        others = [rate for vocabulary, rate in rates.items() if vocabulary != persona]
        per_context.setdefault(context_id, []).append(rates[persona] - sum(others) / len(others))
    return {context_id: sum(values) / len(values) for context_id, values in per_context.items()}


def vocabulary_table(use: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Persona (the prompt's) x vocabulary: mean entries per reply, over the held-out prompts."""
    table: dict[str, dict[str, list[float]]] = {}
    for query_id, rates in use.items():
        _, persona = Query.split_id(query_id)
        for vocabulary, rate in rates.items():
            table.setdefault(persona, {}).setdefault(vocabulary, []).append(rate)
    return {persona: {v: sum(r) / len(r) for v, r in row.items()} for persona, row in table.items()}


@dataclass
class ArmResult:
    arm: str
    expected: str  # "rise", "fall" or "stay"
    base: float  # diagonal minus off-diagonal, mean over held-out contexts
    trained: float
    difference: dict  # mascot.stats.paired_difference over held-out contexts
    table: dict[str, dict[str, float]]  # the trained policy's persona x vocabulary table
    train_seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return moved_as_expected(self.difference, self.expected)


@dataclass
class PersonaRMCheck:
    """The persona reward model trained on the world's pairs, and what it must show before it rewards a Speaker."""

    model: Path
    pairs: dict  # counts of the world's pairs: training and held out
    pair_accuracy: dict  # held-out pair accuracy (mascot.stats.proportion)
    swap: dict  # persona_swap_accuracy on the held-out comparisons the planted judge decides
    report_swap: dict  # the Stage 1 report's swap test, on the held-out pairs' chosen replies
    references: dict[int | None, float] = field(default_factory=dict)  # width (None: the tokens) -> `linear_reference`

    @property
    def pair_accuracy_passed(self) -> bool:
        return (self.pair_accuracy["value"] or 0) >= MIN_PAIR_ACCURACY

    @property
    def swap_passed(self) -> bool:
        return (self.swap["accuracy"]["value"] or 0) >= MIN_SWAP_ACCURACY

    @property
    def passed(self) -> bool:
        return self.pair_accuracy_passed and self.swap_passed

    def lines(self) -> list[str]:
        swap = self.swap["accuracy"]
        return [f"check 3, persona RM: {self.pairs['train']} training pairs, {self.pairs['held_out']} held out",
                (f"  held-out pair accuracy {_share(self.pair_accuracy)}; at least {MIN_PAIR_ACCURACY:.0%}: "
                 f"{'pass' if self.pair_accuracy_passed else 'FAIL'}"),
                (f"  persona swap, held-out replies in their persona's words {_share(swap)} over "
                 f"{self.swap['replies']} replies; at least {MIN_SWAP_ACCURACY:.0%}: "
                 f"{'pass' if self.swap_passed else 'FAIL'}"),
                (f"  persona swap as the Stage 1 report measures it (held-out chosen replies): "
                 f"{_share(self.report_swap['accuracy'])}"),
                *self._reference_lines()]

    def _reference_lines(self) -> list[str]:
        if not self.references:
            return []
        readers = "; ".join(f"{'from the tokens' if width is None else f'through a random {width}-dim code'} "
                            f"{value:.1%}" for width, value in self.references.items())
        return [(f"  linear reference, not the reward model: a linear score on the replies' tokens x persona ranks "
                 f"held-out pairs {readers}")]


@dataclass
class SpeakerCheck:
    base_table: dict[str, dict[str, float]]  # the base Speaker's persona x vocabulary table
    arms: list[ArmResult] = field(default_factory=list)
    settings: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(arm.passed for arm in self.arms)

    def lines(self) -> list[str]:
        out = [(f"check 3, Speaker GRPO on the persona RM; base persona x vocabulary (entries per reply): "
               f"{_table(self.base_table)}")]
        for arm in self.arms:
            d = arm.difference
            out.append(f"  {arm.arm:<9} diagonal - off-diagonal {arm.base:+.3f} -> {arm.trained:+.3f}: "
                       f"{d['mean']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] over {d['n']} held-out contexts; "
                       f"expected to {arm.expected}: {'pass' if arm.passed else 'FAIL'} ({arm.train_seconds:.0f} s); "
                       f"trained table {_table(arm.table)}")
        return out


def _share(share: dict) -> str:
    if not share["n"]:
        return "n/a (n=0)"
    return f"{share['value']:.1%} [{share['ci_low']:.1%}, {share['ci_high']:.1%}] (n={share['n']})"


def _table(table: dict[str, dict[str, float]]) -> str:
    return "; ".join(f"{persona}: " + " ".join(f"{v} {rate:.2f}" for v, rate in row.items())
                     for persona, row in table.items())


def check_reward_model(persona_rm: RewardModelConfig, model: str | Path, **overrides: Any) -> RewardModelConfig:
    """A profile's persona reward model settings (`train.persona_rm`) on `model` (a resolved folder), with
    `overrides` (fewer epochs for a test, say); no checkpoint is kept."""
    return persona_rm.model_copy(update={"model": str(model), "save_steps": 10_000, **overrides})


def check_speaker(speaker: GRPOPolicyConfig, model: str | Path, steps: int, seed: int = 0) -> GRPOPolicyConfig:
    """A profile's Speaker settings (`train.speaker`) for this check: `CHECK_SETTINGS`, `LORA_MODULES`, `steps` steps
    of GRPO on `model` (a resolved folder) with replies as long as the world's, no checkpoint before the last step."""
    return speaker.model_copy(update={**CHECK_SETTINGS, "model": str(model), "max_steps": steps,
                                      "lora": speaker.lora.model_copy(update={"target_modules": LORA_MODULES}),
                                      "max_completion_length": REPLY_TOKENS, "save_steps": steps, "seed": seed})


def check_persona_rm(world: SpeakerWorld, config: RewardModelConfig, out: Path,
                     confidence: float = 0.95) -> PersonaRMCheck:
    """Train the persona reward model on the world's pairs (to `out`), and measure its pair and swap accuracy."""
    import json

    trained = train_persona_rm(config, world, out)
    metrics = json.loads((trained.path / "metrics.json").read_text())
    scorer = RewardModelScorer(trained.path, name="persona_rm", chat_template_kwargs=config.chat_template_kwargs)
    return PersonaRMCheck(trained.path, {"train": metrics["training"]["train_pairs"],
                                         "held_out": metrics["training"]["held_out_pairs"]},
                          metrics["held_out"]["accuracy"],
                          persona_swap_accuracy(scorer, planted_swap_comparisons(world), confidence),
                          metrics["held_out"]["persona_swap"], linear_references(world, config.model))


def linear_references(world: SpeakerWorld, model: str | Path) -> dict[int | None, float]:
    """`linear_reference` on the world's pairs with `model`'s tokenizer: from the tokens, and through a random code
    as wide as the model's hidden state, which is where the reward model reads its score."""
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    pairs = world.pairs.read_parquet()  # split as train_reward_model splits them
    pairs = pairs.with_columns(held_out=context_ids(pairs["query_id"]).is_in(held_out_ids(world.contexts)))
    split = {flag: [Pair(*row) for row in pairs.filter(pl.col("held_out") == flag).select(
        "persona", "chosen", "rejected").iter_rows()] for flag in (False, True)}

    @cache  # a reply is in many pairs, and each width reads every pair
    def tokenize(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    return {width: linear_reference(split[False], split[True], tokenize, len(tokenizer), width)
            for width in (None, AutoConfig.from_pretrained(model).hidden_size)}


def run_speaker_check(world: SpeakerWorld, persona_rm: PersonaRMCheck, policy: GRPOPolicyConfig, out: Path, *,
                      samples_per_prompt: int = 8, seed: int = 0, arms: tuple[str, ...] = ARMS,
                      confidence: float = 0.95, resamples: int = 2000,
                      chat_template_kwargs: dict[str, Any] | None = None) -> SpeakerCheck:
    """Train each Speaker arm on the world's training prompts, rewarded by the persona reward model, and measure
    it against the base Speaker on the held-out prompts."""
    scorer = RewardModelScorer(persona_rm.model, name="persona_rm", chat_template_kwargs=chat_template_kwargs)
    held_out = world.queries.held_out().load()
    base = vocabulary_use(policy, None, held_out, samples_per_prompt, seed)
    check = SpeakerCheck(vocabulary_table(base), settings={
        "steps": policy.max_steps, "learning_rate": policy.learning_rate, "batch_size": policy.batch_size,
        "num_generations": policy.num_generations, "beta": policy.beta, "samples_per_prompt": samples_per_prompt,
        "lora_modules": policy.lora.target_modules, "held_out_prompts": len(held_out), "seed": seed})
    prompts = speaker_prompts(world.queries.held_out(False))
    before = diagonal_minus_off_diagonal(base)
    contexts = sorted(before)
    for arm in arms:
        reward = ArmReward(scorer, sign=-1.0 if arm == "flipped" else 1.0,
                           shuffle_seed=seed if arm == "shuffled" else None)
        started = time.perf_counter()
        adapter = train_grpo_policy(policy, prompts, [reward], [1.0], out / arm / "adapter", out / arm / "checkpoints",
                                    name=f"known-optimum-speaker-{arm}")
        seconds = time.perf_counter() - started
        assert adapter is not None  # one process: this one writes the adapter
        trained = vocabulary_use(policy, adapter.path, held_out, samples_per_prompt, seed)
        after = diagonal_minus_off_diagonal(trained)
        b, a = [before[c] for c in contexts], [after[c] for c in contexts]
        check.arms.append(ArmResult(arm, EXPECTED[arm], sum(b) / len(b), sum(a) / len(a),
                                    paired_difference(b, a, confidence, resamples, seed), vocabulary_table(trained),
                                    seconds))
    return check
