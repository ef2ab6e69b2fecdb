"""Retry policies: capped exponential backoff with deterministic jitter."""

from __future__ import annotations

import hashlib
import math
import random
from datetime import timedelta
from typing import Any, Final, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from saga_engine.kernel._retry import capped_exponential


class RetryPolicy(BaseModel):
    """How often and how patiently to retry a step or a compensation.

    ``max_attempts`` counts every send, the first included. The delay before attempt
    ``n + 1`` is ``min(initial_backoff * multiplier**(n-1), max_backoff)`` (computed by
    ``kernel._retry.capped_exponential``: finite at every attempt), then scaled
    by a random factor in ``[1 - jitter, 1]``. The random factor is derived from the saga
    id, the step and the attempt, so a replay computes exactly the same delay.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_attempts: int = Field(default=3, ge=1, le=10_000)
    initial_backoff: timedelta = timedelta(milliseconds=200)
    max_backoff: timedelta = timedelta(seconds=30)
    multiplier: float = Field(default=2.0, ge=1.0)
    jitter: float = Field(default=0.2, ge=0.0, le=1.0)
    #: What a forward step does once it cannot succeed by retrying (its attempts ran out,
    #: or its participant refused it): ``compensate`` (raise StepFailed/StepTimedOut into
    #: the run, which compensates unless it catches them), or ``park`` the saga as
    #: step_stuck, its compensation stack held, until an operator retries the step (with
    #: an edited command if need be) or skips it with a result. Left out of the stored
    #: shape when it is the default, so compensations recorded before it stay the same.
    on_exhausted: Literal["compensate", "park"] = Field(
        default="compensate", exclude_if=lambda v: v == "compensate"
    )

    @model_validator(mode="after")
    def _check(self) -> RetryPolicy:
        if self.initial_backoff < timedelta(0) or self.max_backoff < self.initial_backoff:
            raise ValueError("need 0 <= initial_backoff <= max_backoff")
        return self

    def backoff(self, attempt: int, seed: str) -> timedelta:
        """The delay after failed attempt number ``attempt`` (1-based)."""
        capped = capped_exponential(
            attempt,
            self.initial_backoff.total_seconds(),
            self.max_backoff.total_seconds(),
            self.multiplier,
        )
        digest = hashlib.sha256(f"{seed}:{attempt}".encode()).digest()
        factor = 1.0 - self.jitter * random.Random(digest).random()
        return timedelta(seconds=round(capped * factor, 6))


#: The longest ``retry_after_s`` a retryable reply is honoured for: a participant's hint
#: must not park a step for ever (nor overflow a timedelta).
MAX_RETRY_AFTER: Final = timedelta(days=1)


class _Reply(Protocol):
    """What ``retry_after`` reads of a reply (``ReplyReceived``, which imports this
    module's ``RetryPolicy`` through its parts: named here, not imported)."""

    @property
    def outcome(self) -> str: ...

    @property
    def payload(self) -> Any: ...


def retry_after(reply: _Reply | None) -> timedelta:
    """How long a ``retryable`` reply asks the engine to wait before the next attempt:
    its payload's ``retry_after_s`` (what ``Retryable(after=...)`` sends; 0 for another
    reply, or when absent or not a finite number > 0), at most ``MAX_RETRY_AFTER``. The
    engine waits the longer of this and its retry policy's back-off. Read from the
    recorded reply, so a replay waits the same."""
    if reply is None or reply.outcome != "retryable":
        return timedelta(0)
    value = reply.payload.get("retry_after_s") if isinstance(reply.payload, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return timedelta(0)
    if not math.isfinite(value) or value <= 0:
        return timedelta(0)
    return timedelta(seconds=min(float(value), MAX_RETRY_AFTER.total_seconds()))


#: Compensations must eventually succeed: they retry longer before the saga parks.
DEFAULT_COMPENSATION_RETRY = RetryPolicy(
    max_attempts=10, initial_backoff=timedelta(milliseconds=500), max_backoff=timedelta(seconds=60)
)
DEFAULT_STEP_RETRY = RetryPolicy()

#: A compensation whose step had no timeout still gets one: a lost reply must lead to a
#: re-send (same command id, so the participant deduplicates), never to waiting forever.
DEFAULT_COMPENSATION_TIMEOUT = timedelta(seconds=30)
