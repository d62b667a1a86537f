"""Loading a config file with the files it points at, and reporting every problem against its line.

A run config names a roster, user profiles, a rubric and corpus files. A missing one is reported
at the config line that names it; a problem inside one is reported at its own line. So is a file
that loads but that the run cannot use: a roster with fewer than two enabled personas for Stage 2's
Director to choose from, user profiles with none for the domain, a rubric a configured judge cannot
score. Corpora that are not downloaded yet say so, with where to get them. So are the evaluation's
and the chat's needs: the pairwise judge and the collective rubric it weighs by, a listed system and the
section that trains it, adapter folders, and the chat's safety-rules file, loaded and compiled. A folder
where a file belongs is reported at the line that names it. Checks of this machine (bf16 or a CUDA
device, for every role, needs a CUDA GPU) are separate, so a config meant for another machine can still
be checked here.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mascot.config.backends import BackendConfig, JudgeConfig
from mascot.config.data import CorpusConfig
from mascot.config.run import RunConfig
from mascot.roster import Roster, UserProfiles, load_roster, load_user_profiles
from mascot.rubrics import Rubric, load_rubric
from mascot.yamlio import ConfigError, Problem, YamlDocument, validate_document

# Where each corpus's release files come from: the README says which file to put where.
CORPUS_HOMES = {
    "empathetic_dialogues": "https://github.com/facebookresearch/EmpatheticDialogues (empatheticdialogues.tar.gz, "
                            "CC BY-NC 4.0; unpack it so that the folder holds train.csv, valid.csv and test.csv)",
    "esconv": "https://github.com/thu-coai/Emotional-Support-Conversation (ESConv.json, CC BY-NC 4.0)",
    "qmsum": "https://github.com/Yale-LILY/QMSum (the data/ folder with <Domain>/jsonl/{train,val,test}.jsonl, MIT)",
}

# Why a judge (its config entry) cannot score a rubric's criteria at a level ("reply" for Stage 1, "block"
# for Stage 2), or None. Only the judges know, and configs sit below them, so the caller hands it in:
# mascot.judges.panel.judge_rubric_problem.
RubricProblem = Callable[[JudgeConfig, Rubric, str], str | None]
# Loads and compiles a safety-rules file, raising ConfigError (or ValueError) when it cannot: the chat's
# loader, mascot.chat.safety.load_rules, which the caller hands in for the same reason.
RulesLoader = Callable[[Path], Any]
# A system of eval.systems that plays a Director only a section of the config trains or serves:
# (the train section, the eval section that serves it instead, what it is).
SYSTEM_NEEDS = {"mascot_dpo": ("director_dpo", "director_dpo", "the DPO Director")}


def load_config(path: str | Path, *, check_machine: bool = False, rubric_problem: RubricProblem | None = None,
                safety_rules: RulesLoader | None = None, check_corpora: bool = True) -> RunConfig:
    """Validate a run config and the files it points at; raise ConfigError listing every problem.

    With `check_machine`, also check that this machine can run it (a CUDA GPU where bf16 is on). With
    `rubric_problem`, also check that every judge can score its stage's rubric (the CLI and the Stage 1
    flow pass `mascot.judges.panel.judge_rubric_problem`, so Stage 2's judges are checked before Stage 1 runs).
    With `safety_rules` (`mascot.chat.safety.load_rules`), also load chat.safety.rules as the chat will.
    `check_corpora=False` accepts corpora that are not downloaded yet: `mascot data fetch` downloads them.
    """
    document = YamlDocument.read(path)
    config = validate_document(document, RunConfig, context={"base_dir": Path(path).resolve().parent})
    problems = file_problems(document, config, rubric_problem, safety_rules, check_corpora=check_corpora)
    if check_machine:
        problems += machine_problems(document, config)
    if problems:
        raise ConfigError(problems)
    return config


def load_any(path: str | Path, *, check_machine: bool = False, rubric_problem: RubricProblem | None = None,
             safety_rules: RulesLoader | None = None) -> RunConfig | Roster | Rubric | UserProfiles:
    """Validate a run config, roster, rubric or user-profile file, telling which by its top-level keys."""
    data = YamlDocument.read(path).data
    keys = set(data) if isinstance(data, dict) else set()
    if "personas" in keys:
        return load_roster(path)
    if "criteria" in keys:
        return load_rubric(path)
    if "profiles" in keys:
        return load_user_profiles(path)
    return load_config(path, check_machine=check_machine, rubric_problem=rubric_problem, safety_rules=safety_rules)


def file_problems(document: YamlDocument, config: RunConfig, rubric_problem: RubricProblem | None = None,
                  safety_rules: RulesLoader | None = None, *, check_corpora: bool = True) -> list[Problem]:
    problems: list[Problem] = []
    domain = config.data.domain
    roster = _load(problems, document, ("data", "roster"), config.data.roster, load_roster)
    if roster is not None and roster.domain != domain:
        problems.append(document.problem(("data", "roster"), f"roster {config.data.roster} is for '{roster.domain}', "
                                         f"but data.domain is '{domain}'"))
    if roster is not None and config.stage2 is not None and len(roster.active) < 2:
        problems.append(document.problem(("data", "roster"), (
            f"roster {config.data.roster} has {len(roster.active)} enabled persona(s) "
            f"({', '.join(p.id for p in roster.active)}), but Stage 2's Director chooses the next speaker among "
            "them, so it needs at least two; enable another persona, or remove the 'stage2' section")))
    if config.data.users is not None:
        users = _load(problems, document, ("data", "users"), config.data.users, load_user_profiles)
        if users is not None and not any(domain in p.domains for p in users.profiles):
            problems.append(document.problem(("data", "users"), (
                f"user profiles {config.data.users} have none for domain '{domain}' (data.domain), so none would be "
                f"used and Stage 2's simulated user would have no profile; add a profile whose domains include "
                f"'{domain}', or remove data.users")))
    problems += _rubric_problems(document, config, "stage1", config.stage1, rubric_problem)
    if config.stage2 is not None:
        problems += _rubric_problems(document, config, "stage2", config.stage2, rubric_problem)
    if config.eval is not None:
        problems += _eval_problems(document, config, rubric_problem)
    problems += _rules_problems(document, config, safety_rules)
    for name, trainer in config.train.trainers.items():  # both are read when the training step starts
        if trainer.accelerate_config is not None:
            problems += _missing_file(document, ("train", name, "accelerate_config"), trainer.accelerate_config)
        if trainer.python is not None:
            problems += _missing_file(document, ("train", name, "python"), trainer.python)
    for loc, backend in backends(config).items():  # an adapter is read when its model loads, after minutes of work
        if backend.adapter_sha256 is not None:
            problems.append(document.problem((*loc, "adapter_sha256"), "is set by the flow from the run's adapter, "
                                             "never in a config; remove it"))
        if backend.adapter is not None and not backend.adapter.is_dir():
            found = "is a file" if backend.adapter.exists() else "does not exist"
            problems.append(document.problem((*loc, "adapter"), f"{backend.adapter} {found}; expected a PEFT adapter "
                                             "folder (adapter_config.json and the weights)"))
    for loc, corpus in [(("data", "corpus"), config.data.corpus),
                        *((("data", "held_out", i), c) for i, c in enumerate(config.data.held_out))]:
        problem = _corpus_problem(document, (*loc, "path"), corpus) if check_corpora else None
        if problem is not None:
            problems.append(problem)
    return problems


def _rubric_problems(document: YamlDocument, config: RunConfig, stage: str, section,
                     rubric_problem: RubricProblem | None) -> list[Problem]:
    """The stage's rubric loads, fits the domain, leaves room for its margin, and every judge can score it."""
    problems: list[Problem] = []
    rubric = _load(problems, document, (stage, "rubric"), section.rubric, load_rubric)
    if rubric is not None and rubric_problem is not None:
        level = "reply" if stage == "stage1" else "block"  # Stage 1 judges one reply, Stage 2 a block of turns
        for index, judge in enumerate(section.judges):
            if (why := rubric_problem(judge, rubric, level)) is not None:
                problems.append(document.problem((stage, "rubric"), f"judge '{judge.label}' ({stage}.judges[{index}]) "
                                                 f"cannot score rubric {section.rubric}: {why}"))
    if rubric is not None and rubric.domain != config.data.domain:
        problems.append(document.problem((stage, "rubric"), f"rubric {section.rubric} is for "
                                         f"'{rubric.domain}', but data.domain is '{config.data.domain}'"))
    if rubric is not None and section.aggregation == "mean" and section.margin > rubric.span:
        problems.append(document.problem((stage, "margin"), (
            f"no pair can reach a margin of {section.margin:g}: scores of rubric '{rubric.name}' run from "
            f"{rubric.scale_min} to {rubric.scale_max}, so the largest gap is {rubric.span}; got {section.margin:g}")))
    return problems


def _rules_problems(document: YamlDocument, config: RunConfig, safety_rules: RulesLoader | None) -> list[Problem]:
    """chat.safety.rules is a file the chat's loader reads and compiles; before the chat starts, not after its
    models have loaded."""
    rules, loc = config.chat.safety.rules, ("chat", "safety", "rules")
    if rules is None:
        return []
    missing = _missing_file(document, loc, rules)
    if missing or safety_rules is None:
        return missing
    try:
        safety_rules(rules)
    except (ValueError, OSError) as exc:  # ConfigError is a ValueError, with each problem at the file's own line
        found = "; ".join(map(str, exc.problems)) if isinstance(exc, ConfigError) else str(exc)
        return [document.problem(loc, f"{rules} is not a safety-rules file the chat can use: {found}")]
    return []


def _eval_problems(document: YamlDocument, config: RunConfig, rubric_problem: RubricProblem | None) -> list[Problem]:
    """The assistant roster is one persona of the domain; each evaluation panel, and the pairwise judge, can score
    its rubric; each listed system has the section that trains (or serves) what it plays."""
    problems: list[Problem] = []
    evaluation, domain = config.eval, config.data.domain
    for index, system in enumerate(evaluation.systems):
        if system in SYSTEM_NEEDS:
            trained, served, what = SYSTEM_NEEDS[system]
            if getattr(config.train, trained) is None and getattr(evaluation, served) is None:
                problems.append(document.problem(("eval", "systems", index), (
                    f"'{system}' plays {what}, which train.{trained} trains (or eval.{served} serves), but the config "
                    f"has neither section: add train.{trained} (see configs/tiny.yaml), or drop '{system}'")))
    assistant = _load(problems, document, ("eval", "assistant"), evaluation.assistant, load_roster)
    if assistant is not None and (assistant.domain != domain or len(assistant.active) != 1):
        problems.append(document.problem(("eval", "assistant"), (
            f"roster {evaluation.assistant} must hold exactly one enabled persona for '{domain}' (data.domain), the "
            f"single assistant of the baselines; it is for '{assistant.domain}' with {len(assistant.active)} enabled")))
    panels = [("rubric", evaluation.rubric, config.stage1, "judges", evaluation.judges, "reply"),
              ("group_rubric", evaluation.group_rubric, config.stage2, "group_judges", evaluation.group_judges,
               "block")]
    for field, path, stage, panel, judges, level in panels:
        if path is None and judges == stage.judges:
            continue  # the stage's own rubric and judges, checked at the stage's lines
        path = path or stage.rubric
        loc = ("eval", field) if getattr(evaluation, field) is not None else ("eval", panel)
        rubric = _load(problems, document, loc, path, load_rubric)
        if rubric is None:
            continue
        if rubric.domain != domain:
            problems.append(document.problem(loc, f"rubric {path} is for '{rubric.domain}', but data.domain is "
                                                  f"'{domain}'"))
        for index, judge in enumerate(judges):
            if rubric_problem is not None and (why := rubric_problem(judge, rubric, level)) is not None:
                problems.append(document.problem(loc, f"judge '{judge.label}' (eval.{panel}[{index}]) cannot score "
                                                      f"rubric {path}: {why}"))
    return problems + _pairwise_problems(document, config, rubric_problem) + _primary_metric_problems(document, config)


def _primary_metric_problems(document: YamlDocument, config: RunConfig) -> list[Problem]:
    """eval.primary.metric names a criterion of its level's rubric, or 'overall' (an automatic metric is checked
    with the config; a rubric that does not load is reported at its own line)."""
    evaluation = config.eval
    metric, level = evaluation.primary.metric, evaluation.primary.level
    if level not in ("persona", "collective") or metric == "overall":
        return []
    path = (evaluation.rubric or config.stage1.rubric) if level == "persona" else \
        (evaluation.group_rubric or config.stage2.rubric)
    try:
        rubric = load_rubric(path)
    except (ConfigError, OSError):
        return []
    if metric in rubric.criterion_ids:
        return []
    return [document.problem(("eval", "primary", "metric"), (
        f"'{metric}' is not a criterion of rubric {path} (the level eval.primary.level scores by); expected "
        f"'overall' or one of {', '.join(rubric.criterion_ids)}"))]


def _pairwise_problems(document: YamlDocument, config: RunConfig, rubric_problem: RubricProblem | None
                       ) -> list[Problem]:
    """The pairwise judge weighs two conversations by the collective rubric (eval.group_rubric, else stage2.rubric),
    a block's criteria; a rubric that is missing or broken is reported where it is named, so it is not again here."""
    if config.eval.pairwise.kind == "planted":
        return [document.problem(("eval", "pairwise"), "a planted judge scores Stage 2's blocks only; it cannot compare "
                                                       "two systems' conversations: use a heuristic or llm judge")]
    path = config.eval.group_rubric or config.stage2.rubric
    if rubric_problem is None or not path.is_file():
        return []
    try:
        rubric = load_rubric(path)
    except ConfigError:
        return []
    judge = config.eval.pairwise
    problems = []
    if (why := rubric_problem(judge, rubric, "block")) is not None:
        named = "eval.group_rubric" if config.eval.group_rubric is not None else "stage2.rubric"
        problems.append(document.problem(("eval", "pairwise"), f"the pairwise judge '{judge.label}' weighs by the "
                                                               f"collective rubric {path} ({named}) and cannot score it: "
                                                               f"{why}"))
    return problems + _neutral_rubric_problems(document, config, rubric_problem)


def _neutral_rubric_problems(document: YamlDocument, config: RunConfig, rubric_problem: RubricProblem) -> list[Problem]:
    """eval.neutral_rubric loads, is for the domain, and the pairwise judge can score it."""
    path = config.eval.neutral_rubric
    if path is None:
        return []
    problems: list[Problem] = []
    rubric = _load(problems, document, ("eval", "neutral_rubric"), path, load_rubric)
    if rubric is None:
        return problems
    if rubric.domain != config.data.domain:
        problems.append(document.problem(("eval", "neutral_rubric"), f"rubric {path} is for '{rubric.domain}', but "
                                                                     f"data.domain is '{config.data.domain}'"))
    judge = config.eval.pairwise
    if (why := rubric_problem(judge, rubric, "block")) is not None:
        problems.append(document.problem(("eval", "neutral_rubric"), f"the pairwise judge '{judge.label}' cannot "
                                                                     f"score rubric {path}: {why}"))
    return problems


def machine_problems(document: YamlDocument, config: RunConfig) -> list[Problem]:
    """What keeps this machine from running the config: bf16 or a CUDA device without a CUDA GPU, a Dask or Ray
    runner without its Prefect integration."""
    problems = []
    kind = config.runner.kind
    if kind != "threads" and importlib.util.find_spec(f"prefect_{kind}") is None:
        problems.append(document.problem(("runner", "kind"), f"the {kind} runner needs prefect-{kind}, which is not "
                                         f"installed here: pip install 'mascot[{kind}]', or set runner.kind: threads"))
    return problems + _cuda_problems(document, config) + gpu_map_problems(document, config)


def gpu_map_problems(document: YamlDocument, config: RunConfig, gpu_count: Callable[[], int] | None = None
                     ) -> list[Problem]:
    """Every GPU the map names exists on this machine. `gpu_count` defaults to the GPUs this process sees, so
    validate with every GPU visible (CUDA_VISIBLE_DEVICES unset): the map numbers them as nvidia-smi does."""
    if config.gpus is None:
        return []
    count = (gpu_count or visible_gpu_count)()
    return [document.problem(("gpus", *loc), f"GPU {gpu} does not exist here: this machine shows {count} GPU(s) "
                                             f"(0 to {count - 1})" if count else
                             f"GPU {gpu} does not exist here: this machine shows no CUDA GPU; check a config meant "
                             "for another machine with mascot config validate --no-machine-checks")
            for loc, gpu in config.gpus.indices().items() if gpu >= count]


def backends(config: RunConfig) -> dict[tuple, BackendConfig]:
    """Every backend of the config, by its YAML path: each role of each section, and each judge's."""
    found = {("generation",): config.generation,
             **{("stage1", "judges", i, "backend"): j.backend for i, j in enumerate(config.stage1.judges) if j.backend}}
    if config.stage2 is not None:
        found |= {("stage2", role): b for role in ("director", "speaker", "user")
                  if (b := getattr(config.stage2, role)) is not None}
        found |= {("stage2", "judges", i, "backend"): j.backend for i, j in enumerate(config.stage2.judges)
                  if j.backend}
    if config.eval is not None:
        found |= {("eval", role): b for role in ("director", "director_dpo", "speaker", "sft")
                  if (b := getattr(config.eval, role))}
        found |= {("eval", panel, i, "backend"): j.backend for panel in ("judges", "group_judges")
                  for i, j in enumerate(getattr(config.eval, panel)) if j.backend}
        if config.eval.pairwise.backend is not None:
            found[("eval", "pairwise", "backend")] = config.eval.pairwise.backend
    found |= {("chat", role): b for role in ("speaker", "director") if (b := getattr(config.chat, role)) is not None}
    return found


def _cuda_problems(document: YamlDocument, config: RunConfig) -> list[Problem]:
    wants_cuda = {("train", name, "bf16"): ("bf16 needs a CUDA GPU", "bf16: false to train in float32")
                  for name, trainer in config.train.trainers.items() if trainer.bf16 and not trainer.use_cpu}
    devices = {(*loc, "device"): b.device for loc, b in backends(config).items() if b.kind == "transformers"}
    if (classifier := config.chat.safety.classifier) is not None:  # a transformers pipeline, on its device
        devices[("chat", "safety", "classifier", "device")] = classifier.device
    wants_cuda |= {loc: (f"device '{device}' is a CUDA GPU", "device: auto or cpu")
                   for loc, device in devices.items() if device.startswith("cuda")}
    if not wants_cuda or _cuda_visible():
        return []
    return [document.problem(loc, f"{reason}, and none is visible on this machine; set {fix} here, or check a config "
                                  "meant for another machine with mascot config validate --no-machine-checks")
            for loc, (reason, fix) in wants_cuda.items()]


def visible_gpu_count() -> int:
    """The CUDA GPUs this process sees (0 without torch): what `mascot config validate` checks the GPU map against,
    and what makes a training step outside `accelerate launch` fail fast when it is more than one."""
    if not _cuda_visible():
        return 0
    import torch

    return torch.cuda.device_count()


def _cuda_visible() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def _missing_file(document: YamlDocument, loc: tuple, target: Path) -> list[Problem]:
    """A path where a file belongs that is no file, reported at the config line that names it."""
    if target.is_dir():
        return [document.problem(loc, f"{target} is a folder; expected a file")]
    if not target.is_file():
        return [document.problem(loc, f"no such file: {target}")]
    return []


def _load(problems: list[Problem], document: YamlDocument, loc: tuple, target: Path, loader: Callable[[Path], Any]):
    if missing := _missing_file(document, loc, target):
        problems.extend(missing)
        return None
    try:
        return loader(target)
    except ConfigError as exc:
        problems.extend(exc.problems)
        return None


def _corpus_problem(document: YamlDocument, loc: tuple, corpus: CorpusConfig) -> Problem | None:
    if corpus.path is None or corpus.path.exists():
        return None
    return document.problem(loc, f"the {corpus.source} corpus is not downloaded: {corpus.path} does not exist. "
                                 f"Run `mascot data fetch --config {document.path}`, or get it from "
                                 f"{CORPUS_HOMES[corpus.source]} and put it there, or point this path at your copy")
