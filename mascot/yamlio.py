"""YAML loading with errors that point at the file, the line and the YAML path.

Every YAML file the project reads (run configs, rosters, rubrics, user profiles) goes through
`load_validated`, so a typo anywhere is reported the same way: where it is, what was found and
what was expected. A rule that spans fields raises `FieldError` naming the field it blames, so
that its problem points at that field's line rather than at the whole section. Values shown in
messages pass through `mascot.redaction`, so a pasted key never reaches a terminal or a log.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from mascot.redaction import redact

M = TypeVar("M", bound=BaseModel)
Loc = tuple[str | int, ...]


@dataclass(frozen=True)
class Problem:
    file: str
    line: int | None
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.path or '<top level>'}: {self.message}"


class FieldError(ValueError):
    """Raised by a model validator to blame one field (a path below the model) for a broken rule."""

    def __init__(self, loc: str | int | Loc, message: str):
        super().__init__(message)
        self.loc: Loc = loc if isinstance(loc, tuple) else (loc,)


def require_unique_ids(field: str, ids: list[str], noun: str) -> None:
    """Blame the first repeated id of a list of records (`<field>[i].id`)."""
    for index, item in enumerate(ids):
        if item in ids[:index]:
            raise FieldError((field, index, "id"), f"{noun} ids must be unique; '{item}' repeats")


class ConfigError(ValueError):
    """One or more problems in YAML files. `str()` lists every one of them."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        noun = "problem" if len(problems) == 1 else "problems"
        super().__init__(f"{len(problems)} {noun}:\n" + "\n".join(f"  {p}" for p in problems))


def read_yaml(path: str | Path) -> tuple[Any, yaml.Node | None]:
    """Parse a YAML file into Python data plus its node tree (for line numbers)."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError([Problem(str(path), None, "", "is a folder; expected a YAML file")])
    if not path.is_file():
        raise ConfigError([Problem(str(path), None, "", "file not found")])
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        problem = f"not UTF-8 text (byte {exc.start}); expected a YAML file"
        raise ConfigError([Problem(str(path), None, "", problem)]) from None
    except OSError as exc:
        raise ConfigError([Problem(str(path), None, "", f"cannot be read: {exc.strerror}")]) from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else None
        reason = getattr(exc, "problem", None) or str(exc)
        raise ConfigError([Problem(str(path), line, "", f"invalid YAML: {reason}")]) from None
    if node is not None:
        duplicates = list(_duplicate_keys(node, ()))
        if duplicates:
            raise ConfigError([Problem(str(path), line, _dotted(loc), "key appears more than once")
                               for loc, line in duplicates])
    return data, node


@dataclass(frozen=True)
class YamlDocument:
    """A parsed YAML file: its data, and its node tree for telling the line of any YAML path."""

    path: Path
    data: Any
    node: yaml.Node | None

    @classmethod
    def read(cls, path: str | Path) -> YamlDocument:
        data, node = read_yaml(path)
        return cls(Path(path), data, node)

    def line_of(self, loc: Loc) -> int | None:
        return _line_of(self.node, loc)

    def problem(self, loc: Loc, message: str) -> Problem:
        return Problem(str(self.path), self.line_of(loc), _dotted(loc), message)


def load_validated(path: str | Path, model: type[M], context: dict[str, Any] | None = None) -> M:
    """Read `path` and validate it as `model`, raising ConfigError with every problem found."""
    return validate_document(YamlDocument.read(path), model, context)


def validate_document(document: YamlDocument, model: type[M], context: dict[str, Any] | None = None) -> M:
    path, data = document.path, document.data
    if data is None:
        raise ConfigError([Problem(str(path), None, "", f"file is empty; expected a {model.__name__} mapping")])
    if not isinstance(data, dict):
        raise ConfigError([Problem(str(path), 1, "", f"expected a mapping at the top, got {_kind(data)}")])
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        raise ConfigError([_problem(document, err, model) for err in exc.errors()]) from None


def _problem(document: YamlDocument, err: dict, model: type[BaseModel]) -> Problem:
    loc = tuple(part for part in err["loc"] if not _is_internal_loc(part))
    kind, message, found = err["type"], err["msg"], err.get("input")
    blamed = err.get("ctx", {}).get("error")
    if isinstance(blamed, FieldError):  # a cross-field rule that names the field it blames
        loc = (*loc, *blamed.loc)
        found = _value_at(document.data, loc)
        message = str(blamed)
    if kind == "missing":
        message = "missing required field"
    elif kind == "extra_forbidden":
        known = _field_names(model, loc[:-1])
        guess = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f"did you mean '{guess[0]}'? " if guess else ""
        message = f"unknown field; {hint}expected one of: {', '.join(sorted(known))}"
    elif kind == "model_type" or kind == "dict_type":
        message = f"expected a mapping (a YAML section); got {_kind(found)}"
    else:
        message = re.sub(r" or instance of \w+", "", message)
        message = message.replace("Input should be", "expected").replace("Value error, ", "")
        if kind in ("int_type", "float_type", "bool_type") and isinstance(found, str):
            message += " (a quoted value is a string: remove the quotes)"
        if not (kind == "value_error" and isinstance(found, dict | list)):  # a section's rule: no dump
            message = f"{message}; got {_short(found, loc[-1] if loc else None)}"
    return Problem(str(document.path), document.line_of(loc), _dotted(loc), message)


def _value_at(data: Any, loc: Loc) -> Any:
    for part in loc:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def _is_internal_loc(part: Any) -> bool:
    # Tagged unions add the tag value to `loc`; it is not part of the YAML path.
    return isinstance(part, str) and part.startswith(("function-", "tagged-union"))


def _field_names(model: type[BaseModel], loc: tuple) -> list[str]:
    """Field names of the sub-model at `loc`, for 'did you mean' hints."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return []
        current = _model_in(field.annotation)
    return list(getattr(current, "model_fields", {}))


def _model_in(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _line_of(node: yaml.Node | None, loc: tuple) -> int | None:
    """1-based line of the deepest node along `loc` that exists in the file."""
    if node is None:
        return None
    line = node.start_mark.line + 1
    for part in loc:
        child = None
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if key.value == str(part):
                    child = key if part == loc[-1] and not isinstance(value, yaml.CollectionNode) else value
                    break
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            child = node.value[part]
        if child is None:
            break
        node, line = child, child.start_mark.line + 1
    return line


def _duplicate_keys(node: yaml.Node, loc: tuple):
    if isinstance(node, yaml.MappingNode):
        seen = set()
        for key, value in node.value:
            if key.value in seen:
                yield (*loc, key.value), key.start_mark.line + 1
            seen.add(key.value)
            yield from _duplicate_keys(value, (*loc, key.value))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            yield from _duplicate_keys(item, (*loc, i))


def _dotted(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return "null" if value is None else type(value).__name__


def _short(value: Any, field: str | int | None = None, limit: int = 60) -> str:
    """A found value as shown in a message: scalars in full (secrets masked), never a section's dump."""
    if isinstance(value, dict | list):
        return _kind(value)
    text = repr(redact(value, str(field)))
    return text if len(text) <= limit else text[: limit - 3] + "..."
