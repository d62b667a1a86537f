"""JSON objects in LLM replies: found wherever the model put them, whatever the backend promised.

A reply may wrap its JSON in a code fence, prefix it with a <think> block or prose, or break it off.
Judges (Stage 1) and the Director (Stage 2) both parse their replies with `extract_json_object`,
then validate the object with their own pydantic model.
"""

from __future__ import annotations

import json
import re
from typing import Any

CODE_FENCE = re.compile(r"```[a-zA-Z0-9_-]*[ \t]*\n?(.*?)```", re.DOTALL)
THINK_BLOCK = re.compile(r"<think>.*?(?:</think>|$)", re.DOTALL)


class ReplyError(ValueError):
    """A reply is not usable. The message says why, for the repair turn that asks again."""


def extract_json_object(text: str, expected_keys: set[str]) -> dict[str, Any]:
    """The first JSON object in `text` that holds all `expected_keys` (else the first holding any).

    Tolerates code fences, a <think> block and prose around the object. Candidates are decoded with
    `json.JSONDecoder.raw_decode` from each "{", so nested braces and braces inside strings are
    handled by the JSON parser itself.
    """
    text = THINK_BLOCK.sub("", text)
    chunks = [m.group(1) for m in CODE_FENCE.finditer(text)] + [text]
    decoder = json.JSONDecoder()
    partial: dict[str, Any] | None = None
    for chunk in chunks:
        start = chunk.find("{")
        while start != -1:
            try:
                found, _ = decoder.raw_decode(chunk, start)
            except json.JSONDecodeError:
                found = None
            if isinstance(found, dict):
                if expected_keys <= found.keys():
                    return found
                if partial is None and expected_keys & found.keys():
                    partial = found
            start = chunk.find("{", start + 1)
    if partial is not None:
        return partial
    raise ReplyError(
        f"no JSON object with the keys {sorted(expected_keys)} was found in the reply"
        + (" (the reply was empty)" if not text.strip() else "")
    )
