"""The `mascot` command line: checking configs, inspecting corpora and models, sampling, running stages.

    mascot init DIR                             the shipped profiles and rosters in DIR/configs (for an installed package)
    mascot config validate configs/tiny.yaml    check a config, roster, rubric or user-profile file
    mascot plan --config configs/paper.yaml     requests, API cost, steps, GPU-hours and memory, before a run
    mascot data preview --config configs/tiny.yaml
    mascot data fetch --config configs/paper.yaml   download the corpora a config names, checked and resumable
    mascot models build --config configs/tiny.yaml
    mascot sample --config configs/tiny.yaml    K candidates per (context, persona)
    mascot run stage1 --config configs/tiny.yaml    pairs, persona reward model, GRPO Speaker
    mascot server start                         a Prefect server that stays up, for runs and deployments
    mascot eval export-human runs/tiny          blind preference sheets for human raters; import-human reads them
    mascot chat runs/tiny [--web]               talk to the trained group, in the terminal or a local web page

It lives outside the `mascot` library because it starts Prefect flows (`cli/run.py`); heavy
imports wait until a command needs them, so `--help`, `--version` and `config validate` stay quick.
"""

from __future__ import annotations

import asyncio
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

import mascot
from cli.chat import chat
from cli.common import ConfigOption, console, errors, fail, load
from cli.eval import eval_app
from cli.plan import plan
from cli.run import resume, run_app
from cli.server import server_app
from mascot.config import RunConfig, load_any
from mascot.data.sources import corpus_route
from mascot.roster import Roster, UserProfiles
from mascot.rubrics import Rubric
from mascot.yamlio import ConfigError, YamlDocument

app = typer.Typer(help="MASCOT: train and evaluate multi-agent companion groups.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
config_app = typer.Typer(help="Check configuration files.", no_args_is_help=True)
data_app = typer.Typer(help="Download and inspect corpora.", no_args_is_help=True)
models_app = typer.Typer(help="Build and locate models.", no_args_is_help=True)
app.add_typer(run_app, name="run")
app.command("resume")(resume)
app.command("chat")(chat)
app.command("plan")(plan)
app.add_typer(config_app, name="config")
app.add_typer(data_app, name="data")
app.add_typer(models_app, name="models")
app.add_typer(server_app, name="server")
app.add_typer(eval_app, name="eval")


def _version(show: bool) -> None:
    if show:
        console.print(f"mascot {mascot.__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def main(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                               help="Print the version and exit.")] = False) -> None:
    """MASCOT: train and evaluate multi-agent companion groups."""


@contextmanager
def _corpus_errors():
    """A corpus that cannot be read becomes its loader's message (file, record, field) and exit status 2."""
    try:
        yield
    except (ValueError, FileNotFoundError, RuntimeError) as exc:  # CorpusFormatError is a ValueError
        fail(exc)


@config_app.command("validate")
def config_validate(
    paths: Annotated[list[Path], typer.Argument(help="Run config, roster, rubric or user-profile YAML files.")],
    machine_checks: Annotated[bool, typer.Option(
        help="Also check that this machine can run a run config (a CUDA GPU where bf16 or a cuda device is "
             "set). Turn off to check a config meant for another machine.")] = True,
):
    """Validate files; print a summary of each, or every problem as file:line: yaml.path: message. Exit 2 on problems."""
    from mascot.chat.safety import load_rules  # here, not at the top: `--help` needs no judges nor rules
    from mascot.judges.panel import judge_rubric_problem

    failed = False
    for path in paths:
        try:
            loaded = load_any(path, check_machine=machine_checks, rubric_problem=judge_rubric_problem,
                              safety_rules=load_rules)
            unchecked = []
            if machine_checks and isinstance(loaded, RunConfig):  # a module served by hand is there before a run
                from mascot.llm.served_adapters import served_module_problems

                problems, unchecked = served_module_problems(YamlDocument.read(path), loaded)
                if problems:
                    raise ConfigError(problems)
        except ConfigError as exc:
            failed = True
            errors.print(Text(f"{path}: {len(exc.problems)} problem(s)", style="red"))
            for problem in exc.problems:
                errors.print(Text(f"  {problem}"))
            continue
        console.print(f"[green]ok[/green] {path}", highlight=False)
        for note in unchecked:
            console.print(Text(f"  not checked: {note}", style="yellow"))
        console.print(_summary(loaded))
    raise typer.Exit(2 if failed else 0)


def _summary(loaded: RunConfig | Roster | Rubric | UserProfiles) -> Table:
    table = Table(show_header=False, box=None, padding=(0, 2))
    if isinstance(loaded, Rubric):
        table.add_row("rubric", f"{loaded.name} ({loaded.domain}), scores {loaded.scale_min}-{loaded.scale_max}")
        for criterion in loaded.criteria:
            table.add_row(criterion.id, criterion.name)
        return table
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
    # One line per corpus, saying whether it is read from release files or the hub's parquet conversion.
    table.add_row("corpus", corpus_route(corpus) + (f", limit {corpus.limit}" if corpus.limit else ""))
    for held in c.data.held_out:
        table.add_row("held out", corpus_route(held))
    table.add_row("held-out share", f"{c.data.held_out_fraction:.0%} of the contexts, kept out of all training")
    g = c.generation
    table.add_row("generation", f"{g.kind} {g.model}" + (f" at {g.base_url}" if g.base_url else ""))
    table.add_row("stage 1", f"K={c.stage1.k}, margin {c.stage1.margin}, shard size {c.stage1.shard_size}, "
                  f"judges: {', '.join(j.label for j in c.stage1.judges)}")
    rm, speaker = c.train.persona_rm, c.train.speaker
    table.add_row("persona RM", f"{rm.model}, {rm.epochs:g} epoch(s), lr {rm.learning_rate:g}, bf16={rm.bf16}")
    table.add_row("Speaker", f"GRPO on {speaker.model}, {speaker.max_steps} steps, {speaker.num_generations} "
                  f"completions per prompt, lr {speaker.learning_rate:g}, beta {speaker.beta:g}")
    table.add_row("Speaker LoRA", f"r={speaker.lora.r} alpha={speaker.lora.alpha} on "
                  f"{', '.join(speaker.lora.target_modules)}; bf16={speaker.bf16}, vLLM={speaker.use_vllm}")
    if c.stage2 is not None:
        episodes, speaker_model = c.stage2.episodes, c.stage2.speaker.model if c.stage2.speaker else "Stage 1 adapter"
        table.add_row("stage 2", f"Director {c.stage2.director.model}, Speaker {speaker_model}, user "
                      f"{c.stage2.user.model}; blocks of {episodes.block_turns} turns, {episodes.branches} branches, "
                      f"margin {c.stage2.margin:g}, judges: {', '.join(j.label for j in c.stage2.judges)}")
        group, director = c.train.group_rm, c.train.director
        table.add_row("group RM", f"{group.model}, {group.epochs:g} epoch(s), lr {group.learning_rate:g}")
        table.add_row("Director", f"GRPO on {director.model}, {director.max_steps} steps, {director.num_generations} "
                      f"completions per prompt, lr {director.learning_rate:g}"
                      + (f"; DPO alternative on {c.train.director_dpo.model}" if c.train.director_dpo else ""))
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
        fail("pass either --config or --source with --path")
    corpus = load(config).data.corpus if config is not None else None
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


@data_app.command("fetch")
def data_fetch(config: ConfigOption):
    """Download every corpus the config names (release files) into the folders it names, checked and resumable.

    Each file is checked against its size and SHA-256: the publisher's where one is published, else
    the ones the first fetch recorded in mascot-data.lock.json beside the data. A download that stops
    keeps its .partial and the next fetch resumes it; a file that fails its check is moved to
    .rejected. Corpora read from the Hugging Face Hub need no fetch. MASCOT_DATA_URL_<SOURCE> (for
    example MASCOT_DATA_URL_ESCONV) replaces a corpus's base URL with a mirror's.
    """
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    from mascot.data.fetch import FetchError, fetch_corpus
    from mascot.data.sources import corpus_route

    run = _load_for_fetch(config)
    corpora = [run.data.corpus, *run.data.held_out]
    seen: set[tuple[str, str]] = set()
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  console=console, transient=True) as progress:
        tasks: dict = {}

        def on_progress(path, done, total):
            if path not in tasks:
                tasks[path] = progress.add_task(path.name.removesuffix(".partial"), total=total)
            progress.update(tasks[path], completed=done, total=total)

        for corpus in corpora:
            if corpus.hub_name is not None or (corpus.source, str(corpus.path)) in seen:
                if corpus.hub_name is not None:
                    console.print(Text(f"{corpus_route(corpus)}: nothing to fetch"))
                continue
            seen.add((corpus.source, str(corpus.path)))
            try:
                fetched = fetch_corpus(corpus, on_progress=on_progress)
            except FetchError as exc:
                fail(exc, code=1)
            for item in fetched:
                console.print(Text(f"{item.action:>10}  {item.path}  {item.size} bytes  sha256 {item.sha256[:16]}... "
                                   f"(checked against: {item.checked_against})"), soft_wrap=True)


def _load_for_fetch(config: Path) -> RunConfig:
    """The config, checked as `validate` does except for the corpora that this command is about to download."""
    from mascot.chat.safety import load_rules
    from mascot.config import load_config
    from mascot.judges.panel import judge_rubric_problem

    try:
        return load_config(config, rubric_problem=judge_rubric_problem, safety_rules=load_rules, check_corpora=False)
    except ConfigError as exc:
        fail(f"{config} is not valid\n{exc}")


@models_app.command("build")
def models_build(config: ConfigOption):
    """Build (or find in the cache) the tiny offline models a config refers to, and print their folders."""
    from mascot.train.tiny import build_tiny_models

    run = load(config)
    if run.tiny is None:
        console.print("this config uses no tiny models; nothing to build")
        return
    models = build_tiny_models(run.tiny, run.cache.root)
    console.print(f"tiny:lm  {models.lm}\ntiny:rm  {models.rm}", highlight=False)


@app.command("init")
def init(
    folder: Annotated[Path, typer.Argument(help="The folder to set up; its configs/ gets the shipped files.")],
    force: Annotated[bool, typer.Option(help="Replace files that are already there.")] = False,
):
    """Copy the shipped profiles (tiny and paper, for both domains), rosters, rubrics and user profiles to FOLDER/configs.

    For an installed package, which has no checkout's configs/: then `mascot run pipeline --config
    FOLDER/configs/tiny.yaml` runs offline and writes FOLDER/runs/.
    """
    shipped = Path(mascot.__file__).parent / "profiles"
    target = folder / "configs"
    files = sorted(path.relative_to(shipped) for path in shipped.rglob("*.yaml"))
    there = [str(name) for name in files if (target / name).exists()]
    if there and not force:
        fail(f"{target} already has {len(there)} of the shipped files ({', '.join(there[:3])}"
             f"{', ...' if len(there) > 3 else ''}); pass --force to replace them")
    for name in files:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shipped / name, target / name)
    console.print(f"[green]{len(files)} files[/green] in {target}: "
                  f"{', '.join(sorted(str(n) for n in files if n.parent == Path('.')))} and rosters/, rubrics/, users/",
                  highlight=False, soft_wrap=True)
    console.print(f"next: mascot config validate {target / 'tiny.yaml'} && mascot run pipeline --config "
                  f"{target / 'tiny.yaml'}", highlight=False, soft_wrap=True)


@app.command("sample")
def sample(
    config: ConfigOption,
    contexts: Annotated[int, typer.Option(help="How many contexts to sample for.")] = 3,
    k: Annotated[int | None, typer.Option(help="Candidates per query (default: stage1.k).")] = None,
    persona: Annotated[list[str] | None, typer.Option(help="Persona id(s); default: all enabled.")] = None,
):
    """Sample K candidate replies per (context, persona) with the configured backend and print them."""
    from mascot.data import load_corpus
    from mascot.llm import BackendError, RequestCache, make_backend
    from mascot.queries import build_queries
    from mascot.roster import load_roster
    from mascot.stage1.candidates import sample_candidates
    from mascot.train.tiny import resolve_tiny_models

    run = load(config)
    roster = load_roster(run.data.roster)
    try:
        personas = [roster.get(p) for p in persona] if persona else roster.active
    except KeyError as exc:
        fail(exc.args[0])
    with _corpus_errors():
        picked = load_corpus(run.data.corpus, limit=contexts, seed=run.run.seed)
    cache = RequestCache(run.cache.requests)
    backend = make_backend(resolve_tiny_models(run, trainers=False, stage2=False).generation, cache=cache)
    queries = build_queries(picked, personas)
    k = k or run.stage1.k
    with console.status(f"sampling {len(queries)} queries x {k} candidates"):
        try:
            results = asyncio.run(sample_candidates(backend, queries, k, run.generation.params, run.run.seed))
        except BackendError as exc:
            fail(exc, code=1)
    for result in results:
        last = result.query.context.history[-1]
        body = f"[dim]{escape(last.name or last.role)}: {escape(last.content)}[/dim]\n" + "\n".join(
            f"[bold]{i}[/bold]. {escape(text) or '[dim](empty)[/dim]'}" for i, text in enumerate(result.texts, 1))
        title = Text(f"{result.query.persona.name} | {result.query.context.id}")
        console.print(Panel(body, title=title, title_align="left"))
    stats = cache.stats()
    console.print(f"request cache {cache.path}: {stats.hits} hits, {stats.misses} misses", highlight=False,
                  soft_wrap=True)


if __name__ == "__main__":
    app()
