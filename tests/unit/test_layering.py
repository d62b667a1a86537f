"""The layering rules of docs/architecture.md, checked on the import graph of `mascot/`.

Every import statement counts, wherever it is: at module level, inside a function (a lazy import),
or under `if TYPE_CHECKING`. Importing `a.b.c` also runs the packages `a.b` and `a`, so those are
edges too, except the importer's own packages, which are running already.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ORCHESTRATION = ("prefect", "flows", "tasks", "cli")


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in (REPO / "mascot").rglob("*.py")}


def _imported(module: str) -> set[str]:
    """Every module this one names in an import statement, anywhere in it."""
    names = set()
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from a import b` imports the module a.b when there is one, else a name from a.
            names |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module
                      for a in node.names}
    return names


def _graph() -> dict[str, set[str]]:
    graph = {}
    for module in MODULES:
        own = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
        edges = set()
        for name in _imported(module):
            parts = name.split(".")
            for i in range(2, len(parts) + 1):  # the package chain, without the trivial root `mascot`
                target = ".".join(parts[:i])
                if target in MODULES and (target == name or target not in own):
                    edges.add(target)
        graph[module] = edges - {module}
    return graph


GRAPH = _graph()


def _depends(prefix: str, on: tuple[str, ...]) -> list[str]:
    """`module -> target` for each module under `prefix` that imports a module under any of `on`."""
    return sorted(f"{m} -> {t}" for m, targets in GRAPH.items() if m == prefix or m.startswith(prefix + ".")
                  for t in targets if any(t == o or t.startswith(o + ".") for o in on))


def test_the_graph_is_read():
    assert len(MODULES) > 40 and "mascot.config.run" in MODULES and "mascot.stage1.judging" in MODULES
    assert "mascot.config.base" in GRAPH["mascot.config.run"] and "mascot.config" in GRAPH["mascot.judges.panel"]


def test_the_library_imports_no_prefect_flows_tasks_or_cli():
    leaks = sorted(f"{m} imports {name}" for m in MODULES for name in _imported(m)
                   if name.split(".")[0] in ORCHESTRATION)
    assert not leaks, leaks


def test_importing_every_library_module_loads_no_orchestration():
    # From outside: a fresh interpreter imports all of mascot/ and reports what got loaded.
    code = ("import importlib, sys\n"
            f"for name in {sorted(MODULES)!r}: importlib.import_module(name)\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({ORCHESTRATION!r})))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


def test_the_import_graph_has_no_loop():
    index, low, on_stack, stack, loops, counter = {}, {}, set(), [], [], [0]

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for target in GRAPH[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                loops.append(sorted(component))

    for module in sorted(GRAPH):
        if module not in index:
            visit(module)
    assert not loops, loops


def test_configs_sit_at_the_bottom():
    allowed = ("mascot.config", "mascot.yamlio", "mascot.redaction", "mascot.roster", "mascot.rubrics")
    imported = {t for m, targets in GRAPH.items() if m.startswith("mascot.config") for t in targets}
    assert {t for t in imported if not t.startswith(allowed)} == set()


def test_training_and_evaluation_do_not_import_each_other():
    assert _depends("mascot.train", ("mascot.evaluation",)) == []
    assert _depends("mascot.evaluation", ("mascot.train",)) == []


def test_stage_neutral_code_imports_no_stage():
    # The known-optimum checks sit above the stages: they build a stage's world with its own steps.
    stages, above = ("mascot.stage1", "mascot.stage2"), ("mascot.known_optima",)
    leaks = sorted(f"{m} -> {t}" for m, targets in GRAPH.items() if not m.startswith(stages + above)
                   for t in targets if t.startswith(stages))
    assert leaks == []


def test_nothing_in_the_library_imports_the_known_optimum_checks():
    assert [dependency for dependency in _depends("mascot", ("mascot.known_optima",))
            if not dependency.startswith("mascot.known_optima")] == []
