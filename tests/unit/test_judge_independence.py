"""Whether an evaluation judge also labelled the training data is decided by the model that judges, not by its
label: a training judge renamed, or served from another address, is still that judge, and the report's first
lines say so exactly when one is."""

from __future__ import annotations

import pytest
from test_cli import REPO

from mascot.config import JudgeConfig, RunConfig
from mascot.evaluation.report import judges_of, preamble
from mascot.yamlio import YamlDocument, validate_document

WARNING = "These evaluation judges are models that also labelled the training data"


def load_config(path):
    """The profile as validated, without the checks of the files it points at (the paper's corpora are not here)."""
    return validate_document(YamlDocument.read(path), RunConfig, context={"base_dir": path.parent})


def with_pairwise(config, **judge):
    pairwise = JudgeConfig.model_validate({"kind": "llm", "max_attempts": 3, **judge})
    return config.model_copy(update={"eval": config.eval.model_copy(update={"pairwise": pairwise})})


def with_panels(config, judges):
    return config.model_copy(update={"eval": config.eval.model_copy(update={"judges": judges, "group_judges": judges})})


def lines(judges: dict) -> list[str]:
    summary = {"judges": judges, "seeds": [0], "contexts": {"held_out": 3}, "confidence": 0.95,
               "reasoning": {"turns": 0}}
    return preamble(summary)


@pytest.mark.parametrize("profile", ["paper.yaml", "paper_meetings.yaml"])
def test_the_paper_profiles_pairwise_judge_is_independent_and_their_panels_are_said_to_be_shared(profile):
    judges = judges_of(load_config(REPO / "configs" / profile))
    assert judges["pairwise"] not in judges["shared_with_training"]
    assert {e["model"] for e in judges["shared_models"]} == {"gpt-4o-2024-08-06", "gemma-3-27b-it", "phi-4"}
    gpt = next(e for e in judges["shared_models"] if e["model"] == "gpt-4o-2024-08-06")
    assert gpt["roles"] == ["persona", "collective"] and "stage1 'gpt-4o'" in gpt["training"]
    [warning] = [line for line in lines(judges) if WARNING in line]
    assert "gpt-4o (model gpt-4o-2024-08-06, persona and collective; in training as stage1 'gpt-4o', stage2 'gpt-4o')" in warning


def test_a_renamed_or_moved_training_judge_is_still_found_and_a_namesake_of_another_model_is_not():
    config = load_config(REPO / "configs" / "paper.yaml")
    independent = [JudgeConfig.model_validate({"kind": "llm", "name": "llama", "backend": {
        "kind": "openai", "model": "meta-llama/Llama-3.3-70B-Instruct", "base_url": "http://127.0.0.1:8004/v1"}})]
    config = with_panels(config, independent)
    assert judges_of(config)["shared_with_training"] == []
    assert not [line for line in lines(judges_of(config)) if WARNING in line], "no warning where no judge is shared"

    renamed = judges_of(with_pairwise(config, name="fresh-eyes", backend={"kind": "openai", "model": "gpt-4o-2024-08-06"}))
    assert renamed["shared_with_training"] == ["fresh-eyes"]
    assert renamed["shared_models"][0] | {"training": None} == {"judge": "fresh-eyes", "model": "gpt-4o-2024-08-06",
                                                                "roles": ["pairwise"], "training": None}
    [warning] = [line for line in lines(renamed) if WARNING in line]
    assert "fresh-eyes (model gpt-4o-2024-08-06, pairwise; in training as stage1 'gpt-4o', stage2 'gpt-4o')" in warning

    # Gemma without its hub organisation, served from another address: the same model.
    moved = judges_of(with_pairwise(config, name="g", backend={"kind": "openai", "model": "Gemma-3-27B-IT",
                                                               "base_url": "http://10.0.0.9:9000/v1"}))
    assert moved["shared_with_training"] == ["g"] and moved["shared_models"][0]["model"] == "gemma-3-27b-it"

    # A judge named like a training judge, but another model: not shared.
    namesake = judges_of(with_pairwise(config, name="gpt-4o", backend={"kind": "openai", "model": "o3-mini-2025-01-31"}))
    assert namesake["shared_with_training"] == []


def test_the_tiny_profiles_heuristic_judges_are_shared_and_said_to_be():
    judges = judges_of(load_config(REPO / "configs" / "tiny.yaml"))
    assert judges["shared_with_training"] == ["heuristic"] and judges["heuristic_only"]
    assert any(WARNING in line for line in lines(judges))
