"""The heuristic judge (not an LLM): deterministic, roster-driven, and a signal worth learning from."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mascot.data.context import Context, Message
from mascot.judges import HeuristicJudge, JudgeItem, extract_features
from mascot.roster import Persona, load_roster
from mascot.rubrics import Rubric, load_rubric

ROOT = Path(__file__).resolve().parents[2]
LONELY = Context(
    id="ctx-lonely", domain="emotional_support", source="test", split="train", valence="negative",
    history=[
        Message(role="user", content="I moved to a new city for work three weeks ago and I still eat dinner alone "
                                     "every night."),
        Message(role="assistant", content="That sounds hard. Moving somewhere new can be isolating."),
        Message(role="user", content="My coworkers are nice, but they all go home to their families. "
                                     "I feel so lonely."),
    ],
)
EMPATHETIC = ("It sounds so lonely to eat dinner alone every night in a new city. Of course you feel that way; "
              "it makes sense, and you're not alone in feeling it.")
QUESTION = "What might be one small way you could connect with a coworker outside work this week?"
BOILERPLATE = "As an AI language model, I cannot feel emotions. I hope this helps! Is there anything else?"
REPETITIVE = "I am sorry. I am sorry. I am sorry. I am sorry. I am sorry. I am sorry."
OFF_TOPIC = "The quarterly budget spreadsheet needs updated formulas for the marketing department."


@pytest.fixture(scope="module")
def rubric() -> Rubric:
    return load_rubric(ROOT / "configs" / "rubrics" / "emotional_support.yaml")


@pytest.fixture(scope="module")
def roster():
    return load_roster(ROOT / "configs" / "rosters" / "emotional_support.yaml")


@pytest.fixture(scope="module")
def judge(rubric) -> HeuristicJudge:
    return HeuristicJudge(rubric)


def judged(judge, persona, text, context=LONELY, idx=0):
    return asyncio.run(judge.judge(JudgeItem("q1", idx, context, persona, text), seed=0))


@pytest.mark.parametrize("bad", [BOILERPLATE, REPETITIVE, OFF_TOPIC, ""], ids=["boilerplate", "repetitive",
                                                                              "off-topic", "empty"])
def test_an_empathetic_on_persona_reply_beats_degenerate_replies(judge, roster, bad):
    anchor = roster.get("anchor")
    good, worse = judged(judge, anchor, EMPATHETIC), judged(judge, anchor, bad)
    assert good.overall > worse.overall + 1.0
    for criterion in ("empathetic_support", "response_relevance", "social_contribution"):
        assert good.scores[criterion] > worse.scores[criterion], criterion


def test_each_degenerate_reply_loses_on_the_criterion_it_breaks(judge, roster):
    anchor = roster.get("anchor")
    good = judged(judge, anchor, EMPATHETIC).scores
    assert judged(judge, anchor, OFF_TOPIC).scores["response_relevance"] == 1.0
    assert judged(judge, anchor, BOILERPLATE).scores["persona_consistency"] < good["persona_consistency"] - 2
    assert all(score == 1.0 for score in judged(judge, anchor, REPETITIVE).scores.values())


def test_an_empty_reply_is_a_valid_judgment_with_the_lowest_scores(judge, roster):
    judgment = judged(judge, roster.get("anchor"), "   ")
    assert judgment.ok and judgment.error is None and judgment.attempts == 1
    assert set(judgment.scores) == set(judge.rubric.criterion_ids)
    assert all(score == judge.rubric.scale_min for score in judgment.scores.values())
    assert judgment.overall == 1.0 and "empty" in judgment.feedback


def test_a_question_fits_the_catalyst_better_than_the_anchor(judge, roster):
    catalyst = judged(judge, roster.get("catalyst"), QUESTION).scores["persona_consistency"]
    anchor = judged(judge, roster.get("anchor"), QUESTION).scores["persona_consistency"]
    assert catalyst > anchor + 1.0
    # ...and validation without a question fits the Anchor better than the Catalyst.
    assert (judged(judge, roster.get("anchor"), EMPATHETIC).scores["persona_consistency"]
            > judged(judge, roster.get("catalyst"), EMPATHETIC).scores["persona_consistency"] + 1.0)


def test_must_not_rules_from_the_roster_are_checked(judge, roster):
    anchor = roster.get("anchor")
    advice = "You should join a club and try to go out more; I suggest you make a plan for this week."
    features = extract_features(JudgeItem("q", 0, LONELY, anchor, advice))
    assert any(v.startswith("Give advice or action plans.") for v in features.violations)
    # A quoted phrase in a rule ("at least...") is a banned phrase of its own.
    minimising = extract_features(JudgeItem("q", 0, LONELY, anchor, "At least your coworkers are nice to you."))
    assert any("'at least'" in v for v in minimising.violations)
    # The Beacon has no rule against advice, so the same reply breaks none of its rules.
    assert extract_features(JudgeItem("q", 0, LONELY, roster.get("beacon"), advice)).violations == []
    assert (judged(judge, anchor, advice).scores["persona_consistency"]
            < judged(judge, anchor, EMPATHETIC).scores["persona_consistency"])


def test_persona_behaviour_comes_from_roster_fields_not_ids(judge):
    """A persona the code has never seen is judged by its own lexicon and question style."""
    base = {"id": "gardener", "name": "The Gardener", "role": "plant lover", "description": "Talks about plants.",
            "style_rules": ["Mention plants."], "must_not": ["Talk about itself being an AI or a persona."]}
    text = "Moving is like repotting a plant: roots need time before new leaves grow in the new city."
    with_lexicon = Persona(**base, lexicon=["plant", "roots", "leaves", "repotting"])
    without = Persona(**base, lexicon=["spreadsheet"])
    assert (judged(judge, with_lexicon, text).scores["persona_consistency"]
            > judged(judge, without, text).scores["persona_consistency"] + 1.0)
    asking = Persona(**base, asks_questions=True)
    assert extract_features(JudgeItem("q", 0, LONELY, asking, text)).question_fit == 0.0


def test_role_labels_and_length_extremes_are_penalised(judge, roster):
    anchor = roster.get("anchor")
    clean = judged(judge, anchor, EMPATHETIC)
    labelled = judged(judge, anchor, "The Anchor: " + EMPATHETIC)
    assert "role label" in extract_features(JudgeItem("q", 0, LONELY, anchor, "The Anchor: hi")).boilerplate
    assert labelled.overall < clean.overall - 1.0
    rambling = " ".join([EMPATHETIC] + [f"Day {i} in the new city brings another quiet dinner." for i in range(30)])
    features = extract_features(JudgeItem("q", 0, LONELY, anchor, rambling))
    assert features.n_words > 250 and features.length_fit < 0.5
    assert judged(judge, anchor, rambling).overall < clean.overall
    assert extract_features(JudgeItem("q", 0, LONELY, anchor, "Oh.")).length_fit < 0.5


def test_cheerfulness_at_distress_lowers_emotional_expressiveness(judge, roster):
    anchor = roster.get("anchor")
    cheer = "Great news! Awesome! What a wonderful, amazing, fantastic adventure in a new city!"
    features = extract_features(JudgeItem("q", 0, LONELY, anchor, cheer))
    assert features.compound > 0.5 and features.tone_fit < 0.5
    assert extract_features(JudgeItem("q", 0, LONELY, anchor, EMPATHETIC)).tone_fit == 1.0
    assert (judged(judge, anchor, cheer).scores["emotional_expressiveness"]
            < judged(judge, anchor, EMPATHETIC).scores["emotional_expressiveness"])


def test_judgments_are_deterministic_and_ignore_the_seed(judge, roster):
    item = JudgeItem("q1", 3, LONELY, roster.get("beacon"), EMPATHETIC)
    first = asyncio.run(judge.judge(item, seed=1))
    assert first == asyncio.run(judge.judge(item, seed=99))
    assert first.candidate_idx == 3 and first.judge == "heuristic"
    assert first.overall == pytest.approx(sum(first.scores.values()) / len(first.scores))
    assert all(1.0 <= score <= 5.0 for score in first.scores.values())


def test_feedback_says_it_is_not_an_llm_and_names_the_features(judge, roster):
    feedback = judged(judge, roster.get("anchor"), BOILERPLATE).feedback
    assert "not an LLM" in feedback and "AI self-reference" in feedback and "Strongest" in feedback
    feedback = judged(judge, roster.get("catalyst"), EMPATHETIC).feedback
    assert "asks 0 questions" in feedback and "persona words" in feedback


def test_a_criterion_without_a_feature_formula_is_an_error(rubric):
    extra = rubric.criteria[0].model_copy(update={"id": "humour", "name": "Humour"})
    odd = rubric.model_copy(update={"criteria": [*rubric.criteria, extra]})
    with pytest.raises(ValueError, match=r"no feature formula for criteria \['humour'\]"):
        HeuristicJudge(odd)


def test_meetings_invented_numbers_lower_faithfulness():
    rubric = load_rubric(ROOT / "configs" / "rubrics" / "meetings.yaml")
    scribe = load_roster(ROOT / "configs" / "rosters" / "meetings.yaml").get("minutes_scribe")
    meeting = Context(id="m1", domain="meetings", source="test", split="train", history=[
        Message(role="user", name="Grad D", content="We now have about twelve hours fully annotated."),
        Message(role="user", name="PhD A", content="Most false alarms are on names and unusual words."),
        Message(role="user", name="Professor B", content="Because those aren't in the pronunciation dictionary?"),
    ])
    judge = HeuristicJudge(rubric)
    grounded = judged(judge, scribe, "Summary: Grad D said about twelve hours are annotated; PhD A noted most "
                                     "false alarms are on names and unusual words.", context=meeting)
    invented = judged(judge, scribe, "The team decided to spend 40000 dollars on 17 new servers.", context=meeting)
    assert grounded.scores["faithfulness"] > invented.scores["faithfulness"] + 1.5
    assert grounded.overall > invented.overall
    features = extract_features(JudgeItem("q", 0, meeting, scribe, "We bought 17 servers for 40000 dollars."))
    assert features.unsupported_numbers == ["17", "40000"]


MEETING_WITH_QUERY = Context(
    id="m2", domain="meetings", source="test", split="train",
    history=[
        Message(role="user", name="Marketing", content="The survey says riders want the light to last a whole week."),
        Message(role="user", name="Industrial Designer", content="A bigger battery makes the case heavier."),
        Message(role="user", name="Project Manager", content="Let's move on to the colour options."),
    ],
    metadata={"specific_queries": [{"query": "What did the survey say about battery life?", "answer": "-",
                                    "spans": [[0, 1]]}], "general_queries": []},
)


def test_the_meetings_rubric_is_scored_on_every_criterion_headline_ones_included():
    rubric = load_rubric(ROOT / "configs" / "rubrics" / "meetings.yaml")
    roster = load_roster(ROOT / "configs" / "rosters" / "meetings.yaml")
    judge = HeuristicJudge(rubric)
    scribe = roster.get("minutes_scribe")
    on_role = judged(judge, scribe, "Summary: Marketing said the survey shows riders want the light to last a "
                                    "week; the Industrial Designer noted a bigger battery adds weight.",
                     context=MEETING_WITH_QUERY)
    assert set(on_role.scores) == set(rubric.criterion_ids) >= {"persona_consistency", "social_contribution"}
    # Neither headline criterion is a constant: each follows the features its definition names.
    off_role = judged(judge, scribe, "I think you should definitely pick red, in my opinion it looks great.",
                      context=MEETING_WITH_QUERY)
    assert on_role.scores["persona_consistency"] > off_role.scores["persona_consistency"] + 1.0
    echo = judged(judge, scribe, "Let's move on to the colour options.", context=MEETING_WITH_QUERY)
    assert on_role.scores["social_contribution"] > echo.scores["social_contribution"] + 1.0


def test_query_relevance_counts_the_words_of_the_meeting_query():
    judge = HeuristicJudge(load_rubric(ROOT / "configs" / "rubrics" / "meetings.yaml"))
    scribe = load_roster(ROOT / "configs" / "rosters" / "meetings.yaml").get("minutes_scribe")
    # Both replies take up the last turn (colour options); one also answers the query (survey, battery life).
    answers = "On the survey: riders want battery life of a week. Next up are the colour options."
    ignores = "Next up are the colour options, so the group will move on to choosing colours now."
    features = extract_features(JudgeItem("q", 0, MEETING_WITH_QUERY, scribe, answers))
    assert features.meeting_query == "What did the survey say about battery life?"
    assert {"survey", "batteri", "life"} <= set(features.shared_query)
    assert (judged(judge, scribe, answers, context=MEETING_WITH_QUERY).scores["query_relevance"]
            > judged(judge, scribe, ignores, context=MEETING_WITH_QUERY).scores["query_relevance"])
    assert "shared with the query" in judged(judge, scribe, answers, context=MEETING_WITH_QUERY).feedback
    # Without a query, relevance is the last turn and the conversation, as in emotional support.
    no_query = MEETING_WITH_QUERY.model_copy(update={"metadata": {}})
    plain = extract_features(JudgeItem("q", 0, no_query, scribe, answers))
    assert plain.meeting_query is None and plain.shared_query == []
