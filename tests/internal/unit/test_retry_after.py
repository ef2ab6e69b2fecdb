"""``Retryable(after=...)`` is honoured: the engine waits the longer of the reply's
``retry_after_s`` and its retry policy's back-off before the next attempt (issue 39, 3)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from pydantic import BaseModel

from saga_engine import RetryPolicy, Saga, SagaContext, SagaStatus
from saga_engine.core.history._policy import MAX_RETRY_AFTER, retry_after
from saga_engine.events import CommandIssued, ReplyReceived, TimerStarted
from saga_engine.testing import SagaTestEnv

NOW = datetime(2030, 1, 1, tzinfo=UTC)


class Cmd(BaseModel):
    n: int


class Nothing(BaseModel):
    pass


class OneStep(Saga[Nothing, Nothing]):
    name = "one_step"

    async def run(self, ctx: SagaContext, input: Nothing) -> Nothing:
        # Compensations' retries honour it too; a forward step shows it.
        await ctx.step(
            "only",
            to="p",
            command=Cmd(n=1),
            retry=RetryPolicy(max_attempts=3, initial_backoff=timedelta(milliseconds=50)),
        )
        return Nothing()


async def test_the_next_attempt_waits_at_least_retry_after() -> None:
    env = SagaTestEnv([OneStep])
    env.hold(lambda c: c.attempt == 1)  # the first attempt's answer is given by hand
    run = await env.start(OneStep, Nothing())
    [first] = env.held
    # What the kit sends for Retryable("busy", after=30): see participant._handler.
    await env.engine.reply(
        run.saga_id,
        first.command_id,
        "retryable",
        {"retry_after_s": 30.0},
        "busy (retry after 30s)",
    )
    await env.settle()

    history = await run.history()
    [timer] = [e for e in history if isinstance(e, TimerStarted) and e.purpose == "retry"]
    assert timer.fire_at - timer.at >= timedelta(seconds=30)  # the policy alone: ~50 ms
    await env.advance(timedelta(seconds=29))
    issued = [e for e in await run.history() if isinstance(e, CommandIssued)]
    assert len(issued) == 1, "retried before retry_after_s passed"
    await env.advance(timedelta(seconds=2))
    assert await env.run_until_settled(run) == SagaStatus.COMPLETED
    issued = [e for e in await run.history() if isinstance(e, CommandIssued)]
    assert [e.attempt for e in issued] == [1, 2]


@pytest.mark.parametrize(
    ("payload", "seconds"),
    [
        ({"retry_after_s": 2.5}, 2.5),
        ({"retry_after_s": 7}, 7.0),
        ({}, 0.0),
        (None, 0.0),
        ({"retry_after_s": -1}, 0.0),
        ({"retry_after_s": "30"}, 0.0),
        ({"retry_after_s": True}, 0.0),
        ({"retry_after_s": float("nan")}, 0.0),
        ({"retry_after_s": 1e300}, MAX_RETRY_AFTER.total_seconds()),
    ],
)
def test_retry_after_reads_only_a_finite_delay_and_caps_it(payload: object, seconds: float) -> None:
    reply = ReplyReceived(
        at=NOW, step="only", command_id="c", outcome="retryable", payload=cast(Any, payload or {})
    )
    assert retry_after(reply) == timedelta(seconds=seconds)


def test_only_a_retryable_reply_asks_for_a_wait() -> None:
    wait = {"retry_after_s": 30}
    assert retry_after(None) == timedelta(0)
    reply = ReplyReceived(at=NOW, step="only", command_id="c", outcome="failure", payload=wait)
    assert retry_after(reply) == timedelta(0)
