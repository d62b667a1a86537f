"""The evaluation's requests, as `mascot plan` counts them (`mascot.plan`): every system's conversations and their
scoring, from the config alone, the way `flows/evaluate.py` and `mascot.evaluation` make them.

Each system in `eval.systems` plays every evaluation context once per seed (`eval.seeds`), and a system built from
the GRPO-trained Speaker or Director (`SEEDED_SYSTEMS`) once per seed of each training run (`eval.training_seeds`,
whose every run MASCOT's pairwise comparisons cover too): Stage 1's held-out
contexts, then, with `eval.out_of_domain`, those of `data.held_out` (`mascot.plan.counts`). A conversation is
`eval.blocks` blocks, the simulated user's turn between two (blocks - 1 user turns). A group system answers a block
with `block_turns` companion turns, each a directive and a reply; MASCOT-C with the generic instruction and every
single assistant have a scripted Director that asks no model. A single assistant answers a block with one reply:
Self-Consistency samples `self_consistency_samples` replies in that one request, and a CoT system samples its turn
again, up to `cot_attempts` requests, until the reply has its marker. Each turn's cap is its share of the block's
`block_tokens` (a CoT turn's plus `cot_reasoning_tokens`), as `mascot.evaluation.systems.turn_tokens` gives it.

Scoring: every persona-level judge reads every companion turn, every collective judge every conversation, and the
pairwise judge each baseline's conversation against MASCOT's of the same context and seed, in both orders. A judge
that is not an LLM (heuristic) asks nothing. A directive is counted once (at least: an unusable one is asked again,
up to stage2.episodes.max_directive_attempts), a CoT turn at its most, and a judgment once (an unusable reply is
asked again, up to the judge's max_attempts). These are the requests asked: the request cache answers a repeated one
without sending it (MASCOT-P's and MASCOT-C's first directive of each conversation is MASCOT's, and MASCOT-C's later
turns are MASCOT's wherever its random persona is the one MASCOT's Director named), so a server sees at most these.
"""

from __future__ import annotations

from dataclasses import dataclass

from mascot.config import BackendConfig, RunConfig, SamplingParams
from mascot.config.evaluation import GROUP_SYSTEMS, SEEDED_SYSTEMS

SCRIPTED_DIRECTOR = frozenset({"mascot_c_generic"})  # group systems whose Director is ScriptedDirector
UNTRAINED = frozenset({"multi_agent"})  # the group system of the base Speaker and the base Director


@dataclass(frozen=True)
class Ask:
    """Requests of one evaluation step to one backend (`mascot.plan.Work` before its tokens are counted)."""

    step: str
    backend: BackendConfig
    requests: int
    n: int  # completions per request
    kind: str  # the kind of prompt, for its guessed tokens (mascot.plan.GUESSED_RATES)


def _in_process(model: str, params: SamplingParams) -> BackendConfig:
    return BackendConfig(kind="transformers", model=model, params=params)


def _capped(backend: BackendConfig, tokens: int) -> BackendConfig:
    return backend.model_copy(update={"params": backend.params.model_copy(update={"max_new_tokens": tokens})})


def _roles(config: RunConfig) -> dict[str, BackendConfig | None]:
    """The backends the systems are built from, as flows/evaluate.py's `components` resolves them: the served one
    the config names, else the trained adapter in this process, sampling as its trainer did (the SFT baseline as
    `generation` does)."""
    evaluation, stage, train = config.eval, config.stage2, config.train

    def policy(trainer) -> BackendConfig:  # mascot.train.grpo.policy_backend, without the adapter's path
        return _in_process(trainer.model, SamplingParams(max_new_tokens=trainer.max_completion_length))

    dpo = train.director_dpo and _in_process(train.director_dpo.model,
                                             SamplingParams(max_new_tokens=train.director.max_completion_length))
    return {"base_speaker": config.generation, "base_director": stage.director, "user": stage.user,
            "trained_speaker": evaluation.speaker or stage.speaker or policy(train.speaker),
            "trained_director": evaluation.director or policy(train.director),
            "trained_director_dpo": evaluation.director_dpo or dpo,
            "sft_speaker": evaluation.sft or (train.sft and _in_process(train.sft.model, config.generation.params))}


def block_turns(config: RunConfig) -> int:
    return config.eval.block_turns or config.stage2.episodes.block_turns


def companion_turns(config: RunConfig, system: str) -> int:
    """Companion turns of one conversation of `system`."""
    return config.eval.blocks * (block_turns(config) if system in GROUP_SYSTEMS else 1)


def evaluation_asks(config: RunConfig, contexts: int) -> list[Ask]:
    """Every request of the evaluation's conversations and scoring over `contexts` evaluation contexts."""
    evaluation, roles = config.eval, _roles(config)
    turns = block_turns(config)
    block_tokens = evaluation.block_tokens or turns * roles["trained_speaker"].params.max_new_tokens
    per_run = contexts * len(evaluation.seeds)  # per system and training run: every context once per seed

    def conversations(system: str) -> int:  # a system built from the GRPO policies plays once per training run
        return per_run * (evaluation.training_seeds if system in SEEDED_SYSTEMS else 1)

    asks: list[Ask] = []
    for system in evaluation.systems:
        group = system in GROUP_SYSTEMS
        said = conversations(system) * companion_turns(config, system)
        users = conversations(system) * (evaluation.blocks - 1)  # the user's turn between two blocks
        cap = block_tokens // (turns if group else 1)
        if group:
            trained = system not in UNTRAINED
            speaker = roles["trained_speaker" if trained else "base_speaker"]
            director = None if system in SCRIPTED_DIRECTOR else roles[
                "base_director" if not trained else "trained_director_dpo" if system == "mascot_dpo"
                else "trained_director"]
            if director is not None:
                asks.append(Ask(f"{system}: directives (at least)", director, said, 1, "director"))
            asks.append(Ask(f"{system}: replies", _capped(speaker, cap), said, 1, "speaker"))
        else:
            speaker = roles["sft_speaker" if system == "sft" else "base_speaker"]
            cot = system.endswith("_cot")
            samples = evaluation.self_consistency_samples if system == "self_consistency" else 1
            if cot:  # sampled again, each with its own seed, until the reply has its marker
                asks.append(Ask(f"{system}: replies (at most)", _capped(speaker, cap + evaluation.cot_reasoning_tokens),
                                said * evaluation.cot_attempts, samples, "speaker"))
            else:
                asks.append(Ask(f"{system}: replies", _capped(speaker, cap), said, samples, "speaker"))
        if users:
            asks.append(Ask(f"{system}: user turns", roles["user"], users, 1, "user"))

    judged_turns = sum(conversations(system) * companion_turns(config, system) for system in evaluation.systems)
    judged = sum(conversations(system) for system in evaluation.systems)
    baselines = len(evaluation.systems) - 1  # every system but MASCOT, each against each of MASCOT's runs
    asks += [Ask(f"eval judge ({judge.label})", judge.backend, judged_turns, 1, "judge")
             for judge in evaluation.judges if judge.backend is not None]
    asks += [Ask(f"eval group judge ({judge.label})", judge.backend, judged, 1, "group_judge")
             for judge in evaluation.group_judges if judge.backend is not None]
    if evaluation.pairwise.backend is not None:  # both orders: MASCOT first, then second
        asks.append(Ask(f"pairwise judge ({evaluation.pairwise.label}, both orders)", evaluation.pairwise.backend,
                        baselines * conversations("mascot") * 2, 1, "pairwise_judge"))
    return asks
