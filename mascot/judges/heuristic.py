"""The heuristic judge: a deterministic, feature-based scorer. It is NOT an LLM judge.

It exists so the offline `tiny` profile and the tests can run Stage 1 end to end without a model
judging, and still produce a real, learnable signal: replies that are warm, on-persona, on-topic
and clean score higher than boilerplate, repetitive, off-topic or empty ones. Every feature and
formula is listed in docs/judges.md; keep the two in step.

Each criterion gets a quality q in [0, 1] from interpretable features (persona lexicon, style
rules from the roster, VADER sentiment, word overlap with the context, penalties for repetition,
length extremes and assistant boilerplate); the score is `scale_min + (scale_max - scale_min) * q`,
rounded to 2 decimals. Nothing in here names a persona: persona behaviour comes from the roster
fields `lexicon`, `asks_questions` and `must_not`.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache, lru_cache

from mascot.data.qmsum import meeting_query
from mascot.judges.base import JudgeItem, Judgment
from mascot.rubrics import Rubric

WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


def _word_set(text: str) -> frozenset[str]:
    return frozenset(text.split())


NUMBER_WORDS = _word_set(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred "
    "thousand million billion percent half quarter"
)
# Function words left out of overlap counts: sharing "the" with the context says nothing.
STOPWORDS = _word_set(
    "a about above after again against all am an and any are as at be because been before being below "
    "between both but by can could did do does doing down during each few for from further had has have "
    "having he her here hers herself him himself his how i if in into is it its itself just let me more most "
    "my myself no nor not now of off on once only or other our ours ourselves out over own really same she "
    "should so some such than that that's the their theirs them themselves then there these they this "
    "those through to too under until up very was we were what when where which while who whom why will "
    "with would you your yours yourself yourselves i'm you're it's don't can't i've you've that's what's "
    "there's let's also still even much many well yes yeah oh okay ok"
)
# Phrases that show a reply has taken in the person's feelings (the empathy criterion).
WARMTH_PHRASES = (
    "sounds like", "that sounds", "i hear", "i can hear", "must be", "must feel", "makes sense",
    "make sense", "i'm sorry", "i am sorry", "so sorry", "it's okay", "it's ok", "not alone",
    "i understand", "understandable", "of course", "so hard", "really hard", "you feel", "you're feeling",
    "you felt", "here for you", "with you", "proud of you", "happy for you", "glad you", "no wonder",
)
# Generic assistant talk that no persona should produce; each pattern found halves every score.
BOILERPLATE = {
    "AI self-reference": r"\bas an? (ai|artificial intelligence|language model|assistant|chatbot)\b"
                         r"|\bi(?:'m| am) (?:just |only )?an? (ai|language model|chatbot|bot|virtual assistant)\b"
                         r"|\blanguage model\b",
    "'I hope this helps'": r"\bi hope (this|that) helps\b",
    "offer to assist": r"\bhow (can|may) i (help|assist)\b|\bis there anything else\b|\bi'?m here to help\b"
                       r"|\bfeel free to\b",
    "role label": r"(?m)^\s*(assistant|user|system|ai|bot|companion|the [a-z]+)\s*:",
    "markup token": r"<\|?/?[a-z_]+\|?>",
}
# must_not rules are free text; a rule mentioning one of the trigger words is checked with the
# markers beside it (phrases searched in the reply). Rules that match no trigger are not checked.
MUST_NOT_PHRASE_CHECKS: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (("advice", "action plan", "push a plan"),
     ("you should", "you need to", "you could try", "try to", "have you tried", "why don't you", "why not",
      "i suggest", "i recommend", "my advice", "make a plan", "next step", "small step", "first step")),
    (("minimise", "minimize", "minimising", "minimizing"),
     ("at least", "could be worse", "bright side", "don't worry", "not a big deal", "no big deal",
      "get over it", "not that bad", "others have it worse")),
    (("ai or a persona", "being an ai"), ("as an ai", "language model", "i'm an ai", "i am an ai",
                                          "my persona", "as a persona", "chatbot")),
    (("cheerleading", "toxic positivity"),
     ("good vibes", "stay positive", "just be positive", "everything happens for a reason", "cheer up",
      "look on the bright side", "no negativity")),
    (("promise",), ("i promise", "guarantee", "will definitely", "definitely will", "everything will be fine",
                    "everything will be okay", "it will all work out")),
    (("decide for the person", "must do"), ("you must", "you have to", "you need to")),
    (("opinion",), ("i think", "in my opinion", "i believe", "personally")),
    (("attack people",), ("stupid", "idiot", "incompetent", "lazy", "useless", "clueless", "ridiculous")),
)
@dataclass(frozen=True)
class HeuristicSettings:
    """Thresholds of the feature formulas (see docs/judges.md)."""

    min_words: int = 6  # below this the length fit falls linearly to 0 at 0 words
    max_words: int = 120  # above this it falls linearly to 0 at max_words + length_falloff
    length_falloff: int = 180
    lexicon_saturation: int = 3  # persona-lexicon entries used for full marks
    overlap_saturation: int = 3  # shared content words with the last user turn for full marks
    history_saturation: int = 4  # shared content words with the whole context for full marks
    warmth_saturation: int = 2
    emotion_saturation: int = 3
    affect_saturation: float = 0.35  # VADER pos + neg share for full marks
    substance_saturation: int = 8  # distinct content words for full marks


@dataclass
class ReplyFeatures:
    """Everything the formulas read, kept for the feedback text and for tests."""

    n_words: int = 0
    length_fit: float = 0.0
    repetition: float = 0.0
    boilerplate: list[str] = field(default_factory=list)
    lexicon_hits: list[str] = field(default_factory=list)
    n_questions: int = 0
    question_fit: float = 0.0
    violations: list[str] = field(default_factory=list)
    compound: float = 0.0
    affect: float = 0.0
    emotion_words: int = 0
    warmth_hits: list[str] = field(default_factory=list)
    tone_fit: float = 1.0
    shared_last: list[str] = field(default_factory=list)
    meeting_query: str | None = None  # the context's query (`mascot.data.qmsum.meeting_query`), if any
    shared_query: list[str] = field(default_factory=list)
    shared_history: list[str] = field(default_factory=list)
    relevance: float = 0.0
    grounded_share: float = 0.0
    novelty: float = 0.0
    substance: float = 0.0
    unsupported_numbers: list[str] = field(default_factory=list)
    addresses_person: bool = False

    @property
    def hygiene(self) -> float:
        """Shared penalty factor: length extremes, repeated trigrams, boilerplate (each halves)."""
        return self.length_fit * (1.0 - min(1.0, 2.0 * self.repetition)) * 0.5 ** len(self.boilerplate)

    @property
    def compliance(self) -> float:
        return 0.5 ** len(self.violations)


# Rules checked from counted features rather than phrases: (trigger words, feature test, label).
MUST_NOT_COUNT_CHECKS: tuple[tuple[tuple[str, ...], Callable[[ReplyFeatures], bool], str], ...] = (
    (("several questions", "pile up"), lambda f: f.n_questions >= 3, "three or more questions"),
    (("invent facts", "not stated", "does not support"), lambda f: bool(f.unsupported_numbers),
     "numbers not in the transcript"),
)


def _clip(value: float) -> float:
    return min(1.0, max(0.0, value))


# criterion id -> quality formula over the features and the settings. Both domains score the
# headline criteria (persona_consistency, social_contribution) with the same formulas. Meetings'
# role_adherence and contribution reuse them: no surface feature tells doing the job from staying
# in character, or an item for the record from a move in the conversation (docs/judges.md).
def persona_fit(f: ReplyFeatures, s: HeuristicSettings) -> float:
    lexicon = min(1.0, len(f.lexicon_hits) / s.lexicon_saturation)
    return f.hygiene * (0.5 * lexicon + 0.25 * f.question_fit + 0.25 * f.compliance)


def contribution(f: ReplyFeatures, s: HeuristicSettings) -> float:
    lexicon = min(1.0, len(f.lexicon_hits) / s.lexicon_saturation)
    # New wording only counts as a contribution when it is about the conversation.
    on_topic = min(1.0, 2.0 * f.relevance)
    return f.hygiene * (0.35 * f.novelty * on_topic + 0.25 * f.substance + 0.2 * lexicon + 0.2 * f.relevance)


FORMULAS: dict[str, Callable[[ReplyFeatures, HeuristicSettings], float]] = {
    # Tone scales the whole score: vivid feeling in the wrong key is not good expressiveness.
    "emotional_expressiveness": lambda f, s: f.hygiene * (0.4 + 0.6 * f.tone_fit) * (
        0.55 * min(1.0, f.affect / s.affect_saturation)
        + 0.45 * min(1.0, f.emotion_words / s.emotion_saturation)),
    "empathetic_support": lambda f, s: f.hygiene * (
        0.4 * min(1.0, len(f.warmth_hits) / s.warmth_saturation)
        + 0.2 * min(1.0, f.affect / s.affect_saturation) + 0.2 * f.tone_fit + 0.2 * f.relevance),
    "persona_consistency": persona_fit,
    "response_relevance": lambda f, s: f.hygiene * (0.8 * f.relevance + 0.2 * f.addresses_person),
    "social_contribution": contribution,
    "faithfulness": lambda f, s: f.hygiene * (0.6 * f.grounded_share + 0.4 * 0.5 ** len(f.unsupported_numbers)),
    "role_adherence": persona_fit,
    "query_relevance": lambda f, s: f.hygiene * f.relevance,
    "contribution": contribution,
}


@cache
def _sentiment():
    try:
        from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer
    except ImportError as exc:
        raise ImportError("the heuristic judge needs vaderSentiment: pip install 'mascot[metrics]'") from exc
    return SentimentIntensityAnalyzer()


_stemmers = threading.local()  # a Snowball stemmer keeps its word in progress on itself: one per thread


def _stemmer():
    # Snowball's English (Porter2) stemmer: rule-based, and a 10 ms import, where nltk's Porter
    # stemmer costs a second and 50 MB of nltk and scipy in every judging process.
    if not hasattr(_stemmers, "english"):
        try:
            import snowballstemmer
        except ImportError as exc:
            raise ImportError("the heuristic judge needs snowballstemmer: pip install 'mascot[metrics]'") from exc
        _stemmers.english = snowballstemmer.stemmer("english")
    return _stemmers.english


@lru_cache(maxsize=65536)
def _stem(word: str) -> str:
    return _stemmer().stemWord(word)


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def content_stems(tokens: list[str]) -> set[str]:
    return {_stem(t) for t in tokens if len(t) > 2 and t not in STOPWORDS}


def _phrase_in(phrase: str, text: str) -> bool:
    return re.search(rf"(?<![a-z']){re.escape(phrase)}(?![a-z'])", text) is not None


def trigrams(tokens: list[str]) -> list[tuple[str, ...]]:
    return [tuple(tokens[i:i + 3]) for i in range(len(tokens) - 2)]


def _number_tokens(tokens: list[str]) -> set[str]:
    return {t for t in tokens if t.isdigit() or t in NUMBER_WORDS}


def _question_fit(n_questions: int, asks_questions: bool) -> float:
    if asks_questions:  # one good question is the style; none misses it, a pile interrogates
        return {0: 0.0, 1: 1.0, 2: 0.6}.get(n_questions, 0.2)
    return {0: 1.0, 1: 0.6, 2: 0.3}.get(n_questions, 0.0)


def extract_features(item: JudgeItem, settings: HeuristicSettings = HeuristicSettings()) -> ReplyFeatures:
    """Compute every feature of `item.candidate` against its persona and context."""
    text = item.candidate.strip()
    lower = text.lower()
    tokens = words(text)
    f = ReplyFeatures(n_words=len(tokens))
    if not tokens:
        return f
    s = settings
    if f.n_words < s.min_words:
        f.length_fit = f.n_words / s.min_words
    else:
        f.length_fit = _clip(1.0 - max(0, f.n_words - s.max_words) / s.length_falloff)
    grams = trigrams(tokens)
    f.repetition = 1.0 - len(set(grams)) / len(grams) if grams else 0.0
    f.boilerplate = [label for label, pattern in BOILERPLATE.items() if re.search(pattern, lower)]
    persona_name = re.escape(item.persona.name.lower())
    if "role label" not in f.boilerplate and re.search(rf"(?m)^\s*{persona_name}\s*:", lower):
        f.boilerplate.append("role label")

    stems = [_stem(t) for t in tokens]
    joined = " " + " ".join(stems) + " "
    seen_entries: set[str] = set()
    for entry in item.persona.lexicon:  # entries like "feel"/"feeling" share a stem: count once
        key = " ".join(_stem(t) for t in words(entry))
        if key and key not in seen_entries and f" {key} " in joined:
            seen_entries.add(key)
            f.lexicon_hits.append(entry)

    f.n_questions = len(re.findall(r"\?+", text))
    f.question_fit = _question_fit(f.n_questions, item.persona.asks_questions)

    analyzer = _sentiment()
    polarity = analyzer.polarity_scores(text)
    f.compound = polarity["compound"]
    f.affect = polarity["pos"] + polarity["neg"]
    f.emotion_words = sum(1 for t in tokens if abs(analyzer.lexicon.get(t, 0.0)) >= 0.5 or t.startswith("feel"))
    f.warmth_hits = [p for p in WARMTH_PHRASES if _phrase_in(p, lower)]

    user_turns = [m.content for m in item.context.history if m.role == "user"]
    last_user = user_turns[-1] if user_turns else item.context.history[-1].content
    user_compound = analyzer.polarity_scores(last_user)["compound"]
    if user_compound <= -0.05 and not f.warmth_hits:
        f.tone_fit = _clip(1.0 - 2.0 * max(0.0, f.compound - 0.5))  # cheerful at someone in distress
    elif user_compound >= 0.05:
        f.tone_fit = _clip(1.0 + min(0.0, f.compound))  # gloomy at someone's good news

    mine = content_stems(tokens)
    context_tokens = [t for m in item.context.history for t in words(m.content)]
    context_stems = content_stems(context_tokens)
    f.shared_last = sorted(mine & content_stems(words(last_user)))
    f.shared_history = sorted(mine & context_stems)
    last_fit = min(1.0, len(f.shared_last) / s.overlap_saturation)
    f.meeting_query = meeting_query(item.context)
    if f.meeting_query:
        # A meeting's reply answers both the participants' query and the point just made.
        f.shared_query = sorted(mine & content_stems(words(f.meeting_query)))
        last_fit = (last_fit + min(1.0, len(f.shared_query) / s.overlap_saturation)) / 2
    f.relevance = 0.7 * last_fit + 0.3 * min(1.0, len(f.shared_history) / s.history_saturation)
    f.grounded_share = len(f.shared_history) / len(mine) if mine else 0.0
    context_grams = set(trigrams(context_tokens))
    f.novelty = 1.0 - sum(g in context_grams for g in grams) / len(grams) if grams else 1.0
    f.substance = min(1.0, len(mine) / s.substance_saturation)
    f.unsupported_numbers = sorted(_number_tokens(tokens) - _number_tokens(context_tokens))
    f.addresses_person = any(t in {"you", "your", "you're", "yours", "yourself"} for t in tokens)
    f.violations = _must_not_violations(item.persona.must_not, lower, f)
    return f


def _must_not_violations(rules: list[str], lower_reply: str, f: ReplyFeatures) -> list[str]:
    """'rule: evidence' for each must_not rule the reply visibly breaks."""
    found = []
    for rule in rules:
        rule_lower = rule.lower()
        # Quoted phrases in a rule ("at least...") are banned phrases in their own right.
        markers = [q.strip(" .…!,") for q in re.findall(r"[\"“]([^\"”]+)[\"”]", rule_lower)]
        for triggers, phrases in MUST_NOT_PHRASE_CHECKS:
            if any(t in rule_lower for t in triggers):
                markers.extend(phrases)
        evidence = [m for m in dict.fromkeys(markers) if m and _phrase_in(m, lower_reply)]
        for triggers, test, label in MUST_NOT_COUNT_CHECKS:
            if any(t in rule_lower for t in triggers) and test(f):
                evidence.append(label)
        if evidence:
            found.append(f"{rule} ({', '.join(repr(e) for e in evidence[:3])})")
    return found


def checked_must_not_rules(rules: list[str]) -> dict[str, bool]:
    """Which must_not rules the heuristic can check at all (for docs and roster authors)."""
    triggers = [t for group, _ in MUST_NOT_PHRASE_CHECKS for t in group]
    triggers += [t for group, _, _ in MUST_NOT_COUNT_CHECKS for t in group]
    return {rule: bool(re.search(r"[\"“]", rule)) or any(t in rule.lower() for t in triggers) for rule in rules}


class HeuristicJudge:
    """Deterministic feature-based judge (NOT an LLM): same rubric ids, scores from features.

    It never fails: an empty reply is a valid answer that gets the lowest score on every criterion.
    `seed` is accepted for the `Judge` interface and ignored, since nothing is sampled.
    """

    kind = "heuristic"

    def __init__(self, rubric: Rubric, name: str = "heuristic", settings: HeuristicSettings | None = None):
        if (problem := self.rubric_problem(rubric)) is not None:
            raise ValueError(problem)
        self.rubric = rubric
        self.name = name
        self.settings = settings or HeuristicSettings()

    @staticmethod
    def rubric_problem(rubric: Rubric) -> str | None:
        """Why this judge cannot score the rubric (criteria it has no formula for), or None.
        `mascot config validate` asks this, so a config is refused before anything runs."""
        unsupported = [c for c in rubric.criterion_ids if c not in FORMULAS]
        if not unsupported:
            return None
        return (f"the heuristic judge has no feature formula for criteria {unsupported} of rubric "
                f"'{rubric.name}'; it can score: {', '.join(sorted(FORMULAS))}")

    def __repr__(self) -> str:
        return f"HeuristicJudge(name={self.name!r}, rubric={self.rubric.name!r})"

    def score(self, item: JudgeItem) -> tuple[dict[str, float], ReplyFeatures]:
        features = extract_features(item, self.settings)
        low, high = self.rubric.scale_min, self.rubric.scale_max
        scores = {
            cid: round(low + (high - low) * _clip(FORMULAS[cid](features, self.settings)), 2)
            for cid in self.rubric.criterion_ids
        }
        return scores, features

    def judge_now(self, item: JudgeItem) -> Judgment:
        scores, features = self.score(item)
        return Judgment.succeeded(item, self.name, scores, self._feedback(item, scores, features))

    async def judge(self, item: JudgeItem, seed: int) -> Judgment:
        return self.judge_now(item)

    def _feedback(self, item: JudgeItem, scores: dict[str, float], f: ReplyFeatures) -> str:
        if f.n_words == 0:
            return "Heuristic judge (not an LLM): empty reply, so every criterion gets the lowest score."
        names = {c.id: c.name for c in self.rubric.criteria}
        best, worst = max(scores, key=scores.get), min(scores, key=scores.get)
        notes = []
        if f.boilerplate:
            notes.append(f"assistant boilerplate ({', '.join(f.boilerplate)}) halves every score per kind")
        if f.repetition > 0:
            notes.append(f"{f.repetition:.0%} of word trigrams are repeats")
        if f.length_fit < 1:
            notes.append(f"{f.n_words} words is outside the {self.settings.min_words}-"
                         f"{self.settings.max_words} word band")
        if f.violations:
            notes.append("breaks must-not: " + "; ".join(f.violations))
        if item.persona.asks_questions and f.n_questions != 1:
            notes.append(f"asks {f.n_questions} questions where the persona asks one")
        elif not item.persona.asks_questions and f.n_questions:
            notes.append(f"asks {f.n_questions} question(s) though questioning is not the persona's style")
        notes.append(f"persona words: {', '.join(f.lexicon_hits) or 'none'}")
        notes.append(f"warmth phrases: {', '.join(f.warmth_hits) or 'none'}")
        notes.append(f"content words shared with the last user turn: {', '.join(f.shared_last[:6]) or 'none'}")
        if f.meeting_query:
            notes.append(f"content words shared with the query: {', '.join(f.shared_query[:6]) or 'none'}")
        notes.append(f"VADER compound {f.compound:+.2f}")
        return (f"Heuristic judge (not an LLM). Strongest: {names[best]} {scores[best]:.2f}; weakest: "
                f"{names[worst]} {scores[worst]:.2f}. " + "; ".join(notes) + ".")
