"""When to retry a failed request to a server, and how long to wait: a budget in time, and the server's Retry-After.

Two kinds of failure are told apart:

- **A rate limit** (HTTP 429): the server is up and says "later". An API judge at the paper's scale meets it
  for hours on most accounts' tiers, so a count of retries would fail the run however patient it could afford to
  be. A 429 is retried however many times, for as long as the request's retry budget (`retry_budget_s`, from its
  first try) allows.
- **Anything else that may pass** (a refused connection, a timeout, 408, 409, 5xx): the server may be down, and
  a run should say so soon. These are retried at most `max_retries` times, within the same budget.

Each wait is what the server's `Retry-After` says, in seconds or as an HTTP date (or its `retry-after-ms`),
else exponential backoff with jitter: 0.5 s doubling, up to 8 s (60 s for a rate limit without a hint). A wait
that would end past the budget is not waited: the request fails now, with the time it had. (The `openai` client's
own retries count, and cap a Retry-After at 60 s; tenacity decides to stop before it computes the wait, where
this decision depends on the wait.)
"""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

RATE_LIMITED = 429


def retry_after_s(headers: Mapping[str, str] | None, now: datetime | None = None) -> float | None:
    """Seconds the server asks to wait (`retry-after-ms`, or `Retry-After` in seconds or as an HTTP date), or None
    when it says nothing readable. A date in the past is 0."""
    if not headers:
        return None
    milliseconds = headers.get("retry-after-ms")
    if milliseconds is not None:
        try:
            return max(0.0, float(milliseconds) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # an HTTP date is GMT by definition
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 4  # failures other than a rate limit
    budget_s: float = 600.0  # from the request's first try, for every kind of failure

    def wait_s(self, retries_so_far: int, elapsed_s: float, status: int | None,
               headers: Mapping[str, str] | None) -> float | None:
        """How long to wait before the next try of a request that failed (`status` None: no HTTP answer), or None
        to give up. `retries_so_far` counts the retries already made, `elapsed_s` the time since the first try."""
        if status != RATE_LIMITED and retries_so_far >= self.max_retries:
            return None
        hinted = retry_after_s(headers)
        if hinted is None:
            ceiling = 60.0 if status == RATE_LIMITED else 8.0
            hinted = min(0.5 * 2 ** retries_so_far, ceiling) * (0.75 + random.random() / 4)
        if elapsed_s + hinted > self.budget_s:
            return None
        return hinted


class RetryClock:
    """One request's retries under a policy: counts them and measures the time since the first try."""

    def __init__(self, policy: RetryPolicy):
        self.policy, self.retries, self.started = policy, 0, time.monotonic()

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def next_wait(self, status: int | None, headers: Mapping[str, str] | None) -> float | None:
        wait = self.policy.wait_s(self.retries, self.elapsed_s, status, headers)
        if wait is not None:
            self.retries += 1
        return wait
