"""A cache key that covers the library code a step runs.

A task's own source is not enough for its cache key: editing `mascot/stage1/pairs.py` must re-run
the pairs step and everything after it, while an edit to code a step never runs must leave that
step cached. `code_fingerprint(fn, *values)` hashes the source of every `mascot` module that `fn`
can run: the modules its code names, the modules of its parameter values' types, and everything
those import, by the package's static import graph (compiled, never imported: the import statements are
read from the bytecode, as `modulefinder` does, because CPython 3.11's `ast` module fails when two threads
build syntax trees at once, and a flow run's threads and libraries do).

The granularity is the module: an edit anywhere in a module that a step imports re-runs the step.
It is conservative by design. Lazy imports inside functions and `if TYPE_CHECKING` imports count,
so a key may change when the code that runs did not, but never stays the same when it changed.
"""

from __future__ import annotations

import dis
import functools
import hashlib
import inspect
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import CodeType, ModuleType

import mascot

PACKAGE = "mascot"


def code_fingerprint(fn: Callable, *values: object) -> str:
    """sha256 hex of the source of every `mascot` module that `fn` can run: the modules its code
    names, the modules of the types of `values` (the task's parameters), and all they import."""
    return _fingerprint(_start_modules(fn, values), Path(mascot.__file__).resolve().parent)


def modules_run_by(fn: Callable, *values: object) -> list[str]:
    """Sorted module names (e.g. 'mascot.stage1.pairs') that code_fingerprint covers."""
    return sorted(_closure(_start_modules(fn, values), Path(mascot.__file__).resolve().parent))


def _in_package(name: object) -> bool:
    return isinstance(name, str) and (name == PACKAGE or name.startswith(PACKAGE + "."))


def _names(code: CodeType) -> set[str]:
    """The global and attribute names in `code` and in the lambdas, comprehensions and defs inside it."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, CodeType):
            names |= _names(const)
    return names


def _start_modules(fn: Callable, values: Iterable[object]) -> frozenset[str]:
    fn = inspect.unwrap(getattr(fn, "__func__", fn))
    names = _names(fn.__code__)
    found = {fn.__module__} if _in_package(fn.__module__) else set()
    pending = [fn.__globals__[name] for name in names if name in fn.__globals__]
    followed: set[str] = set()
    while pending:
        value = pending.pop()
        if isinstance(value, ModuleType):
            if _in_package(value.__name__) and value.__name__ not in followed:
                found.add(value.__name__)
                followed.add(value.__name__)
                # `mascot.stage1.pairs.f()` names the global `mascot` only, so follow the attributes
                # the code names. `vars`, not `getattr`: a module `__getattr__` may import a backend.
                pending += [vars(value)[name] for name in names if name in vars(value)]
        elif callable(value) and _in_package(getattr(value, "__module__", None)):
            found.add(value.__module__)
    for value in values:
        items = [value, *value] if isinstance(value, list | tuple) else [value]
        found |= {type(item).__module__ for item in items if _in_package(type(item).__module__)}
    return frozenset(found)


_graph_lock = threading.Lock()


def _import_graph(root: Path) -> dict[str, tuple[Path, frozenset[str]]]:
    """Module name -> (its .py file, `__init__.py` for a package; the package modules it imports)."""
    with _graph_lock:  # a flow's shard tasks all start at once: parse the package once, not once per thread
        return _parse_import_graph(root)


@functools.cache
def _parse_import_graph(root: Path) -> dict[str, tuple[Path, frozenset[str]]]:
    files = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return {name: (path, frozenset(_imports(name, path, files))) for name, path in files.items()}


def _with_parents(name: str) -> set[str]:
    # Importing a.b.c runs a/__init__.py and a/b/__init__.py first.
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}


def _imports(name: str, path: Path, files: dict[str, Path]) -> set[str]:
    """Every package module that `name` imports, wherever the import statement is."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = _with_parents(name) - {name}
    for base, level, names in _import_statements(compile(path.read_bytes(), str(path), "exec", dont_inherit=True)):
        if level:  # relative: `from ..x import y` in module a.b.c is `from a.x import y`
            anchor = package.rsplit(".", level - 1)[0]
            base = f"{anchor}.{base}" if base else anchor
        # `import a.b` runs a and a.b; `from a import b` imports the module a.b when there is one, else a name from a.
        targets |= _with_parents(base) | {f"{base}.{alias}" for alias in names or ()}
    return targets & files.keys()


def _import_statements(code: CodeType) -> Iterator[tuple[str, int, tuple[str, ...] | None]]:
    """(module, level, imported names) of every import statement in `code` and the code inside it. Each is
    LOAD_CONST level, LOAD_CONST names, IMPORT_NAME module."""
    constants: list = []
    for instruction in dis.get_instructions(code):
        if instruction.opname == "LOAD_CONST":
            constants.append(instruction.argval)
        elif instruction.opname == "IMPORT_NAME":
            yield instruction.argval, constants[-2], constants[-1]
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            yield from _import_statements(constant)


@functools.cache
def _closure(start: frozenset[str], root: Path) -> frozenset[str]:
    graph = _import_graph(root)
    if missing := sorted(start - graph.keys()):
        raise ValueError(f"code_hash: no source file under {root} for module(s) {missing}")
    found, pending = set(start), list(start)
    while pending:
        for module in graph[pending.pop()][1] - found:
            found.add(module)
            pending.append(module)
    return frozenset(found)


@functools.cache
def _source_sha256(path: Path) -> str:
    """A plain module's file; for a package, `__init__.py` and the data files beside it (templates).

    Cached for the process: it runs the code it imported at start, so later edits belong to the next run.
    """
    if path.name != "__init__.py":
        return hashlib.sha256(path.read_bytes()).hexdigest()
    data = [file for file in path.parent.iterdir() if file.is_file() and file.suffix != ".py"]
    files = sorted([path, *(file for file in data if not file.name.startswith("."))], key=lambda f: f.name)
    lines = "".join(f"{file.name}\0{hashlib.sha256(file.read_bytes()).hexdigest()}\n" for file in files)
    return hashlib.sha256(lines.encode()).hexdigest()


def _fingerprint(start: frozenset[str], root: Path) -> str:
    graph = _import_graph(root)
    lines = "".join(f"{name}\0{_source_sha256(graph[name][0])}\n" for name in sorted(_closure(start, root)))
    return hashlib.sha256(lines.encode()).hexdigest()
