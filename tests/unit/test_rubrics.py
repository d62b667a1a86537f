"""The shipped rubrics: the criteria the paper names, complete and distinguishable anchors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from mascot.rubrics import Rubric, load_rubric
from mascot.yamlio import ConfigError

RUBRICS = Path(__file__).resolve().parents[2] / "configs" / "rubrics"
EXPECTED = {
    "emotional_support": {
        "emotional_expressiveness": "Emotional Expressiveness",
        "empathetic_support": "Empathetic Support Quality",
        "persona_consistency": "Persona Consistency",
        "response_relevance": "Response Relevance",
        "social_contribution": "Social Contribution",
    },
    "meetings": {
        "faithfulness": None,
        "role_adherence": None,
        "persona_consistency": "Persona Consistency",
        "query_relevance": None,
        "contribution": None,
        "social_contribution": "Social Contribution",
    },
}
HEADLINE = ["persona_consistency", "social_contribution"]  # the paper's two headline criteria


@pytest.mark.parametrize("domain", sorted(EXPECTED))
def test_shipped_rubric_has_the_expected_criteria(domain):
    rubric = load_rubric(RUBRICS / f"{domain}.yaml")
    assert rubric.domain == domain
    assert (rubric.scale_min, rubric.scale_max) == (1, 5)
    assert rubric.criterion_ids == list(EXPECTED[domain])
    for criterion in rubric.criteria:
        if EXPECTED[domain][criterion.id] is not None:
            assert criterion.name == EXPECTED[domain][criterion.id]


def test_both_domains_report_the_headline_criteria_under_the_same_ids_and_names():
    rubrics = [load_rubric(RUBRICS / f"{domain}.yaml") for domain in sorted(EXPECTED)]
    names = [{c.id: c.name for c in rubric.criteria if c.id in HEADLINE} for rubric in rubrics]
    assert names[0] == names[1] and sorted(names[0]) == HEADLINE
    # Each domain defines them for its own setting: the meetings text is not the emotional-support text.
    descriptions = [{c.id: c.description for c in rubric.criteria if c.id in HEADLINE} for rubric in rubrics]
    assert all(descriptions[0][cid] != descriptions[1][cid] for cid in HEADLINE)


@pytest.mark.parametrize("domain", sorted(EXPECTED))
def test_anchors_cover_the_scale_and_are_distinct(domain):
    rubric = load_rubric(RUBRICS / f"{domain}.yaml")
    for criterion in rubric.criteria:
        assert sorted(criterion.anchors) == [1, 2, 3, 4, 5]
        texts = [criterion.anchors[score] for score in range(1, 6)]
        assert len(set(texts)) == 5, f"{criterion.id}: two anchors say the same thing"
        assert all(len(text.split()) >= 5 for text in texts), f"{criterion.id}: an anchor is too vague"
        assert len(criterion.description.split()) >= 8


def _write(tmp_path, data) -> Path:
    path = tmp_path / "rubric.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def _minimal() -> dict:
    anchors = {score: f"anchor text for score {score}" for score in range(1, 6)}
    return {"domain": "meetings", "name": "r", "criteria": [
        {"id": "faithfulness", "name": "F", "description": "d", "anchors": dict(anchors)}]}


def test_a_missing_anchor_is_reported_with_the_file(tmp_path):
    data = _minimal()
    del data["criteria"][0]["anchors"][3]
    with pytest.raises(ConfigError, match="one anchor for each score 1..5") as info:
        load_rubric(_write(tmp_path, data))
    assert str(tmp_path / "rubric.yaml") in str(info.value)


def test_repeated_criterion_ids_are_rejected(tmp_path):
    data = _minimal()
    data["criteria"].append(dict(data["criteria"][0]))
    with pytest.raises(ConfigError, match="criterion ids must be unique"):
        load_rubric(_write(tmp_path, data))


def test_a_misspelled_field_gets_a_hint(tmp_path):
    data = _minimal()
    data["criteria"][0]["anchor"] = data["criteria"][0].pop("anchors")
    with pytest.raises(ConfigError, match="did you mean 'anchors'"):
        load_rubric(_write(tmp_path, data))


def test_rubric_model_is_frozen():
    rubric = Rubric.model_validate(_minimal())
    with pytest.raises(ValidationError):
        rubric.name = "other"


@pytest.mark.parametrize("domain", sorted(EXPECTED))
def test_the_collective_rubric_has_the_papers_group_criteria(domain):
    rubric = load_rubric(RUBRICS / f"group_{domain}.yaml")
    assert rubric.domain == domain and (rubric.scale_min, rubric.scale_max) == (1, 5)
    assert rubric.criterion_ids == ["persona_fidelity", "originality", "relevance", "engagement", "consistency"]
    assert [c.name for c in rubric.criteria] == ["Persona Fidelity", "Originality and Specificity",
                                                 "Relevance and Coherence", "Engagement and Contribution",
                                                 "Global State Consistency"]
