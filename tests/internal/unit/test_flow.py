"""Flow control in the engine (``_flow.py``, ``_flow_sender.py``), on the in-memory
adapters: limits hold commands (recorded first), replies, timeouts and ends release
their permits, a held attempt's timeout counts from its send, priority orders the
queue. The real-server proofs are in ``tests/internal/e2e/test_flow.py``."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import BaseModel

from saga_engine import Saga, SagaContext, SagaStatus, Settings
from saga_engine.core.planning._flow import FlowQueue, Gate, GateKind, Waiting
from saga_engine.kernel._settings import FlowLimit, LimitsSettings
from saga_engine.runner._flow_sender import FlowControl
from saga_engine.testing import SagaTestEnv
from tests.waiting import eventually


class Job(BaseModel):
    n: int = 0


class Done(BaseModel):
    ok: bool = True


class Ack(BaseModel):
    ok: bool = True


class Work(BaseModel):
    n: int


class Undo(BaseModel):
    n: int


class OneStep(Saga[Job, Done]):
    name = "one-step"

    async def run(self, ctx: SagaContext, job: Job) -> Done:
        await ctx.step(
            "work", to="worker", command=Work(n=job.n), compensate=Undo(n=job.n), timeout=5
        )
        return Done()


def limited(concurrency: int | None = None, rate: float | None = None, **kw: object) -> Settings:
    return Settings(
        limits=LimitsSettings(
            participants={"worker": FlowLimit(concurrency=concurrency, rate=rate)}, **kw
        )
    )


async def nothing() -> None:
    """The clock's settle step: the tests answer commands themselves."""


async def reply_first(env: SagaTestEnv) -> str:
    command = env.bus.pending.popleft()
    await env.engine.reply(command.saga_id, command.command_id, "success", {})
    return command.saga_id


# --------------------------------------------------------------------------- gates


def test_a_gate_enforces_its_partition_share_rounded_up() -> None:
    gate = Gate(GateKind.PARTICIPANT, "p", FlowLimit(concurrency=5, rate=10))
    gate.share = 1 / 4
    assert gate.concurrency == 2  # ceil(5 / 4)
    assert gate.rate == 2.5
    gate.share = 0
    assert gate.concurrency == 0
    assert not gate.admits(0.0)


def test_a_token_bucket_spaces_commands_at_its_rate() -> None:
    gate = Gate(GateKind.PARTICIPANT, "p", FlowLimit(rate=10))
    now = 100.0
    sent = 0
    while now < 102.0:  # two seconds, asked every millisecond
        if gate.admits(now):
            gate.take(now)
            sent += 1
        now += 0.001
    assert 20 <= sent <= 22  # 10/s, plus the first token


def test_limits_are_off_unless_one_is_set() -> None:
    assert not Settings().limits.enabled
    assert not LimitsSettings(participants={"p": FlowLimit()}).enabled
    assert LimitsSettings(saga_types={"t": FlowLimit(rate=1)}).enabled


def test_limits_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAGA_LIMITS__PARTICIPANTS", '{"payments": {"concurrency": 20, "rate": 50}}')
    monkeypatch.setenv("SAGA_LIMITS__AGING_S", "3")
    limits = Settings().limits
    assert limits.participants["payments"] == FlowLimit(concurrency=20, rate=50)
    assert limits.aging_s == 3


async def test_without_limits_the_engine_sends_directly() -> None:
    env = SagaTestEnv([OneStep])
    assert env.parts.flow is None
    assert not isinstance(env.parts.sender, FlowControl)
    await env.engine.start(OneStep, Job(n=0))
    assert len(env.bus.sent) == 1  # on the engine's path: no queue in between


# --------------------------------------------------------------------------- engine


async def test_a_concurrency_limit_holds_commands_until_replies_release_them() -> None:
    env = SagaTestEnv([OneStep], settings=limited(concurrency=2))
    ids = [await env.engine.start(OneStep, Job(n=i)) for i in range(5)]
    # Every command is recorded (durable), only two are sent.
    for saga_id in ids:
        assert any(e.kind == "command_issued" for e in await env.engine.history(saga_id))
    # Every command reached the queue: two hold the permits, three wait for one. Only a
    # permit sends a command, so no third send is still to come.
    flow = env.parts.flow
    assert flow is not None
    await eventually(
        lambda: (flow.snapshot()[0]["in_flight"], flow.snapshot()[0]["waiting"]) == (2, 3)
    )
    assert len(env.bus.sent) == 2
    await reply_first(env)
    await eventually(lambda: len(env.bus.sent) == 3)
    while env.bus.pending:
        await reply_first(env)
        await eventually(lambda: bool(env.bus.pending) or len(env.bus.sent) == 5)
    for saga_id in ids:
        assert (await env.engine.get(saga_id)).status is SagaStatus.COMPLETED
    assert env.parts.flow is not None
    gate = env.parts.flow.snapshot()[0]
    assert (gate["in_flight"], gate["waiting"], gate["sent"]) == (0, 0, 5)


async def test_higher_priority_goes_first_then_fifo() -> None:
    env = SagaTestEnv([OneStep], settings=limited(concurrency=1))
    first = await env.engine.start(OneStep, Job(n=0))
    await eventually(lambda: len(env.bus.sent) == 1)
    low = [await env.engine.start(OneStep, Job(n=i), priority=0) for i in range(1, 4)]
    high = [await env.engine.start(OneStep, Job(n=i), priority=5) for i in range(4, 7)]
    order = [await reply_first(env)]
    while len(order) < 7:
        await eventually(lambda: bool(env.bus.pending))
        order.append(await reply_first(env))
    assert order == [first, *high, *low]


async def test_fairness_keys_take_turns() -> None:
    env = SagaTestEnv([OneStep], settings=limited(concurrency=1))
    first = await env.engine.start(OneStep, Job(n=0))
    await eventually(lambda: len(env.bus.sent) == 1)
    big = [await env.engine.start(OneStep, Job(n=i), fairness_key="big") for i in range(6)]
    small = [await env.engine.start(OneStep, Job(n=i), fairness_key="small") for i in range(2)]
    order = [await reply_first(env)]
    while len(order) < 9:
        await eventually(lambda: bool(env.bus.pending))
        order.append(await reply_first(env))
    assert order[0] == first
    # big arrived first, then the keys alternate while both wait.
    assert order[1:5] == [big[0], small[0], big[1], small[1]]
    assert order[5:] == big[2:]


async def test_compensations_go_before_forward_work() -> None:
    env = SagaTestEnv([OneStep], settings=limited(concurrency=1))
    first = await env.engine.start(OneStep, Job(n=0))
    await eventually(lambda: len(env.bus.sent) == 1)
    waiting = await env.engine.start(OneStep, Job(n=1), priority=100)
    # The first saga is cancelled while its command is out: its compensation waits for
    # the permit, and gets it before the waiting forward command, whatever its priority.
    await env.engine.cancel(first, "test")
    command = env.bus.pending.popleft()
    await env.engine.reply(command.saga_id, command.command_id, "success", {})
    await eventually(lambda: len(env.bus.sent) == 2)
    assert env.bus.sent[1].compensation
    assert env.bus.sent[1].saga_id == first
    await reply_first(env)
    await eventually(lambda: len(env.bus.sent) == 3)
    assert env.bus.sent[2].saga_id == waiting
    assert (await env.engine.get(first)).status is SagaStatus.CANCELLED


async def test_a_held_attempts_timeout_counts_from_its_send() -> None:
    env = SagaTestEnv([OneStep], settings=limited(concurrency=1))
    first = await env.engine.start(OneStep, Job(n=0))
    second = await env.engine.start(OneStep, Job(n=1))
    await eventually(lambda: len(env.bus.sent) == 1)
    # Four seconds of the 5 s timeout pass with the second command still queued.
    await env.clock.advance(timedelta(seconds=4), settle=nothing)
    await reply_first(env)  # the first completes; the second is sent now
    await eventually(lambda: len(env.bus.sent) == 2)
    await env.clock.advance(timedelta(seconds=4), settle=nothing)
    history = await env.engine.history(second)
    assert not any(e.kind == "attempt_timed_out" for e in history)  # 8 s after issue
    await env.clock.advance(timedelta(seconds=2), settle=nothing)  # 6 s after its send: times out
    await eventually(lambda: len(env.bus.sent) == 3)
    history = await env.engine.history(second)
    assert [e.kind for e in history].count("attempt_timed_out") == 1
    assert (await env.engine.get(first)).status is SagaStatus.COMPLETED


async def test_a_timeout_releases_the_permit() -> None:
    env = SagaTestEnv([OneStep], settings=limited(concurrency=1))
    await env.engine.start(OneStep, Job(n=0))
    second = await env.engine.start(OneStep, Job(n=1))
    await eventually(lambda: len(env.bus.sent) == 1)
    env.bus.pending.clear()  # the reply never comes
    await env.clock.advance(timedelta(seconds=6), settle=nothing)
    # The timed-out attempt gave its permit back; the second saga's command got it (the
    # first's re-send, attempt 2, waits behind it).
    await eventually(lambda: len(env.bus.sent) == 2)
    assert env.bus.sent[1].saga_id == second


async def test_a_cancelled_saga_leaves_the_queue() -> None:
    env = SagaTestEnv([OneStep], settings=limited(concurrency=1))
    await env.engine.start(OneStep, Job(n=0))
    queued = await env.engine.start(OneStep, Job(n=1))
    await eventually(lambda: len(env.bus.sent) == 1)
    flow = env.parts.flow
    assert flow is not None
    assert flow.snapshot()[0]["waiting"] == 1
    await env.engine.cancel(queued, "test")
    # Its forward command was never sent: it leaves the queue, and its compensation
    # (owed: the outcome of a recorded command is unknown) queues instead.
    assert flow.snapshot()[0]["waiting"] == 1
    await reply_first(env)
    await eventually(lambda: len(env.bus.sent) == 2)
    assert env.bus.sent[1].compensation
    assert env.bus.sent[1].saga_id == queued
    await reply_first(env)
    await eventually(lambda: flow.snapshot()[0]["in_flight"] == 0)
    assert (await env.engine.get(queued)).status is SagaStatus.CANCELLED


async def test_a_restarted_engine_sends_the_outstanding_commands_through_the_limit() -> None:
    env = SagaTestEnv([OneStep], settings=limited(concurrency=2))
    ids = [await env.engine.start(OneStep, Job(n=i)) for i in range(4)]
    await eventually(lambda: len(env.bus.sent) == 2)
    await env.engine.close()  # the queue dies with the process
    env.bus.pending.clear()
    env.engine = env.new_engine()
    await env.engine.recover()
    await eventually(lambda: len(env.bus.sent) == 4)
    # The new engine's queue holds all four: two sent with the permits, two waiting.
    flow = env.parts.flow
    assert flow is not None
    await eventually(
        lambda: (flow.snapshot()[0]["in_flight"], flow.snapshot()[0]["waiting"]) == (2, 2)
    )
    assert len(env.bus.sent) == 4  # two again, not four
    done = 0
    while done < 4:
        await eventually(lambda: bool(env.bus.pending))
        await reply_first(env)
        done += 1
    for saga_id in ids:
        assert (await env.engine.get(saga_id)).status is SagaStatus.COMPLETED


async def test_a_saga_type_limit_applies_to_its_commands_only() -> None:
    settings = Settings(limits=LimitsSettings(saga_types={"other": FlowLimit(concurrency=1)}))
    env = SagaTestEnv([OneStep], settings=settings)
    for i in range(3):
        await env.engine.start(OneStep, Job(n=i))
    assert len(env.bus.sent) == 3  # not limited: sent at once, on the engine's path


async def test_a_failed_send_keeps_its_place() -> None:
    env = SagaTestEnv([OneStep], settings=limited(concurrency=1))
    env.bus.fail(lambda command: True)  # the broker refuses the first send
    a = await env.engine.start(OneStep, Job(n=0))  # held by the limit: the start is done
    # The queue sends it again after its pause, in its place.
    await eventually(lambda: [c.saga_id for c in env.bus.sent] == [a], timeout=3)
    flow = env.parts.flow
    assert flow is not None
    assert flow.stats["send_failed"] == 1
    await env.engine.close()


def test_queue_pop_skips_closed_lanes() -> None:
    queue = FlowQueue()
    queue.push(Waiting(1, 0.0, 9, "", ("a",)))
    queue.push(Waiting(2, 0.0, 0, "", ("b",)))
    got = queue.pop(0.0, lambda lane: lane != ("a",))
    assert got is not None
    assert got.seq == 2
    assert queue.pop(0.0, lambda lane: lane != ("a",)) is None
    assert len(queue) == 1


async def test_an_evicted_saga_keeps_its_permit_until_its_reply() -> None:
    env = SagaTestEnv([OneStep], settings=limited(concurrency=1))
    first = await env.engine.start(OneStep, Job(n=0))
    await env.engine.start(OneStep, Job(n=1))
    await eventually(lambda: len(env.bus.sent) == 1)
    env.engine.evict(first)  # out of memory; its command is still out
    flow = env.parts.flow
    assert flow is not None
    assert (flow.snapshot()[0]["in_flight"], flow.snapshot()[0]["waiting"]) == (1, 1)
    await reply_first(env)  # reloads it (the re-send keeps the permit), then completes
    await eventually(lambda: len(env.bus.sent) >= 3)
    assert env.bus.sent[1].saga_id == first  # the reload's re-send, same id
    assert env.bus.sent[1].command_id == env.bus.sent[0].command_id
    assert (await env.engine.get(first)).status is SagaStatus.COMPLETED


class Strict(Saga[Job, Done]):
    name = "strict"

    async def run(self, ctx: SagaContext, job: Job) -> Done:
        await ctx.step("work", to="worker", command=Work(n=job.n), timeout=5, returns=Ack)
        return Done()


async def test_a_held_reply_releases_the_permit() -> None:
    env = SagaTestEnv([Strict], settings=limited(concurrency=1))
    held = await env.engine.start(Strict, Job(n=0))
    other = await env.engine.start(Strict, Job(n=1))
    await eventually(lambda: len(env.bus.sent) == 1)
    command = env.bus.pending.popleft()
    # A success its returns= model refuses: held for an operator, the saga step_stuck.
    await env.engine.reply(held, command.command_id, "success", {"ok": "not a bool"})
    assert (await env.engine.get(held)).status is SagaStatus.STEP_STUCK
    await eventually(lambda: len(env.bus.sent) == 2)
    assert env.bus.sent[1].saga_id == other


async def test_a_saga_type_limit_holds_its_commands() -> None:
    settings = Settings(limits=LimitsSettings(saga_types={"one-step": FlowLimit(concurrency=1)}))
    env = SagaTestEnv([OneStep], settings=settings)
    for i in range(3):
        await env.engine.start(OneStep, Job(n=i))
    await eventually(lambda: len(env.bus.sent) == 1)
    assert env.parts.flow is not None
    (gate,) = env.parts.flow.snapshot()
    assert (gate["kind"], gate["name"], gate["in_flight"], gate["waiting"]) == (
        "saga_type",
        "one-step",
        1,
        2,
    )
