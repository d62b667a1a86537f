"""The systems under test: MASCOT, seven baselines and two ablations, each as a value that says how it answers.

Every system answers the same held-out conversations with the same seeds, through the same backends
and request cache. A *group* system answers each block with `block_turns` companion turns, a persona
of the roster chosen for each turn; a *single-assistant* system answers with one reply of a generic
assistant (a one-persona roster, `eval.assistant`). The simulated user is the same for all.

Budgets are matched: every system may write the same number of companion tokens per block
(`eval.block_tokens`). A group's turns share it equally, and a single assistant's one reply may use
all of it, since LLM judges favour longer answers and a group would otherwise write `block_turns`
times as much (`turn_tokens` gives each turn's cap; the report states them, `SystemSetup.budget`).

| system | speaker | who speaks next | prompt |
|---|---|---|---|
| mascot | trained Speaker | trained Director (GRPO, the paper's method) | the persona's own |
| mascot_dpo | trained Speaker | trained Director (DPO), where Stage 2 trained one | the persona's own |
| multi_agent | base Speaker | base (prompted, untrained) Director | the persona's own |
| mascot_p | trained Speaker | trained Director | no persona-specific text (name only) |
| mascot_c | trained Speaker | a random persona, seeded by the request; the trained Director's instruction | the persona's own |
| mascot_c_generic | trained Speaker | a random persona, with the generic instruction (no Director) | the persona's own |
| zero_shot, zero_shot_cot | base Speaker | the assistant | the assistant's (CoT: reasoning, then the reply) |
| few_shot, few_shot_cot | base Speaker | the assistant | the assistant's, after examples from training contexts |
| sft | base Speaker fine-tuned on the best-judged Stage 1 candidates | the assistant | the assistant's |
| self_consistency | base Speaker | the assistant | the assistant's; `samples` replies, the most typical kept |

MASCOT-C ablates the choice of speaker only: `RandomSpeaker` asks the trained Director for its directive and
replaces the persona it names with a random one, keeping its instruction and tone. MASCOT-C with the generic
instruction, the older ablation, also drops the instruction, so it mixes two ablations; it is played where listed.
A random or single speaker needs no Director model: `ScriptedDirector` answers the Director's request
with a valid directive chosen by the request's seed, so the episode code runs unchanged.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from pydantic import BaseModel, ConfigDict

from mascot.config import BackendConfig, SamplingParams
from mascot.config.evaluation import SystemName
from mascot.data.context import Context
from mascot.data.qmsum import meeting_query
from mascot.dialogue.directives import FALLBACK_INSTRUCTION, active_personas, parse_directive
from mascot.dialogue.episodes import Cast
from mascot.llm import RequestCache, make_backend
from mascot.llm.structured import ReplyError
from mascot.prompts import context_messages, render, speaker_messages
from mascot.queries import request_seed
from mascot.roster import Persona, Roster, UserProfile

REPLY_MARKER = "Reply:"  # a CoT system's reply follows the last one; what comes before is its reasoning


@dataclass(frozen=True)
class SystemSpec:
    label: str
    group: bool
    description: str


SYSTEMS: dict[str, SystemSpec] = {
    "mascot": SystemSpec("MASCOT", True, "the trained Speaker and the Director trained with GRPO, the paper's method"),
    "mascot_dpo": SystemSpec("MASCOT (DPO Director)", True, "the trained Speaker and the Director trained with DPO, "
                             "not the paper's method"),
    "multi_agent": SystemSpec("Multi-agent (untrained)", True, "the same roster with the base Speaker and the base, "
                              "prompted Director, in the manner of MultiAgentESC"),
    "mascot_p": SystemSpec("MASCOT-P", True, "MASCOT without persona-specific prompting"),
    "mascot_c": SystemSpec("MASCOT-C", True, "MASCOT with a random speaking order: the trained Director's "
                           "instruction and tone kept, the persona it names replaced by a random one"),
    "mascot_c_generic": SystemSpec("MASCOT-C (generic instruction)", True, "MASCOT without its Director: a random "
                                   "persona with the generic instruction, which ablates the instruction as well as "
                                   "the order"),
    "zero_shot": SystemSpec("Zero-Shot", False, "one generic assistant, no personas"),
    "zero_shot_cot": SystemSpec("Zero-Shot CoT", False, "the assistant reasons step by step, then replies"),
    "few_shot": SystemSpec("Few-Shot", False, "the assistant after examples from training contexts"),
    "few_shot_cot": SystemSpec("Few-Shot CoT", False, "few-shot examples, reasoning, then the reply"),
    "sft": SystemSpec("SFT (best-of-K distillation)", False, "best-of-K distillation: the base Speaker fine-tuned "
                      "(LoRA, TRL's SFTTrainer) on the best-judged of Stage 1's K candidates for each training "
                      "context, answering as the assistant; it learns from the judges' choice, as MASCOT's reward "
                      "models do"),
    "self_consistency": SystemSpec("Self-Consistency (best of N samples)", False, "N replies sampled per turn "
                                   "(eval.self_consistency_samples), the most typical one kept: N times the Speaker's "
                                   "compute of one reply"),
}


class FewShotExample(BaseModel):
    """A training context's last message and a good reply to it (its best-judged Stage 1 candidate)."""

    model_config = ConfigDict(frozen=True)

    context_id: str
    message: str
    reply: str


class SystemSetup(BaseModel):
    """One system under test as a value (a step's input and cache key)."""

    model_config = ConfigDict(frozen=True)

    name: SystemName
    roster: Roster
    director: BackendConfig | None  # None: ScriptedDirector (a random persona, or the only one)
    speaker: BackendConfig
    user: BackendConfig
    profiles: list[UserProfile]
    block_turns: int
    max_directive_attempts: int = 3
    persona_specific: bool = True
    random_speaker: bool = False  # MASCOT-C: the Director's directive, with a random persona named
    cot: bool = False
    examples: list[FewShotExample] = []
    samples: int = 1  # Self-Consistency: replies sampled per turn
    reasoning_tokens: int = 0  # CoT: tokens for the reasoning, on top of the reply's cap
    cot_attempts: int = 1  # CoT: samples of a turn until one has its marker
    training_seed: int = 0  # the training run of its trained parts (eval.training_seeds); 0 for a system played once

    @property
    def spec(self) -> SystemSpec:
        return SYSTEMS[self.name]

    @property
    def budget(self) -> dict[str, int]:
        """Companion turns per block, the cap of each, and their product: the tokens it may write per block; and its
        compute, the replies its Speaker samples per turn and the most tokens it generates per block."""
        total = self.speaker.params.max_new_tokens
        cap = total - self.reasoning_tokens  # the reply's share; a CoT system reasons in its own tokens before it
        return {"turns": self.block_turns, "turn_tokens": cap, "block_tokens": self.block_turns * cap,
                "samples": self.samples, "reasoning_tokens": self.reasoning_tokens, "attempts": self.cot_attempts,
                "generated_tokens": self.block_turns * self.samples * self.cot_attempts * total}

    def cast(self, cache: RequestCache | None) -> Cast:
        director = (make_backend(self.director, cache=cache) if self.director is not None
                    else ScriptedDirector(self.roster))
        if self.random_speaker:
            director = RandomSpeaker(director, self.roster)
        params = self.director.params if self.director is not None else SamplingParams()
        if self.spec.group:
            prompt = partial(speaker_messages, persona_specific=self.persona_specific)
        else:
            prompt = partial(assistant_messages, cot=self.cot, examples=self.examples)
        speaker = make_backend(self.speaker, cache=cache)
        if self.cot or self.samples > 1:
            speaker = AssistantReplies(speaker, self.samples, self.cot, self.cot_attempts)
        return Cast(self.roster, director, speaker, make_backend(self.user, cache=cache), params, self.speaker.params,
                    self.user.params, self.max_directive_attempts, prompt)


@dataclass(frozen=True)
class Components:
    """The roles the systems are built from; the trained ones are adapters of Stage 1 and Stage 2."""

    base_speaker: BackendConfig
    trained_speaker: BackendConfig
    base_director: BackendConfig
    trained_director: BackendConfig | None  # None: this run trained no such Director
    user: BackendConfig
    trained_director_dpo: BackendConfig | None = None
    sft_speaker: BackendConfig | None = None  # the SFT baseline's adapter, where it is evaluated


def default_block_tokens(block_turns: int, parts: Components) -> int:
    """eval.block_tokens when the config leaves it out: a group's turns at the trained Speaker's own length, and a
    single assistant the whole block's worth."""
    return block_turns * parts.trained_speaker.params.max_new_tokens


def turn_tokens(name: SystemName, block_tokens: int, block_turns: int) -> int:
    """The most tokens one companion turn of system `name` may write, out of the block's `block_tokens`."""
    turns = block_turns if SYSTEMS[name].group else 1
    if block_tokens % turns:
        raise ValueError(f"{block_tokens} companion tokens per block do not split equally over {turns} turns")
    return block_tokens // turns


def with_max_tokens(backend: BackendConfig, tokens: int) -> BackendConfig:
    return backend.model_copy(update={"params": backend.params.model_copy(update={"max_new_tokens": tokens})})


def system_setup(name: SystemName, parts: Components, roster: Roster, assistant: Roster, profiles: list[UserProfile],
                 block_turns: int, max_directive_attempts: int, examples: Sequence[FewShotExample] = (),
                 self_consistency_samples: int = 5, *, block_tokens: int, cot_reasoning_tokens: int = 0,
                 cot_attempts: int = 1) -> SystemSetup:
    """The setup of system `name` from its parts (see the module's table), its Speaker capped at its share of the
    block's `block_tokens` (`turn_tokens`); a CoT system's at that share plus `cot_reasoning_tokens`, resampled up to
    `cot_attempts` times until its reply has the marker."""
    common = {"name": name, "user": parts.user, "profiles": profiles, "max_directive_attempts": max_directive_attempts}
    cap = turn_tokens(name, block_tokens, block_turns)
    if SYSTEMS[name].group:
        trained = name != "multi_agent"
        director = {"mascot_c_generic": None, "multi_agent": parts.base_director,
                    "mascot_dpo": parts.trained_director_dpo}.get(name, parts.trained_director)
        if director is None and name != "mascot_c_generic":
            raise ValueError(f"system '{name}' plays a trained Director that this run does not have")
        return SystemSetup(**common, roster=roster, director=director, block_turns=block_turns,
                           speaker=with_max_tokens(parts.trained_speaker if trained else parts.base_speaker, cap),
                           persona_specific=name != "mascot_p", random_speaker=name == "mascot_c")
    speaker = parts.sft_speaker if name == "sft" else parts.base_speaker
    if speaker is None:
        raise ValueError("system 'sft' plays the SFT baseline's adapter, which was not given")
    cot = name.endswith("_cot")
    reasoning = cot_reasoning_tokens if cot else 0
    return SystemSetup(**common, roster=assistant, director=None, block_turns=1,
                       speaker=with_max_tokens(speaker, cap + reasoning), reasoning_tokens=reasoning,
                       cot_attempts=cot_attempts if cot else 1, cot=cot, examples=list(examples) if name.startswith("few_shot") else [],
                       samples=self_consistency_samples if name == "self_consistency" else 1)


def assistant_messages(persona: Persona, context: Context, directive: object | None = None, *, cot: bool = False,
                       examples: Sequence[FewShotExample] = ()) -> list[dict]:
    """The single assistant's prompt: its description, the examples as earlier exchanges, then the context."""
    system = render("assistant.j2", persona=persona, domain=context.domain, query=meeting_query(context),
                    examples=bool(examples), cot=cot, marker=REPLY_MARKER)
    shots = [message for example in examples for message in ({"role": "user", "content": example.message},
                                                             {"role": "assistant", "content": example.reply})]
    return [{"role": "system", "content": system}, *shots, *context_messages(context)]


def strip_reasoning(text: str) -> tuple[str, bool]:
    """A CoT reply without its reasoning: the text after the last REPLY_MARKER, and whether there was one.
    A reply without the marker is kept whole (and counted by the caller): dropping it would score nothing."""
    _, marker, tail = text.rpartition(REPLY_MARKER)
    return (tail.strip(), True) if marker and tail.strip() else (text.strip(), False)


def most_typical(texts: Sequence[str]) -> int:
    """Self-Consistency for free text: the index of the reply most similar to the others (the highest mean
    word-set Jaccard similarity; the first on ties), since open replies cannot be majority-voted."""
    from mascot.evaluation.metrics import words

    sets = [set(words(text)) for text in texts]

    def similarity(i: int) -> float:
        return sum(len(sets[i] & other) / max(1, len(sets[i] | other)) for j, other in enumerate(sets) if j != i)

    return max(range(len(texts)), key=lambda i: (similarity(i), -i))


class AssistantReplies:
    """The single assistant's Speaker for CoT and Self-Consistency: each turn samples `samples` replies in
    one request, strips a CoT reply's reasoning, and keeps the most typical reply. A CoT turn whose kept reply has
    no marker is sampled again, with a seed of its own, up to `attempts` times in all. `marked` and `attempts` say,
    by the turn's request seed, whether the kept reply had its CoT marker and how many samplings it took, for the
    conversations table."""

    def __init__(self, backend, samples: int, cot: bool, attempts: int = 1):
        self.backend, self.samples, self.cot, self.max_attempts = backend, samples, cot, attempts if cot else 1
        self.kind, self.model = backend.kind, backend.model
        self.marked: dict[int, bool] = {}
        self.attempts: dict[int, int] = {}

    async def generate(self, messages, n: int, params: SamplingParams, seed: int,
                       response_format: dict | None = None) -> list[str]:
        if n != 1:
            raise ValueError(f"the assistant's turn asks for one reply, got n={n}")
        for attempt in range(self.max_attempts):
            # The first sampling uses the turn's own seed, as every system's turn does (common random numbers).
            drawn = seed if attempt == 0 else request_seed(seed, "cot-attempt", str(attempt))
            texts = await self.backend.generate(messages, n=self.samples, params=params, seed=drawn)
            replies, marked = zip(*(strip_reasoning(t) if self.cot else (t.strip(), True) for t in texts), strict=True)
            kept = most_typical(replies)
            if marked[kept]:
                break
        self.marked[seed], self.attempts[seed] = marked[kept], attempt + 1
        return [replies[kept]]


class RandomSpeaker:
    """MASCOT-C's Director: the trained Director's reply with only the persona it names replaced, by one chosen
    uniformly by the request's seed; its instruction and tone are kept. A reply that is not a valid directive is
    passed on as it is, so the episode retries it, then falls back, as for any Director."""

    def __init__(self, backend, roster: Roster):
        self.backend, self.kind, self.model = backend, backend.kind, backend.model
        self.roster, self.speakers = roster, [persona.id for persona in active_personas(roster)]

    async def generate(self, messages, n: int, params: SamplingParams, seed: int,
                       response_format: dict | None = None) -> list[str]:
        chooser, replies = random.Random(seed), []
        for text in await self.backend.generate(messages, n=n, params=params, seed=seed,
                                                response_format=response_format):
            try:
                directive = parse_directive(text, self.roster)
            except ReplyError:
                replies.append(text)
                continue
            replies.append(json.dumps({**directive.model_dump(), "next_speaker": chooser.choice(self.speakers)}))
        return replies


class ScriptedDirector:
    """A Director backend with no model: each request's reply is a valid directive naming a persona chosen
    uniformly by the request's seed (MASCOT-C's random order; the single assistant's only persona), with
    the generic instruction. Nothing is sent anywhere, so nothing is cached."""

    kind = "scripted"
    model = "random-order"

    def __init__(self, roster: Roster):
        self.speakers = [persona.id for persona in active_personas(roster)]

    async def generate(self, messages, n: int, params: SamplingParams, seed: int,
                       response_format: dict | None = None) -> list[str]:
        chooser = random.Random(seed)
        return [json.dumps({"next_speaker": chooser.choice(self.speakers), "instruction": FALLBACK_INSTRUCTION,
                            "tone": None}) for _ in range(n)]
