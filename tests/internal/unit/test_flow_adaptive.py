"""An adaptive concurrency limit in the engine (``FlowLimit(concurrency="adaptive")``), on
the in-memory adapters: it starts at its minimum, holds what is above it, learns from
each reply (its latency from the send) and shrinks on a timeout; its bounds are checked
and follow this engine's share."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from pydantic import BaseModel, ValidationError

from saga_engine import Saga, SagaContext, Settings
from saga_engine.core.planning._flow import Gate, GateKind
from saga_engine.kernel._settings import FlowLimit, LimitsSettings
from saga_engine.testing import SagaTestEnv
from tests.waiting import eventually


class Job(BaseModel):
    n: int = 0


class Done(BaseModel):
    ok: bool = True


class Work(BaseModel):
    n: int


class Steady(Saga[Job, Done]):
    name = "steady"

    async def run(self, ctx: SagaContext, job: Job) -> Done:
        await ctx.step("work", to="worker", command=Work(n=job.n), timeout=5)
        return Done()


def adaptive(low: int = 2, high: int = 50) -> Settings:
    return Settings(
        limits=LimitsSettings(
            participants={
                "worker": FlowLimit(
                    concurrency="adaptive", min_concurrency=low, max_concurrency=high
                )
            }
        )
    )


def test_its_bounds_are_checked() -> None:
    with pytest.raises(ValidationError, match=r"min_concurrency \(5\) is above max_concurrency"):
        FlowLimit(concurrency="adaptive", min_concurrency=5, max_concurrency=2)
    with pytest.raises(ValidationError, match='set concurrency="adaptive"'):
        FlowLimit(concurrency=4, max_concurrency=8)
    assert FlowLimit(concurrency="adaptive").adaptive_bounds == (1, 1000)


def test_its_bounds_follow_the_partition_share() -> None:
    gate = Gate(
        GateKind.PARTICIPANT,
        "p",
        FlowLimit(concurrency="adaptive", min_concurrency=4, max_concurrency=40),
    )
    assert gate.adaptive is not None
    assert gate.concurrency == 4
    gate.set_share(0.25)
    assert (gate.adaptive.min_limit, gate.adaptive.max_limit, gate.concurrency) == (1, 10, 4)
    gate.set_share(0)
    assert gate.concurrency == 0


async def test_it_learns_from_replies_and_shrinks_on_a_timeout() -> None:
    env = SagaTestEnv([Steady], settings=adaptive())
    ids = [await env.engine.start(Steady, Job(n=i)) for i in range(30)]
    flow = env.parts.flow
    assert flow is not None

    def view() -> dict[str, object]:
        found = flow.snapshot()[0]["adaptive"]
        assert isinstance(found, dict)
        return found

    await eventually(lambda: len(env.bus.sent) == 2)  # it starts at its minimum
    assert view()["limit"] == 2
    answered = 0
    while answered < 20:
        command = env.bus.pending.popleft()
        await env.engine.reply(command.saga_id, command.command_id, "success", {})
        answered += 1
        await eventually(lambda: bool(env.bus.pending))
    learnt = view()
    assert learnt["replies"] == 20
    assert learnt["baseline_ms"] is not None
    grown = learnt["limit"]
    assert isinstance(grown, int)
    assert grown > 2  # replies came back fast: it grew
    assert learnt["cause"] == "latency_held"
    await eventually(lambda: len(env.bus.sent) == 20 + grown)  # as many out as it allows
    # Nothing answers for 5 s: the attempts in flight time out, each a tenth off.
    env.participant("worker").on(Work, no_reply=True)
    await env.advance(timedelta(seconds=6))
    shrunk = view()
    assert shrunk["timeouts"] == grown
    assert shrunk["cause"] == "timeout"
    limit = shrunk["limit"]
    assert isinstance(limit, int)
    assert limit < grown
    assert len(ids) == 30


async def test_what_it_learns_in_the_testing_kit_does_not_depend_on_the_machine() -> None:
    """In the testing kit a reply's latency is virtual time: a machine slow enough that
    later replies take longer in real time (here, the test itself pausing more and more
    before it answers) leaves the limit as a fast one would (before, it measured real
    time, and a busy machine made the limit see "latency rose" and not grow)."""
    env = SagaTestEnv([Steady], settings=adaptive())
    for i in range(30):
        await env.engine.start(Steady, Job(n=i))
    flow = env.parts.flow
    assert flow is not None
    await eventually(lambda: len(env.bus.sent) == 2)
    for answered in range(20):
        command = env.bus.pending.popleft()
        time.sleep(0.002 * answered)  # noqa: ASYNC251 - a busier and busier machine, loop and all
        await env.engine.reply(command.saga_id, command.command_id, "success", {})
        await eventually(lambda: bool(env.bus.pending))
    learnt = flow.snapshot()[0]["adaptive"]
    assert isinstance(learnt, dict)
    assert learnt["replies"] == 20
    assert learnt["cause"] == "latency_held"
    assert isinstance(learnt["limit"], int)
    assert learnt["limit"] > 2
