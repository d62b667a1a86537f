"""A run directory as a companion group: its roster, its trained Speaker and Director, and the guard.

The roles are the evaluation's MASCOT: `chat.speaker` and `chat.director` where the config names them,
then the evaluation's served roles (`eval.speaker`, `stage2.speaker`, `eval.director`), and otherwise the
run's own adapters (Stage 1's Speaker, Stage 2's GRPO Director) on their base models in this process. So
the tiny profile talks offline, and the paper profile talks to the vLLM server that serves both adapters
as LoRA modules, loaded there before the first message where a role says `load_adapter`
(`mascot.llm.served_adapters`). The config is the one the run's manifest recorded; `chat` replaces its chat section.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from mascot.artifacts import RunDir
from mascot.chat.moderation import Moderation
from mascot.chat.safety import DEFAULT_RULES, CrisisClassifier, load_rules
from mascot.chat.session import CompanionGroup
from mascot.config import TINY_MODELS, BackendConfig, ChatConfig, RunConfig
from mascot.llm import make_backend
from mascot.llm.served_adapters import serve_adapter
from mascot.roster import Roster, load_roster

NEEDED_BY = "a chat with the trained group"


def run_config(run_dir: Path) -> RunConfig:
    """The config a run recorded in its manifest."""
    run = RunDir(run_dir)
    if not run.manifest.is_file():
        raise FileNotFoundError(f"{run_dir} has no manifest.json, so it is not a run directory: give the folder a "
                                "run wrote, such as runs/tiny after `make demo`")
    recorded = json.loads(run.manifest.read_text()).get("config")
    try:
        return RunConfig.model_validate(recorded)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ValueError(f"{run.manifest}: the recorded config does not validate with this version of mascot "
                         f"({exc.error_count()} problem(s); {'.'.join(map(str, first['loc']))}: {first['msg']}); "
                         "pass --config with the run's config file") from None


def trained_roles(config: RunConfig, run: RunDir) -> tuple[BackendConfig, BackendConfig]:
    """The trained Speaker and Director, as the evaluation's MASCOT plays them (see the module docstring)."""
    if config.stage2 is None or config.train.director is None:
        raise ValueError(f"run {run.root} has no Stage 2 in its config, so it has no Director to choose who speaks; "
                         "train one with `mascot run stage2`")
    evaluation = config.eval
    speaker = config.chat.speaker or (evaluation.speaker if evaluation else None) or config.stage2.speaker
    director = config.chat.director or (evaluation.director if evaluation else None)
    return (_role(speaker, "speaker", "stage1/speaker", config.train.speaker, run),
            _role(director, "director", "stage2/director", config.train.director, run))


def _role(served: BackendConfig | None, role: str, artifact: str, policy, run: RunDir) -> BackendConfig:
    """The trained role on its server (the run's adapter loaded there, or checked, before the first message), or
    its adapter in this process. A module served by hand needs no adapter in the run; where there is one, its
    hash keys the role's requests."""
    needed = served is None or served.kind != "openai" or served.load_adapter
    adapter = run.recorded(artifact, NEEDED_BY) if needed or run.is_recorded(artifact) else None
    if served is not None:
        return serve_adapter(served, role, adapter, run.root)
    return _policy(policy, adapter.path)


def _policy(policy, adapter: Path) -> BackendConfig:
    from mascot.train.grpo import policy_backend  # the trainers' module, only where an adapter runs here

    return policy_backend(policy, adapter)


def taking_part(roster: Roster, ids: list[str] | None) -> Roster:
    """The roster with only `ids` enabled (all its enabled personas when None)."""
    if not ids:
        return roster
    enabled = [p.id for p in roster.active]
    unknown = [i for i in ids if i not in enabled]
    if unknown:
        raise ValueError(f"--personas: {', '.join(unknown)} is not a persona of '{roster.name}'; choose from "
                         f"{', '.join(enabled)}")
    personas = [p.model_copy(update={"enabled": p.id in ids}) for p in roster.personas]
    return roster.model_copy(update={"personas": personas})


def load_group(run_dir: Path, *, personas: list[str] | None = None, turns: int | None = None,
               chat: ChatConfig | None = None, progress: bool = True) -> CompanionGroup:
    """The group trained in `run_dir`, with `personas` taking part and `turns` companion turns per message."""
    config = run_config(run_dir)
    if chat is not None:
        config = config.model_copy(update={"chat": chat})
    roster = taking_part(load_roster(config.data.roster), personas)
    roles = trained_roles(config, RunDir(run_dir))
    if any(role.model in TINY_MODELS for role in roles):
        from mascot.train.tiny import build_tiny_models

        models = build_tiny_models(config.tiny, config.cache.root, progress)
        roles = tuple(role.model_copy(update={"model": str(models.path_for(role.model))})
                      if role.model in TINY_MODELS else role for role in roles)
    speaker, director = roles
    safety = config.chat.safety
    return CompanionGroup(
        name=str(run_dir), roster=roster, director=make_backend(director), speaker=make_backend(speaker),
        director_params=director.params, speaker_params=speaker.params,
        rules=load_rules(safety.rules or DEFAULT_RULES),
        classifier=CrisisClassifier(safety.classifier) if safety.classifier else None,
        moderation=Moderation(safety.moderation) if safety.moderation else None,
        turns=turns or config.chat.turns,
        max_directive_attempts=config.stage2.episodes.max_directive_attempts,
        reply_attempts=safety.reply_attempts, max_message_chars=config.chat.max_message_chars,
        max_messages=config.chat.max_messages)
