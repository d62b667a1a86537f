"""`mascot config validate` on the shipped configs and on broken configs, rosters and user files."""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from mascot.cli import app
from mascot.config import load_config

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
runner = CliRunner()


def _yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A copy of configs/ so broken variants can sit beside the rosters they refer to."""
    shutil.copytree(CONFIGS, tmp_path / "configs")
    return tmp_path / "configs"


def _write(folder: Path, name: str, data: dict | str) -> Path:
    path = folder / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def _set(data: dict, dotted: str, value) -> dict:
    data = copy.deepcopy(data)
    *parents, last = dotted.split(".")
    node = data
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if value is _DELETE:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return data


_DELETE = object()

# (case id, file that gets broken, mutation: (dotted path, value) or raw text, expected fragments)
BROKEN_CONFIGS = [
    ("k-too-small", "tiny.yaml", ("stage1.k", 0), ["stage1.k", "greater than or equal to 2", "got 0"]),
    ("typo-field", "tiny.yaml", ("stage1.marign", 0.5), ["stage1.marign", "did you mean 'margin'"]),
    ("missing-section", "tiny.yaml", ("models", _DELETE), ["models", "missing required field"]),
    ("bad-backend-kind", "tiny.yaml", ("generation.kind", "vllm"), ["generation.kind", "'openai', 'anthropic' or 'google'",
                                                                    "got 'vllm'"]),
    ("temperature-not-number", "tiny.yaml", ("generation.params.temperature", "hot"),
     ["generation.params.temperature", "valid number", "got 'hot'"]),
    ("url-without-scheme", "paper.yaml", ("generation.base_url", "localhost:8000/v1"),
     ["generation.base_url", "http:// or https:// URL", "got 'localhost:8000/v1'"]),
    ("path-and-hub", "tiny.yaml", ("data.corpus.hub_name", "facebook/empathetic_dialogues"),
     ["data.corpus", "exactly one of 'path'"]),
    ("corpus-wrong-domain", "tiny.yaml", ("data.corpus.source", "qmsum"), ["belongs to domain 'meetings'"]),
    ("unknown-tiny-model", "tiny.yaml", ("models.speaker", "tiny:huge"), ["unknown tiny model 'tiny:huge'"]),
    ("tiny-section-missing", "tiny.yaml", ("tiny", _DELETE), ["a 'tiny' section is required"]),
    ("heads-do-not-divide", "tiny.yaml", ("tiny.num_attention_heads", 3),
     ["tiny", "hidden_size must be divisible by num_attention_heads"]),
    ("llm-judge-without-backend", "tiny.yaml", ("stage1.judges", [{"kind": "llm"}]),
     ["stage1.judges[0]", "needs 'backend'"]),
    ("duplicate-judge-names", "tiny.yaml", ("stage1.judges", [{"kind": "heuristic"}, {"kind": "heuristic"}]),
     ["stage1: judge names must be unique"]),
    ("rubric-wrong-domain", "tiny.yaml", ("stage1.rubric", "rubrics/meetings.yaml"),
     ["rubric is for 'meetings'"]),
    ("no-judges", "tiny.yaml", ("stage1.judges", []), ["stage1.judges", "at least 1 item"]),
    ("lora-rank-text", "paper.yaml", ("train.lora.r", "sixteen"), ["train.lora.r", "valid integer", "got 'sixteen'"]),
    ("corpus-path-missing", "tiny.yaml", ("data.corpus.path", "no/such/corpus.csv"),
     ["data.corpus.path", "no such file or folder"]),
    ("roster-file-missing", "tiny.yaml", ("data.roster", "rosters/nope.yaml"), ["nope.yaml", "file not found"]),
    ("roster-wrong-domain", "tiny.yaml", ("data.roster", "rosters/meetings.yaml"),
     ["roster is for 'meetings'", "data.domain is 'emotional_support'"]),
    ("bad-run-name", "tiny.yaml", ("run.name", "my run!"), ["run.name", "should match pattern"]),
    ("grpo-groups-do-not-fit", "tiny.yaml", ("train.speaker.num_generations", 3),
     ["train.speaker", "(8) must be divisible by num_generations (3)"]),
    ("conciseness-band-inverted", "tiny.yaml", ("train.speaker.min_words", 50),
     ["train.speaker", "min_words (50) must not exceed max_words (40)"]),
    ("held-out-fraction-one", "tiny.yaml", ("train.held_out_fraction", 1.0),
     ["train.held_out_fraction", "less than 1", "got 1.0"]),
    ("reward-weight-typo", "paper.yaml", ("train.speaker", {"reward_weights": {"persona": 1.0}}),
     ["train.speaker.reward_weights.persona", "did you mean 'persona_rm'"]),
    ("rm-learning-rate-zero", "tiny.yaml", ("train.persona_rm.learning_rate", 0),
     ["train.persona_rm.learning_rate", "greater than 0"]),
]

BROKEN_TEXT = [
    ("invalid-yaml", "run:\n  name: x\n   seed: 1\n", ["broken.yaml:3", "invalid YAML"]),
    ("duplicate-key", "run:\n  name: x\n  name: y\n", ["broken.yaml:3", "run.name", "more than once"]),
    ("empty-file", "", ["file is empty"]),
    ("top-level-list", "- a\n- b\n", ["expected a mapping at the top"]),
]

ROSTER = CONFIGS / "rosters" / "emotional_support.yaml"
BROKEN_ROSTERS = [
    ("duplicate-ids", ("personas.1.id", "anchor"), ["persona ids must be unique", "anchor"]),
    ("missing-style-rules", ("personas.1.style_rules", _DELETE), ["personas[1].style_rules", "missing required field"]),
    ("empty-must-not", ("personas.0.must_not", []), ["personas[0].must_not", "at least 1 item"]),
    ("id-not-slug", ("personas.2.id", "The Beacon"), ["personas[2].id", "should match pattern", "got 'The Beacon'"]),
    ("blank-name", ("personas.0.name", "   "), ["personas[0].name", "at least 1 character"]),
    ("none-enabled", ("personas", [{**_yaml(ROSTER)["personas"][3], "enabled": False}]),
     ["at least one persona must be enabled"]),
    ("unknown-domain", ("domain", "therapy"), ["domain", "'emotional_support' or 'meetings'", "got 'therapy'"]),
    ("typo-in-persona", ("personas.0.descripton", "x"), ["personas[0].descripton", "did you mean 'description'"]),
]

USERS = CONFIGS / "users" / "big_five.yaml"
BROKEN_USERS = [
    ("trait-out-of-range", ("profiles.0.big_five.neuroticism", 1.5),
     ["profiles[0].big_five.neuroticism", "less than or equal to 1", "got 1.5"]),
    ("missing-trait", ("profiles.1.big_five.openness", _DELETE), ["profiles[1].big_five.openness", "missing"]),
    ("no-domains", ("profiles.2.domains", []), ["profiles[2].domains", "at least 1 item"]),
]


def _check(path: Path, fragments: list[str]) -> None:
    result = runner.invoke(app, ["config", "validate", str(path)])
    assert result.exit_code == 2, result.output
    for fragment in fragments:
        assert fragment in result.output, f"{fragment!r} not in:\n{result.output}"


def test_tiny_config_is_valid():
    result = runner.invoke(app, ["config", "validate", str(CONFIGS / "tiny.yaml")])
    assert result.exit_code == 0, result.output
    assert "ok" in result.output and "K=4" in result.output


def test_paper_config_is_valid_once_esconv_is_downloaded(workdir):
    result = runner.invoke(app, ["config", "validate", str(workdir / "paper.yaml")])
    assert result.exit_code == 2 and "data.held_out[0].path: no such file or folder" in result.output
    esconv = workdir.parent / "data" / "esconv" / "ESConv.json"
    esconv.parent.mkdir(parents=True)
    esconv.write_text("[]")
    result = runner.invoke(app, ["config", "validate", str(workdir / "paper.yaml")])
    assert result.exit_code == 0, result.output
    assert "K=8" in result.output and "LoRA r=16" in result.output and "phi-4" in result.output


def test_shipped_rosters_and_users_are_valid():
    paths = [str(p) for p in sorted((CONFIGS / "rosters").glob("*.yaml"))] + [str(USERS)]
    result = runner.invoke(app, ["config", "validate", *paths])
    assert result.exit_code == 0, result.output
    assert "The Anchor" in result.output and "Critic" in result.output


@pytest.mark.parametrize("case, name, mutation, fragments", BROKEN_CONFIGS, ids=[c[0] for c in BROKEN_CONFIGS])
def test_broken_config(workdir, case, name, mutation, fragments):
    data = _set(_yaml(workdir / name), *mutation)
    if name == "paper.yaml":  # give the paper profile its held-out file so only the mutation is wrong
        (workdir / "esconv.json").write_text("[]")
        data["data"]["held_out"][0]["path"] = "esconv.json"
    _check(_write(workdir, f"broken-{case}.yaml", data), fragments)


@pytest.mark.parametrize("case, text, fragments", BROKEN_TEXT, ids=[c[0] for c in BROKEN_TEXT])
def test_broken_yaml_text(tmp_path, case, text, fragments):
    _check(_write(tmp_path, "broken.yaml", text), fragments)


@pytest.mark.parametrize("case, mutation, fragments", BROKEN_ROSTERS, ids=[c[0] for c in BROKEN_ROSTERS])
def test_broken_roster(tmp_path, case, mutation, fragments):
    _check(_write(tmp_path, "roster.yaml", _set(_yaml(ROSTER), *mutation)), fragments)


@pytest.mark.parametrize("case, mutation, fragments", BROKEN_USERS, ids=[c[0] for c in BROKEN_USERS])
def test_broken_users(tmp_path, case, mutation, fragments):
    _check(_write(tmp_path, "users.yaml", _set(_yaml(USERS), *mutation)), fragments)


def test_problem_points_at_line(workdir):
    text = (workdir / "tiny.yaml").read_text().replace("  k: 4", "  k: many")
    path = _write(workdir, "broken-line.yaml", text)
    line = next(i for i, row in enumerate(text.splitlines(), 1) if row.strip() == "k: many")
    _check(path, [f"broken-line.yaml:{line}: stage1.k"])


def test_every_problem_is_listed(workdir):
    data = _set(_set(_yaml(workdir / "tiny.yaml"), "stage1.k", 0), "stage1.margin", -1)
    _check(_write(workdir, "broken-two.yaml", data), ["2 problem(s)", "stage1.k", "stage1.margin"])


def test_console_command_exit_status(workdir):
    broken = _write(workdir, "broken.yaml", _set(_yaml(workdir / "tiny.yaml"), "stage1.k", 0))
    mascot = Path(sys.executable).parent / "mascot"
    result = subprocess.run([str(mascot), "config", "validate", str(broken)], capture_output=True, text=True, check=False)
    assert result.returncode == 2
    assert "stage1.k" in result.stderr


def test_relative_paths_resolve_against_config_folder(workdir):
    config = load_config(workdir / "tiny.yaml")
    assert config.data.roster == workdir / "rosters" / "emotional_support.yaml"
    assert config.data.corpus.path.is_dir()


def test_the_docs_list_every_field():
    from mascot.config_docs import field_table

    docs = (REPO / "docs" / "configuration.md").read_text()
    assert field_table() in docs, "docs/configuration.md is stale: paste `python -m mascot.config_docs` into it"
