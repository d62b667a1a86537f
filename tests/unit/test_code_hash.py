"""Code fingerprints: a step's cache key covers the `mascot` modules it can run, and only those."""

from __future__ import annotations

import shutil
from pathlib import Path

import mascot
import mascot.stage1.pairs
from mascot.artifacts import Artifact
from mascot.prompts import speaker_messages
from mascot.stage1 import candidates
from mascot.stage1.pairs import build_preference_pairs
from tasks.code_hash import _fingerprint, _import_graph, _start_modules, code_fingerprint, modules_run_by

PACKAGE_ROOT = Path(mascot.__file__).resolve().parent
IGNORE = shutil.ignore_patterns("__pycache__")


def uses_pairs(judged):
    return build_preference_pairs(*judged)


def uses_pairs_by_attribute(judged):
    return mascot.stage1.pairs.build_preference_pairs(*judged)


def uses_candidates():
    return [candidates.Candidates for _ in range(1)]  # a comprehension, so a nested code object


def uses_prompts(persona, context):
    return speaker_messages(persona, context)


def uses_nothing(artifact):
    return artifact


def test_a_step_covers_what_it_imports_and_nothing_else():
    covered = modules_run_by(uses_pairs)
    # The pairs step aggregates the panel's scores and renders the speaker prompt; it samples nothing.
    assert {"mascot", "mascot.stage1", "mascot.stage1.pairs", "mascot.judges.panel", "mascot.prompts"} <= set(covered)
    assert "mascot.stage1.candidates" not in covered and "mascot.train.grpo" not in covered
    assert modules_run_by(uses_pairs_by_attribute) == covered
    assert modules_run_by(build_preference_pairs) == covered
    covered = modules_run_by(uses_candidates)
    assert {"mascot.stage1.candidates", "mascot.prompts", "mascot.queries", "mascot.llm"} <= set(covered)
    assert "mascot.stage1.pairs" not in covered and "mascot.train.grpo" not in covered


def test_lazy_imports_inside_functions_are_edges():
    # mascot.llm.factory imports the backends inside `make_backend`, not at module level.
    imports = _import_graph(PACKAGE_ROOT)["mascot.llm.factory"][1]
    assert {"mascot.llm.openai_backend", "mascot.llm.transformers_backend"} <= imports
    assert "mascot.llm.openai_backend" in modules_run_by(uses_candidates)


def test_parameter_values_name_their_types_modules():
    artifact = Artifact(path="x.json", sha256="0" * 64)
    assert modules_run_by(uses_nothing) == []
    assert "mascot.artifacts" in modules_run_by(uses_nothing, artifact)
    assert "mascot.artifacts" in modules_run_by(uses_nothing, [artifact], 3)
    assert code_fingerprint(uses_nothing, artifact) != code_fingerprint(uses_nothing, 3)


def test_a_package_covers_its_templates():
    covered = modules_run_by(uses_prompts)
    assert "mascot.prompts" in covered and "mascot.data.context" in covered
    assert "mascot.stage1.pairs" not in covered


def test_an_edit_changes_the_steps_that_run_the_edited_file_and_no_others(tmp_path):
    def copy_with_edit(name: str, file: str = "", text: str = "") -> Path:
        root = shutil.copytree(PACKAGE_ROOT, tmp_path / name / "mascot", ignore=IGNORE)
        if file:
            with (root / file).open("a") as handle:
                handle.write(text)
        return root

    steps = {fn.__name__: _start_modules(fn, ()) for fn in (uses_pairs, uses_candidates, uses_prompts)}
    original = copy_with_edit("original")
    old = {name: _fingerprint(start, original) for name, start in steps.items()}

    def changed(root: Path) -> set[str]:
        return {name for name, start in steps.items() if _fingerprint(start, root) != old[name]}

    assert changed(copy_with_edit("copy")) == set()  # the package's path is not part of the key
    # candidates.py does not import pairs.py, directly or indirectly, nor pairs.py candidates.py.
    assert changed(copy_with_edit("pairs", "stage1/pairs.py", "# an edit\n")) == {"uses_pairs"}
    assert changed(copy_with_edit("candidates", "stage1/candidates.py", "# an edit\n")) == {"uses_candidates"}
    # A template belongs to its package, mascot.prompts, which both steps import.
    template_edit = copy_with_edit("template", "prompts/speaker.j2", "{# an edit #}\n")
    assert changed(template_edit) == {"uses_prompts", "uses_candidates", "uses_pairs"}


def test_relative_and_type_checking_imports_are_edges(tmp_path):
    # The graph parser works for any package name, so a small one shows the import forms mascot lacks.
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "helpers.py").write_text("")
    (root / "typed.py").write_text("")
    (root / "sub" / "__init__.py").write_text("from .. import helpers\n")
    (root / "sub" / "leaf.py").write_text(
        "from typing import TYPE_CHECKING\nfrom . import sibling\n"
        "if TYPE_CHECKING:\n    from pkg.typed import T\n"
    )
    (root / "sub" / "sibling.py").write_text("import json\n")
    graph = _import_graph(root)
    assert graph["pkg.sub"][1] == {"pkg", "pkg.helpers"}
    assert graph["pkg.sub.leaf"][1] == {"pkg", "pkg.sub", "pkg.sub.sibling", "pkg.typed"}
    assert graph["pkg.sub.sibling"][1] == {"pkg", "pkg.sub"}
