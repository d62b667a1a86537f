"""The `mascot` command line.

    mascot config validate configs/tiny.yaml    check a config, roster or user-profile file
    mascot data preview --config configs/tiny.yaml
    mascot models build --config configs/tiny.yaml
    mascot sample --config configs/tiny.yaml    K candidates per (context, persona)
    mascot run stage1 --config configs/tiny.yaml    pairs, persona reward model, GRPO Speaker
"""

from __future__ import annotations

import asyncio
import os
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from mascot.config import RunConfig, load_any, load_config
from mascot.roster import Roster, UserProfiles
from mascot.yamlio import ConfigError

app = typer.Typer(help="MASCOT: train and evaluate multi-agent companion groups.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
config_app = typer.Typer(help="Check configuration files.", no_args_is_help=True)
data_app = typer.Typer(help="Inspect corpora.", no_args_is_help=True)
models_app = typer.Typer(help="Build and locate models.", no_args_is_help=True)
run_app = typer.Typer(help="Run pipeline stages as Prefect flows (cached and resumable).", no_args_is_help=True)
app.add_typer(run_app, name="run")
app.add_typer(config_app, name="config")
app.add_typer(data_app, name="data")
app.add_typer(models_app, name="models")

console = Console(emoji=False)  # corpus ids such as "ed:train:..." must not turn into emoji
errors = Console(stderr=True, soft_wrap=True, emoji=False)  # never wrap error lines: they are grepped and copied

ConfigOption = Annotated[Path, typer.Option("--config", "-c", help="Run config YAML, e.g. configs/tiny.yaml.")]


def _fail(message: object, code: int = 2) -> NoReturn:
    errors.print(Text(str(message), style="red"))
    raise typer.Exit(code)


def _load(config: Path) -> RunConfig:
    try:
        return load_config(config)
    except ConfigError as exc:
        _fail(f"{config} is not valid\n{exc}")


@contextmanager
def _corpus_errors():
    """A corpus that cannot be read becomes its loader's message (file, record, field) and exit status 2."""
    try:
        yield
    except (ValueError, FileNotFoundError, RuntimeError) as exc:  # CorpusFormatError is a ValueError
        _fail(exc)


@config_app.command("validate")
def config_validate(paths: Annotated[list[Path], typer.Argument(help="Config, roster or user-profile YAML files.")]):
    """Validate files; print a summary of each, or every problem with its YAML path. Exit 2 on problems."""
    failed = False
    for path in paths:
        try:
            loaded = load_any(path)
        except ConfigError as exc:
            failed = True
            errors.print(Text(f"{path}: {len(exc.problems)} problem(s)", style="red"))
            for problem in exc.problems:
                errors.print(Text(f"  {problem}"))
            continue
        console.print(f"[green]ok[/green] {path}", highlight=False)
        console.print(_summary(loaded))
    raise typer.Exit(2 if failed else 0)


def _summary(loaded: RunConfig | Roster | UserProfiles) -> Table:
    table = Table(show_header=False, box=None, padding=(0, 2))
    if isinstance(loaded, Roster):
        table.add_row("roster", f"{loaded.name} ({loaded.domain})")
        for p in loaded.personas:
            table.add_row(p.id, f"{p.name}: {p.role}" + ("" if p.enabled else " [dim](disabled)[/dim]"))
        return table
    if isinstance(loaded, UserProfiles):
        for u in loaded.profiles:
            table.add_row(u.id, f"{u.name} ({', '.join(u.domains)})")
        return table
    c = loaded
    corpus = c.data.corpus
    table.add_row("run", f"{c.run.name} -> {c.run_dir} (seed {c.run.seed})")
    table.add_row("domain", f"{c.data.domain}, roster {c.data.roster.name}")
    table.add_row("corpus", f"{corpus.source} {corpus.split} from {corpus.path or corpus.hub_name}"
                  + (f", limit {corpus.limit}" if corpus.limit else ""))
    for held in c.data.held_out:
        table.add_row("held out", f"{held.source} {held.split} from {held.path or held.hub_name}")
    table.add_row("models", ", ".join(f"{k}={v}" for k, v in c.models.model_dump().items()))
    g = c.generation
    table.add_row("generation", f"{g.kind} {g.model}" + (f" at {g.base_url}" if g.base_url else ""))
    table.add_row("stage 1", f"K={c.stage1.k}, margin {c.stage1.margin}, shard size {c.stage1.shard_size}, "
                  f"judges: {', '.join(j.label for j in c.stage1.judges)}")
    lora, rm, speaker = c.train.lora, c.train.persona_rm, c.train.speaker
    table.add_row("persona RM", f"{c.models.persona_rm}, {rm.epochs:g} epoch(s), lr {rm.learning_rate:g}, "
                  f"{c.train.held_out_fraction:.0%} of contexts held out")
    table.add_row("Speaker", f"GRPO on {c.models.speaker}, {speaker.max_steps} steps, {speaker.num_generations} "
                  f"completions per prompt, lr {speaker.learning_rate:g}, beta {speaker.beta:g}")
    table.add_row("training", f"LoRA r={lora.r} alpha={lora.alpha} on {', '.join(lora.target_modules)}; "
                  f"bf16={c.train.bf16}, vLLM={c.train.use_vllm}")
    table.add_row("tracking", f"wandb {c.tracking.wandb_mode}, project {c.tracking.wandb_project}")
    return table


@data_app.command("preview")
def data_preview(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="Preview the config's training corpus.")] = None,
    source: Annotated[str | None, typer.Option(help="Corpus loader: empathetic_dialogues, qmsum or esconv.")] = None,
    path: Annotated[Path | None, typer.Option(help="Corpus file or folder (with --source).")] = None,
    split: Annotated[str | None, typer.Option(help="Split to read (with --source; default: the corpus's usual one).")] = None,
    n: Annotated[int, typer.Option("-n", help="How many contexts to show.")] = 3,
    seed: Annotated[int, typer.Option(help="Subsampling seed.")] = 0,
):
    """Show a few parsed contexts from a corpus."""
    from mascot.data import load_contexts, load_corpus

    if (config is None) == (source is None):
        _fail("pass either --config or --source with --path")
    corpus = _load(config).data.corpus if config is not None else None
    with _corpus_errors():
        if corpus is not None:
            contexts = load_corpus(corpus, limit=n, seed=seed)
        else:
            contexts = load_contexts(source, path, split=split, limit=n, seed=seed)
    for context in contexts:
        tags = ", ".join(f"{k}={v}" for k, v in [("split", context.split), ("valence", context.valence),
                                                 ("meeting", context.meeting_type)] if v)
        lines = [f"[bold]{escape(m.name or m.role)}[/bold]: {escape(m.content)}" for m in context.history]
        console.print(Panel("\n".join(lines), title=Text(f"{context.id} ({tags})"), title_align="left"))


@models_app.command("build")
def models_build(config: ConfigOption):
    """Build (or find in the cache) the tiny offline models a config refers to, and print their folders."""
    from mascot.train.tiny import build_tiny_models

    run = _load(config)
    if run.tiny is None:
        console.print("this config uses no tiny models; nothing to build")
        return
    models = build_tiny_models(run.tiny, run.cache.root)
    console.print(f"tiny:lm  {models.lm}\ntiny:rm  {models.rm}", highlight=False)


@app.command("sample")
def sample(
    config: ConfigOption,
    contexts: Annotated[int, typer.Option(help="How many contexts to sample for.")] = 3,
    k: Annotated[int | None, typer.Option(help="Candidates per query (default: stage1.k).")] = None,
    persona: Annotated[list[str] | None, typer.Option(help="Persona id(s); default: all enabled.")] = None,
):
    """Sample K candidate replies per (context, persona) with the configured backend and print them."""
    from mascot.candidates import build_queries, sample_candidates
    from mascot.data import load_corpus
    from mascot.llm import BackendError, RequestCache, make_backend
    from mascot.roster import load_roster
    from mascot.train.tiny import resolve_model

    run = _load(config)
    roster = load_roster(run.data.roster)
    try:
        personas = [roster.get(p) for p in persona] if persona else roster.active
    except KeyError as exc:
        _fail(exc.args[0])
    with _corpus_errors():
        picked = load_corpus(run.data.corpus, limit=contexts, seed=run.run.seed)
    cache = RequestCache(run.cache.root / "requests.sqlite")
    backend = make_backend(run.generation, model_path=resolve_model(run.generation.model, run), cache=cache)
    queries = build_queries(picked, personas)
    k = k or run.stage1.k
    with console.status(f"sampling {len(queries)} queries x {k} candidates"):
        try:
            results = asyncio.run(sample_candidates(backend, queries, k, run.generation.params, run.run.seed))
        except BackendError as exc:
            _fail(exc, code=1)
    for result in results:
        last = result.query.context.history[-1]
        body = f"[dim]{escape(last.name or last.role)}: {escape(last.content)}[/dim]\n" + "\n".join(
            f"[bold]{i}[/bold]. {escape(text) or '[dim](empty)[/dim]'}" for i, text in enumerate(result.texts, 1))
        title = Text(f"{result.query.persona.name} | {result.query.context.id}")
        console.print(Panel(body, title=title, title_align="left"))
    stats = cache.stats()
    console.print(f"request cache {cache.path}: {stats.hits} hits, {stats.misses} misses", highlight=False,
                  soft_wrap=True)


# Prefect's embedded server needs longer than its default to start on a small machine.
PREFECT_DEFAULTS = {"PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "60",
                    "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}


class Stage1Step(str, Enum):
    pairs = "pairs"
    persona_rm = "persona_rm"
    speaker = "speaker"


@run_app.command("stage1")
def run_stage1(
    config: ConfigOption,
    run_name: Annotated[str | None, typer.Option(help="Override run.name (the run directory's name).")] = None,
    until: Annotated[Stage1Step, typer.Option(
        help="Last step: 'pairs' (data only), 'persona_rm' (+ reward model) or 'speaker' (+ GRPO and the "
             "before/after comparison).")] = Stage1Step.speaker,
    refresh: Annotated[bool, typer.Option(help="Ignore cached shard results and recompute them.")] = False,
):
    """Stage 1: candidates, judgments and preference pairs; the persona reward model; the GRPO Speaker.

    Reruns skip every cached step; a killed run resumes where it stopped, training from its last
    checkpoint. Artifacts go to <run.output_dir>/<run name>/stage1/, with report.md and summary.json.
    """
    _load(config)  # fail fast, before Prefect starts, on a bad config
    for name, value in PREFECT_DEFAULTS.items():
        os.environ.setdefault(name, value)
    from flows.stage1 import stage1
    from mascot.judges.panel import JudgeFailureRateExceeded
    from mascot.llm import BackendError
    from mascot.train.runtime import TrainingSetupError

    try:
        artifacts = stage1(str(config), run_name=run_name, until=until.value, refresh=refresh)
    except (JudgeFailureRateExceeded, BackendError, TrainingSetupError) as exc:
        # Everything finished before the failure is cached: rerunning resumes from there.
        _fail(f"stage 1 stopped: {exc}", code=1)
    run_dir = artifacts["stage1/contexts"].path.parents[1]  # where the flow put the run, --run-name included
    console.print(f"[green]stage 1 done[/green] (until {until.value}): {run_dir}", highlight=False)
    for name, artifact in artifacts.items():
        console.print(f"  {name:<20} {artifact.path}", highlight=False)
    console.print(f"  {'summary':<20} {run_dir / 'stage1' / 'summary.json'}", highlight=False)
    console.print(f"  {'report':<20} {run_dir / 'stage1' / 'report.md'}", highlight=False)


if __name__ == "__main__":
    app()
