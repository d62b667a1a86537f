"""What every command shares: the consoles, failing with a clean message, loading a config."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.text import Text

from mascot.config import RunConfig, load_config
from mascot.redaction import redact_text
from mascot.yamlio import ConfigError

console = Console(emoji=False)  # corpus ids such as "ed:train:..." must not turn into emoji
errors = Console(stderr=True, soft_wrap=True, emoji=False)  # never wrap error lines: they are grepped and copied

ConfigOption = Annotated[Path, typer.Option("--config", "-c", help="Run config YAML, e.g. configs/tiny.yaml.")]


def fail(message: object, code: int = 2) -> NoReturn:
    """Print one error (secrets masked) and exit: 2 for bad input, 1 for a failure while running."""
    errors.print(Text(redact_text(str(message)), style="red"))
    raise typer.Exit(code)


def load(config: Path, *, check_machine: bool = False) -> RunConfig:
    # Imported here, not at the top: the judges bring polars and jinja2, which `--help` does not need.
    from mascot.chat.safety import load_rules
    from mascot.judges.panel import judge_rubric_problem

    try:
        return load_config(config, check_machine=check_machine, rubric_problem=judge_rubric_problem,
                           safety_rules=load_rules)
    except ConfigError as exc:
        fail(f"{config} is not valid\n{exc}")


