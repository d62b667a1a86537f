"""Streaming a reply as it is generated, with the same final text as `generate` gives.

`generate` returns a reply cut at its first stop string and stripped of surrounding whitespace. A
stream must never show text that the finished reply will not have, so `ReplyDeltas` holds back what
might still change: the last characters that could be the start of a stop string, trailing
whitespace (it is stripped if nothing follows), and a trailing replacement character (a character
whose bytes are split over two tokens decodes as U+FFFD until its last byte arrives). What it lets
through is always a prefix of the final text, so the deltas a stream yields add up to exactly the
text `generate` returns for the same request.

`stream_reply` streams from any backend: those with a `stream` method (the in-process and the
OpenAI-compatible backends) yield as tokens arrive, and the others yield their whole reply at once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from mascot.config import SamplingParams
from mascot.llm.base import MessageLike, truncate_at_stop

REPLACEMENT = "\ufffd"


class ReplyDeltas:
    """Turns successive raw texts of one reply (each extending the last) into deltas of its final text."""

    def __init__(self, stop: Sequence[str]):
        self.stop = [s for s in stop if s]
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.sent = ""

    def final(self, raw: str) -> str:
        return truncate_at_stop(raw, self.stop).strip()

    def update(self, raw: str) -> str:
        """The new text that is safe to show, given the reply's raw text so far."""
        text = truncate_at_stop(raw, self.stop)
        if len(text) == len(raw):  # no stop string yet: one may be starting in the last characters
            text = text[:max(0, len(text) - self.hold)]
        return self._advance(text.strip().rstrip(REPLACEMENT).rstrip())

    def finish(self, raw: str) -> str:
        """The rest of the final text, once the reply's raw text is complete."""
        return self._advance(self.final(raw))

    def _advance(self, shown: str) -> str:
        if len(shown) <= len(self.sent):
            return ""
        if not shown.startswith(self.sent):  # cannot happen for a raw text that only grows; a bug if it does
            raise RuntimeError(f"streamed text {self.sent!r} is not a prefix of the reply {shown!r}")
        delta, self.sent = shown[len(self.sent):], shown
        return delta


async def stream_reply(backend, messages: Sequence[MessageLike], params: SamplingParams,
                       seed: int) -> AsyncIterator[str]:
    """The deltas of one reply; they add up to `(await backend.generate(messages, 1, params, seed))[0]`."""
    if hasattr(backend, "stream"):
        async for delta in backend.stream(messages, params, seed):
            yield delta
    else:
        text = (await backend.generate(messages, n=1, params=params, seed=seed))[0]
        if text:
            yield text
