"""LLM judge: a model scores a candidate against the rubric and writes feedback, as JSON.

The request asks for structured output (an OpenAI-style strict JSON schema). Backends that cannot
enforce it (the in-process transformers backend) still get the schema's wording in the prompt,
and every reply is parsed and validated here whatever the backend claims. An invalid reply is
retried with a repair turn; after `max_attempts` the judgment is recorded as failed, never as 0.
Backend errors (`mascot.llm.BackendError`) are not judging failures: they propagate, and the
orchestrator retries them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, create_model

from mascot.config import SamplingParams
from mascot.data.context import Context
from mascot.data.qmsum import meeting_query
from mascot.judges.base import JudgeItem, Judgment
from mascot.llm import LLMBackend
from mascot.llm.structured import ReplyError, extract_json_object
from mascot.prompts import render
from mascot.rubrics import Rubric

# Our delimiter tags; the same text inside data would let a context close its own block.
DELIMITER_TAG = re.compile(r"<(/?\s*(?:persona|personas|query|context|candidate|block|a|b)\b)", re.IGNORECASE)
EMPTY_REPLY = "(empty reply)"


class JudgeReplyError(ReplyError):
    """A judge's reply is not a usable judgment. The message says why, for the repair turn."""


def escape_data(text: str) -> str:
    """Defuse our own delimiter tags inside data, so data cannot end its block early."""
    return DELIMITER_TAG.sub(r"&lt;\1", text)


def judge_messages(rubric: Rubric, item: JudgeItem) -> list[dict[str, str]]:
    """The first request: instructions and rubric (system), then the delimited data (user): the
    persona, the context's query when it has one (what relevance is judged against), the
    conversation and the candidate."""
    query = meeting_query(item.context)
    system = render("judge.j2", section="system", rubric=rubric, domain=item.context.domain, query=query)
    user = render(
        "judge.j2", section="user", persona=item.persona, query=query and escape_data(query),
        turns=_context_turns(item.context), candidate=escape_data(item.candidate.strip()) or EMPTY_REPLY,
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def _context_turns(context: Context) -> list[dict[str, str]]:
    default = {"user": "User", "assistant": "Companion", "system": "System"}
    # Meeting transcripts label turns by speaker; emotional-support ids ('3', '14') mean nothing.
    use_names = context.domain == "meetings"
    return [
        {"speaker": escape_data(m.name if use_names and m.name else default[m.role]), "text": escape_data(m.content)}
        for m in context.history
    ]


def judge_response_format(rubric: Rubric) -> dict[str, Any]:
    """OpenAI-style strict JSON schema: feedback plus one integer per criterion, nothing else.

    `feedback` comes first on purpose: constrained decoders write keys in schema order, so the
    model explains itself before it commits to numbers.
    """
    properties: dict[str, Any] = {"feedback": {"type": "string"}}
    for criterion_id in rubric.criterion_ids:
        properties[criterion_id] = {"type": "integer", "minimum": rubric.scale_min, "maximum": rubric.scale_max}
    schema = {"type": "object", "properties": properties, "required": list(properties),
              "additionalProperties": False}
    return {"type": "json_schema", "json_schema": {"name": "judgment", "strict": True, "schema": schema}}


def _whole_number(value: Any) -> int:
    # Judges write 4 or 4.0; "4", true and 4.5 are not scores on an integer scale.
    if isinstance(value, bool) or not isinstance(value, int | float):
        # ValueError, not TypeError: pydantic turns only ValueError into a validation error.
        raise ValueError(f"expected a whole number, got {type(value).__name__}")  # noqa: TRY004
    if isinstance(value, float) and not value.is_integer():
        raise ValueError("expected a whole number, got a fraction")
    return int(value)


def reply_model(rubric: Rubric) -> type[BaseModel]:
    """Pydantic model of a valid reply. Extra keys are ignored: the strict schema already forbids
    them where the backend enforces it, and a stray "reasoning" key does not make scores wrong."""
    score = Annotated[int, BeforeValidator(_whole_number), Field(ge=rubric.scale_min, le=rubric.scale_max)]
    # Field names are positional and the criterion ids are aliases, so an id can never clash
    # with a BaseModel attribute.
    fields: dict[str, Any] = {f"criterion_{i}": (score, Field(alias=cid)) for i, cid in enumerate(rubric.criterion_ids)}
    return create_model(
        "JudgeReply", __config__=ConfigDict(extra="ignore"), feedback=(str, ...), **fields
    )


def parse_judge_reply(text: str, rubric: Rubric) -> tuple[dict[str, int], str]:
    """(scores by criterion id, feedback) from a reply, or JudgeReplyError saying what is wrong."""
    expected = set(rubric.criterion_ids)
    try:
        data = extract_json_object(text, expected | {"feedback"})
    except ReplyError as exc:
        raise JudgeReplyError(str(exc)) from None
    try:
        reply = reply_model(rubric).model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            key = ".".join(str(part) for part in err["loc"]) or "reply"
            got = "" if err["type"] == "missing" else f" (got {json.dumps(err.get('input'))[:40]})"
            message = err["msg"].removeprefix("Value error, ")
            problems.append(f'"{key}": {message}{got}')
        raise JudgeReplyError("invalid JSON object: " + "; ".join(problems)) from None
    dumped = reply.model_dump(by_alias=True)
    return {cid: dumped[cid] for cid in rubric.criterion_ids}, dumped["feedback"].strip()


class LLMJudge:
    """Score candidates with an LLM backend; retry invalid replies; record failures honestly."""

    kind = "llm"

    def __init__(
        self,
        backend: LLMBackend,
        rubric: Rubric,
        name: str,
        max_attempts: int = 3,
        params: SamplingParams | None = None,
        messages: Callable[[Rubric, Any], list[dict[str, str]]] | None = None,
    ):
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        self.backend = backend
        self.rubric = rubric
        self.name = name
        self.max_attempts = max_attempts
        self.params = params or SamplingParams(temperature=0.0, max_new_tokens=768)
        self.response_format = judge_response_format(rubric)
        # What is judged decides the prompt: one reply (Stage 1) or a block of a group's turns (Stage 2).
        self.messages = messages or judge_messages

    @staticmethod
    def rubric_problem(rubric: Rubric) -> str | None:
        """None: the prompt and the reply's schema are built from the rubric's own criteria, so an LLM
        judge can score any rubric (whether it suits what is judged is the config's choice)."""
        return None

    def __repr__(self) -> str:
        return f"LLMJudge(name={self.name!r}, backend={self.backend!r}, max_attempts={self.max_attempts})"

    def repair_message(self, error: str) -> dict[str, str]:
        text = render("judge_repair.j2", error=error, keys=self.rubric.criterion_ids,
                      scale_min=self.rubric.scale_min, scale_max=self.rubric.scale_max)
        return {"role": "user", "content": text}

    async def judge(self, item: JudgeItem, seed: int) -> Judgment:
        messages = self.messages(self.rubric, item)
        error = "no attempt was made"
        for attempt in range(self.max_attempts):
            # A retry carries the invalid answer and the repair request, so it is a different
            # request (and request-cache key) than the one that produced the invalid answer.
            texts = await self.backend.generate(
                messages, n=1, params=self.params, seed=seed + attempt, response_format=self.response_format
            )
            reply = texts[0]
            try:
                scores, feedback = parse_judge_reply(reply, self.rubric)
            except JudgeReplyError as exc:
                error = str(exc)
                messages = [*messages, {"role": "assistant", "content": reply.strip() or EMPTY_REPLY},
                            self.repair_message(error)]
                continue
            return Judgment.succeeded(item, self.name, scores, feedback, attempts=attempt + 1)
        return Judgment.failed(item, self.name, error, attempts=self.max_attempts)
