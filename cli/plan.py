"""`mascot plan --config C`: what a run will ask for and cost, printed before it runs (`mascot.plan`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from cli.common import ConfigOption, console, fail


def plan(config: ConfigOption,
         gpu_memory_gb: Annotated[float, typer.Option(help="Memory of one training GPU, in GB (80: an H100; 141: "
                                                      "an H200), for the colocated vLLM's share.")] = 80.0):
    """Print the requests per backend and their tokens, the API judges' cost at the config's list prices
    (plan.prices), the training steps, GPU-hours per stage (guessed rates unless plan.rates names measured ones)
    and each training step's peak memory per GPU, counted on the meta device. Reads no corpus and downloads
    nothing; the contexts are data.corpus.limit, and the evaluation's out-of-domain ones data.held_out's limits."""
    from mascot import plan as planning
    from mascot.config import RunConfig
    from mascot.roster import load_roster
    from mascot.yamlio import ConfigError, YamlDocument, validate_document

    try:
        document = YamlDocument.read(config)
        loaded = validate_document(document, RunConfig, context={"base_dir": Path(config).resolve().parent})
        personas = len(load_roster(loaded.data.roster).active)
        counts = planning.counts(loaded, personas)
        rates = planning.load_rates(loaded.plan.rates)
    except (ConfigError, planning.PlanError) as exc:
        fail(f"{config}: cannot plan: {exc}")
    except (OSError, ValueError) as exc:
        fail(f"{config}: plan.rates {loaded.plan.rates} is not a JSON object of numbers: {exc}")
    work = planning.requests(loaded, counts, rates)
    steps = planning.training(loaded, counts)
    console.print(f"[bold]{config}[/bold]: {counts.contexts:,} contexts ({counts.held_out:,} held out) x "
                  f"{counts.personas} personas", highlight=False)
    if loaded.eval is not None:
        console.print(f"The evaluation: {len(loaded.eval.systems)} systems x {counts.evaluated:,} contexts "
                      f"({counts.held_out:,} held out, {counts.out_of_domain:,} of data.held_out) x "
                      f"{len(loaded.eval.seeds)} seeds; {loaded.eval.training_seeds} training run(s) of the "
                      "GRPO Speaker and Director (eval.training_seeds)", highlight=False)
    console.print(_requests_table(work))
    console.print(_costs_table(planning.api_costs_by_stage(work, loaded.plan.prices)))
    console.print(_training_table(steps))
    console.print(_hours_table(planning.gpu_hours(work, steps, rates), planning.served_hours(work, rates),
                               planning.training_hours(steps, rates), loaded.plan.rates))
    console.print(_memory_table(planning.memory(loaded, gpu_memory_gb * 1e9), gpu_memory_gb))
    console.print("Not counted: MASCOT with the DPO Director unless eval.systems lists it, and the requests a judge "
                  "or the Director repeats after an unusable reply. Counted though the request cache answers them: "
                  "the evaluation's repeated requests (MASCOT-P's and MASCOT-C's first directives are MASCOT's).",
                  highlight=False)


def _requests_table(work) -> Table:
    table = Table(title="Requests", title_justify="left")
    for column in ("stage", "step", "backend", "requests", "completions", "prompt tokens (est.)",
                   "completion tokens (max)"):
        table.add_column(column, justify="right" if column[0] in "rcp" and column != "stage" else "left")
    for item in work:
        table.add_row(item.stage, item.step, item.backend, f"{item.requests:,}", f"{item.completions:,}",
                      f"{item.prompt_tokens:,}", f"{item.max_output_tokens:,}")
    return table


def _costs_table(costs: dict) -> Table:
    console.print("API cost at list price (completions at their max_new_tokens: an upper bound)", highlight=False)
    table = Table()
    table.add_column("stage")
    table.add_column("model")
    table.add_column("USD", justify="right")
    for stage, models in costs.items():
        for model, cost in models.items():
            table.add_row(stage, model, "no price in plan.prices" if cost is None else f"{cost:,.0f}")
    if not costs:
        table.add_row("all", "no API model", "0")
    priced = [cost for models in costs.values() for cost in models.values() if cost is not None]
    if len(priced) > 1:
        table.add_row("all", "priced models", f"{sum(priced):,.0f}")
    return table


def _training_table(steps) -> Table:
    table = Table(title="Training steps", title_justify="left")
    for column in ("stage", "trainer", "steps", "processes", "runs"):
        table.add_column(column)
    for step in steps:
        table.add_row(step.stage, step.name, f"{'at most ' if step.upper_bound else ''}{step.steps:,}",
                      str(step.processes), str(step.runs))
    return table


def _hours_table(hours: dict, served: dict, training: dict, measured) -> Table:
    source = f"rates measured in {measured}" if measured else "guessed rates (mascot.plan.GUESSED_RATES)"
    console.print(f"Hours, from {source}. A stage cannot end before its busiest server has done its work (its requests "
                  "share that server's GPUs, whatever the other GPUs do) nor before its training steps have run one "
                  "after another; every completion counts at its max_new_tokens, and a server of N data-parallel "
                  "replicas divides its hours by N", highlight=False)
    table = Table()
    for column in ("stage", "GPU-hours", "busiest server: hours", "training: hours"):
        table.add_column(column, justify="left" if column.startswith(("stage", "busiest")) else "right")
    for stage, value in hours.items():
        backend, busiest = max(served.get(stage, {}).items(), key=lambda item: item[1], default=(None, 0.0))
        server = f"{backend.split(' ')[0]}: {busiest:,.1f}" if backend else "–"  # the model; its address is above
        table.add_row(stage, f"{value:,.1f}", server, f"{training.get(stage, 0.0):,.1f}")
    return table


def _memory_table(rows, gpu_gb: float) -> Table:
    console.print(f"Peak memory per GPU of each training step, GB (of {gpu_gb:g}); without activations, logits and "
                  "the CUDA context", highlight=False)
    table = Table()
    for column in ("trainer", "trained (+grads, Adam)", "frozen base", "colocated vLLM", "scorers", "total"):
        table.add_column(column, justify="left" if column == "trainer" else "right")
    for row in rows:
        table.add_row(row.name, *(f"{value / 1e9:.1f}" for value in (row.trained_bytes, row.frozen_bytes,
                                                                    row.engine_bytes, row.scorer_bytes, row.total)))
    return table
