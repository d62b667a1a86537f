"""The "Every field" table of docs/configuration.md, generated from `RunConfig`.

    python -m mascot.config.docs > table.md

A test checks that the docs hold exactly this table, so a new field cannot go undocumented.
"""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from mascot.config.run import RunConfig

HEADER = ["| YAML path | Type | Default | Meaning |", "|---|---|---|---|"]


def _section(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside an annotation such as `X`, `X | None` or `list[X]`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in typing.get_args(annotation):
        found = _section(argument)
        if found is not None:
            return found
    return None


def _type_name(annotation: Any) -> str:
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in arguments)
    if origin in (typing.Union, types.UnionType):
        names = [_type_name(a) for a in arguments if a is not type(None)]
        return " or ".join(names) + (" or null" if type(None) in arguments else "")
    if origin is typing.Annotated:
        return _type_name(arguments[0])
    if origin is not None:
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in arguments)}]"
    if annotation is Any:
        return "Any"
    return "Path" if annotation is Path else getattr(annotation, "__name__", str(annotation))


def _default(field) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default
    if value is None:
        return "null"
    if isinstance(value, BaseModel):
        return "see below"
    return str(value) if isinstance(value, Path) else repr(value)


def field_rows(model: type[BaseModel], prefix: str = "") -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        section = _section(field.annotation)
        if section is not None:
            is_list = typing.get_origin(field.annotation) is list
            rows += field_rows(section, f"{path}[]." if is_list else f"{path}.")
            continue
        meaning = (field.description or "").replace("|", "\\|")
        rows.append(f"| `{path}` | {_type_name(field.annotation)} | {_default(field)} | {meaning} |")
    return rows


def field_table() -> str:
    return "\n".join([*HEADER, *field_rows(RunConfig)]) + "\n"


if __name__ == "__main__":
    print(field_table(), end="")
