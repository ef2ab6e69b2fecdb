"""The engine's saga semantics, through the testing kit (in memory, virtual time)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from pydantic import BaseModel

from saga_engine import (
    Engine,
    InvalidTransition,
    KafkaSettings,
    PayloadTooLarge,
    RetryPolicy,
    Saga,
    SagaContext,
    SagaStatus,
    SerializationError,
    Settings,
    StepFailed,
)
from saga_engine.testing import SagaTestEnv
from tests.sagas import (
    Approval,
    OrderRequest,
    OrderResult,
    PlaceOrder,
    QuoteShipping,
    ReleaseCredit,
    ReserveCredit,
    ReserveStock,
    ShippingQuote,
    StockReserved,
)


class Cmd(BaseModel):
    n: int


class Undo(BaseModel):
    n: int


class Count(BaseModel):
    steps: int = 3


class Done(BaseModel):
    values: list[str] = []


class ThreeSteps(Saga[Count, Done]):
    name = "three-steps"

    async def run(self, ctx: SagaContext, input: Count) -> Done:
        for i in range(1, input.steps + 1):
            await ctx.step(f"step-{i}", to=f"p{i}", command=Cmd(n=i), compensate=Undo(n=i))
        return Done()


def _happy(env: SagaTestEnv) -> None:
    env.participant("inventory").on(ReserveStock, reply=StockReserved(reservation="r-1"))
    env.participant("shipping").on(QuoteShipping, reply=ShippingQuote(price=7))


async def test_place_order_completes() -> None:
    env = SagaTestEnv([PlaceOrder])
    _happy(env)
    run = await env.start(PlaceOrder, OrderRequest(customer="c1", total=30))
    assert await run.status() == SagaStatus.RUNNING  # sleeping one minute
    assert await env.run_until_settled(run) == SagaStatus.COMPLETED
    assert await run.output() == OrderResult(
        status="confirmed", stock_reservation="r-1", shipping_quote=7
    )
    assert [c.step for c in env.commands()] == ["reserve-credit", "reserve-stock", "quote-shipping"]
    assert env.commands(compensation=True) == []


async def test_failure_at_step_three_compensates_two_then_one() -> None:
    env = SagaTestEnv([ThreeSteps])
    env.participant("p3").on(Cmd, reject="no capacity")
    run = await env.start(ThreeSteps, Count(steps=3))
    assert await run.status() == SagaStatus.COMPENSATED
    assert env.compensated_steps() == ["step-2", "step-1"]
    comps = env.commands(compensation=True)
    assert [(c.participant, c.command_type, c.payload) for c in comps] == [
        ("p2", "Undo", {"n": 2}),
        ("p1", "Undo", {"n": 1}),
    ]
    error = await run.error()
    assert error is not None
    assert error["step"] == "step-3"
    assert "no capacity" in error["message"]
    kinds = [e.kind for e in await run.history()]
    assert kinds[-1] == "saga_compensated"
    assert kinds.count("compensation_completed") == 2


async def test_failure_at_first_step_fails_without_compensation() -> None:
    env = SagaTestEnv([ThreeSteps])
    env.participant("p1").on(Cmd, reject="nope")
    run = await env.start(ThreeSteps, Count(steps=3))
    assert await run.status() == SagaStatus.FAILED
    assert env.commands(compensation=True) == []


async def test_timeouts_resend_the_same_id_then_compensate_the_unknown_step() -> None:
    env = SagaTestEnv([PlaceOrder])
    env.participant("payments").on(ReserveCredit, no_reply=True)
    run = await env.start(PlaceOrder, OrderRequest(customer="c1", total=30))
    assert await env.run_until_settled(run) == SagaStatus.COMPENSATED
    forward = env.commands("payments", compensation=False)
    assert len(forward) == 5  # RetryPolicy(max_attempts=5)
    assert len({c.command_id for c in forward}) == 1, "a timed-out attempt is re-sent under its id"
    assert [c.attempt for c in forward] == [1, 2, 3, 4, 5]
    # The outcome is unknown, so the compensation is owed and sent.
    assert env.compensated_steps() == ["reserve-credit"]
    error = await run.error()
    assert error is not None
    assert error["type"] == "StepTimedOut"


class RetryableSaga(Saga[Count, Done]):
    name = "retryable"

    async def run(self, ctx: SagaContext, input: Count) -> Done:
        await ctx.step("only", to="p", command=Cmd(n=1), retry=RetryPolicy(max_attempts=3))
        return Done()


async def test_retryable_reply_retries_under_a_new_id() -> None:
    env = SagaTestEnv([RetryableSaga])
    env.participant("p").on(Cmd, retryable="db busy", times=2)
    run = await env.start(RetryableSaga, Count())
    assert await env.run_until_settled(run) == SagaStatus.COMPLETED
    sent = env.commands("p")
    assert len(sent) == 3
    assert len({c.command_id for c in sent}) == 3


async def test_approval_signal_completes_and_may_arrive_early() -> None:
    env = SagaTestEnv([PlaceOrder])
    _happy(env)
    run = await env.start(PlaceOrder, OrderRequest(customer="c", total=5, needs_approval=True))
    await env.signal(run, "approval", Approval(approved=True, by="boss"))
    assert await env.run_until_settled(run) == SagaStatus.COMPLETED


async def test_signal_timeout_compensates() -> None:
    env = SagaTestEnv([PlaceOrder])
    _happy(env)
    run = await env.start(PlaceOrder, OrderRequest(customer="c", total=5, needs_approval=True))
    await env.advance(timedelta(hours=3))
    assert await run.status() == SagaStatus.RUNNING
    await env.advance(timedelta(hours=1, seconds=1))
    assert await run.status() == SagaStatus.COMPENSATED
    assert env.compensated_steps() == ["reserve-stock", "reserve-credit"]
    error = await run.error()
    assert error is not None
    assert error["type"] == "SignalTimeout"


async def test_rejected_approval_compensates_in_reverse_order() -> None:
    env = SagaTestEnv([PlaceOrder])
    _happy(env)
    run = await env.start(PlaceOrder, OrderRequest(customer="c", total=5, needs_approval=True))
    await env.signal(run, "approval", Approval(approved=False, by="auditor"))
    assert await run.status() == SagaStatus.COMPENSATED
    assert env.compensated_steps() == ["reserve-stock", "reserve-credit"]


async def test_cancel_while_waiting_runs_the_owed_compensations() -> None:
    env = SagaTestEnv([PlaceOrder])
    _happy(env)
    run = await env.start(PlaceOrder, OrderRequest(customer="c", total=5, needs_approval=True))
    await env.cancel(run, "customer changed their mind")
    assert await run.status() == SagaStatus.CANCELLED
    assert env.compensated_steps() == ["reserve-stock", "reserve-credit"]
    history = await run.history()
    assert history[-1].kind == "saga_cancelled"
    with pytest.raises(InvalidTransition, match="cancelled; it accepts no cancel"):
        await env.cancel(run)


async def test_cancel_with_a_step_in_flight_compensates_it_too() -> None:
    env = SagaTestEnv([ThreeSteps])
    env.participant("p2").on(Cmd, no_reply=True)
    run = await env.start(ThreeSteps, Count(steps=3))
    await env.cancel(run, "stop")
    assert await run.status() == SagaStatus.CANCELLED
    assert env.compensated_steps() == ["step-2", "step-1"]


class SlowSaga(Saga[Count, Done]):
    name = "slow"
    deadline = timedelta(minutes=10)

    async def run(self, ctx: SagaContext, input: Count) -> Done:
        await ctx.step("first", to="p", command=Cmd(n=1), compensate=Undo(n=1))
        await ctx.sleep(timedelta(hours=1))
        return Done()


async def test_deadline_compensates() -> None:
    env = SagaTestEnv([SlowSaga])
    run = await env.start(SlowSaga, Count())
    assert await env.run_until_settled(run) == SagaStatus.COMPENSATED
    error = await run.error()
    assert error is not None
    assert error["type"] == "DeadlineExceeded"
    assert env.compensated_steps() == ["first"]


class StuckSaga(Saga[Count, Done]):
    name = "stuck"

    async def run(self, ctx: SagaContext, input: Count) -> Done:
        await ctx.step(
            "charge",
            to="payments",
            command=Cmd(n=1),
            compensate=Undo(n=1),
            compensate_retry=RetryPolicy(max_attempts=2),
        )
        await ctx.step("ship", to="shipping", command=Cmd(n=2))
        return Done()


async def test_failing_compensation_parks_as_stuck_then_resume_retries() -> None:
    env = SagaTestEnv([StuckSaga])
    env.participant("shipping").on(Cmd, reject="no trucks")
    env.participant("payments").on(Undo, reject="ledger locked", times=2)
    run = await env.start(StuckSaga, Count())
    assert await env.run_until_settled(run) == SagaStatus.COMPENSATION_STUCK
    error = await run.error()
    assert error is not None
    assert "still failing after 2 attempts" in error["message"]
    assert len(env.commands("payments", compensation=True)) == 2
    with pytest.raises(InvalidTransition, match="already undoing its steps"):
        await env.cancel(run)
    await env.resume(run)
    assert await run.status() == SagaStatus.COMPENSATED
    kinds = [e.kind for e in await run.history()]
    assert "compensation_stuck" in kinds
    assert "saga_resumed" in kinds
    with pytest.raises(InvalidTransition):
        await env.resume(run)


class Tolerant(Saga[Count, Done]):
    name = "tolerant"

    async def run(self, ctx: SagaContext, input: Count) -> Done:
        try:
            await ctx.step("optional", to="p", command=Cmd(n=1))
        except StepFailed as exc:
            return Done(values=[exc.reason])
        return Done(values=["ok"])


async def test_saga_may_catch_a_step_failure() -> None:
    env = SagaTestEnv([Tolerant])
    env.participant("p").on(Cmd, reject="not today")
    run = await env.start(Tolerant, Count())
    assert await run.output() == Done(values=["not today"])


async def test_duplicate_reply_is_dropped_and_counted() -> None:
    env = SagaTestEnv([ThreeSteps])
    env.participant("p1").on(Cmd, duplicate=True)
    run = await env.start(ThreeSteps, Count(steps=2))
    assert await run.status() == SagaStatus.COMPLETED
    assert env.parts.stats.counts["dropped_duplicate_reply"] == 1
    replies = [e for e in await run.history() if e.kind == "reply_received"]
    assert len(replies) == 2


class Deterministic(Saga[Count, Done]):
    name = "deterministic"

    async def run(self, ctx: SagaContext, input: Count) -> Done:
        a = str(ctx.uuid())
        b = f"{ctx.random():.12f}"
        c = await ctx.side_effect(lambda: __import__("uuid").uuid4().hex)
        t = ctx.now().isoformat()
        await ctx.step("wait", to="p", command=Cmd(n=1))
        return Done(values=[a, b, c, t, str(ctx.uuid()), ctx.now().isoformat()])


async def test_now_uuid_random_and_side_effects_survive_replay() -> None:
    env = SagaTestEnv([Deterministic])
    env.participant("p").on(Cmd, no_reply=True)
    run = await env.start(Deterministic, Count())
    first_values = [c.command_id for c in env.commands()]
    env.engine.evict(run.saga_id)  # the next input rebuilds it by replay
    command = env.commands()[0]
    await env.advance(timedelta(seconds=5))
    await env.engine.reply(run.saga_id, command.command_id, "success")
    live = await run.output()
    assert isinstance(live, Done)
    # Replaying the whole history from scratch yields the very same values.
    env.engine.evict(run.saga_id)
    from saga_engine.core.runtime._runtime import SagaRuntime

    definition = env.parts.registry.get("deterministic")
    replayed, decision = SagaRuntime.replay(definition, run.saga_id, await run.history())
    assert decision.events == []
    assert decision.nondeterminism is None
    assert replayed.output == live.model_dump()
    assert first_values == [command.command_id]
    assert live.values[3] != live.values[5], "now() moves with the events handled"


async def test_idempotent_start_gives_one_saga() -> None:
    env = SagaTestEnv([ThreeSteps])
    a = await env.start(ThreeSteps, Count(steps=1), idempotency_key="order-42")
    b = await env.start(ThreeSteps, Count(steps=1), idempotency_key="order-42")
    assert a.saga_id == b.saga_id
    assert len(await env.store.list_sagas()) == 1
    assert len(env.commands()) == 1
    assert env.parts.stats.counts["start_deduplicated"] == 1


async def test_bad_input_and_oversized_payload_are_refused_and_store_nothing() -> None:
    env = SagaTestEnv(
        [ThreeSteps],
        settings=Settings(kafka=KafkaSettings(max_message_bytes=1024)),
    )
    with pytest.raises(SerializationError, match="does not match Count"):
        await env.engine.start(ThreeSteps, {"steps": "many"})
    with pytest.raises(PayloadTooLarge, match="exceeds the limit of 1,024 bytes"):
        await env.engine.start(ThreeSteps, {"steps": 1, "pad": "x" * 2000})
    assert await env.store.list_sagas() == []


async def test_engine_rejects_a_signal_for_an_unknown_saga() -> None:
    env = SagaTestEnv([ThreeSteps])
    from saga_engine import SagaNotFound

    with pytest.raises(SagaNotFound, match="no saga with id 'ghost'"):
        await env.engine.signal("ghost", "approval", {})
    assert isinstance(env.engine, Engine)


async def test_compensation_is_never_sent_for_a_step_without_one() -> None:
    env = SagaTestEnv([PlaceOrder])
    env.participant("inventory").on(ReserveStock, reply=StockReserved(reservation="r"))
    env.participant("shipping").on(QuoteShipping, reject="no route")
    run = await env.start(PlaceOrder, OrderRequest(customer="c", total=5))
    assert await run.status() == SagaStatus.COMPENSATED
    assert "quote-shipping" not in env.compensated_steps()
    assert env.compensated_steps() == ["reserve-stock", "reserve-credit"]
    releases = env.commands("payments", compensation=True)
    assert [c.command_type for c in releases] == [ReleaseCredit.__name__]


async def test_compensations_name_the_forward_command_ids_they_undo() -> None:
    env = SagaTestEnv([ThreeSteps])
    env.participant("p2").on(Cmd, retryable="busy", times=1)
    env.participant("p3").on(Cmd, reject="no capacity")
    run = await env.start(ThreeSteps, Count(steps=3))
    assert await env.run_until_settled(run) == SagaStatus.COMPENSATED
    forward: dict[str, list[str]] = {}
    for c in env.commands(compensation=False):
        forward.setdefault(c.step, [])
        if c.command_id not in forward[c.step]:
            forward[c.step].append(c.command_id)
    assert len(forward["step-2"]) == 2, "a retryable reply moved step-2 to a new command id"
    for comp in env.commands(compensation=True):
        assert list(comp.compensates) == forward[comp.step]


class UsesHttp(Saga[Count, Done]):
    name = "uses-http"

    async def run(self, ctx: SagaContext, input: Count) -> Done:
        verdict = await ctx.http_step(
            "fraud", endpoint="fraud", path="/check", json={"n": input.steps}
        )
        return Done(values=[str(verdict["approved"])])


async def test_http_steps_are_scripted_like_any_participant() -> None:
    env = SagaTestEnv([UsesHttp])
    env.participant("http:fraud").on("HttpRequest", reply={"approved": True})
    run = await env.start(UsesHttp, Count(steps=2))
    assert await run.output() == Done(values=["True"])
    (call,) = env.commands("http:fraud")
    assert call.payload == {"method": "POST", "path": "/check", "body": {"n": 2}}


# --------------------------------------------------------------------------- the kit itself


class OneStep(Saga[Count, Done]):
    name = "one-step"

    async def run(self, ctx: SagaContext, input: Count) -> Done:
        reply = await ctx.step(
            "only", to="p", command=Cmd(n=1), retry=RetryPolicy(max_attempts=5), timeout=30
        )
        return Done(values=[str(reply.get("v")), ctx.now().isoformat()])


async def test_a_later_rule_for_the_same_command_overrides_an_earlier_one() -> None:
    env = SagaTestEnv([OneStep])
    env.participant("p").on(Cmd, reply={"v": "default"})  # what a fixture would script
    env.participant("p").on(Cmd, reply={"v": "this test's"})
    run = await env.start(OneStep, Count())
    output = await run.output()
    assert isinstance(output, Done)
    assert output.values[0] == "this test's"


async def test_a_rule_with_times_overrides_for_that_many_then_the_earlier_applies() -> None:
    env = SagaTestEnv([OneStep])
    env.participant("p").on(Cmd, reply={"v": "default"})
    env.participant("p").on(Cmd, retryable="busy", times=2)
    run = await env.start(OneStep, Count())
    assert await env.run_until_settled(run) == SagaStatus.COMPLETED
    output = await run.output()
    assert isinstance(output, Done)
    assert output.values[0] == "default"
    assert len(env.commands("p")) == 3  # twice busy, then the default


async def test_reset_forgets_the_scripted_rules() -> None:
    env = SagaTestEnv([OneStep])
    bank = env.participant("p").on(Cmd, reject="no").on("Other", reject="no either")
    assert bank.reset(Cmd) is bank
    run = await env.start(OneStep, Count())
    assert await run.status() == SagaStatus.COMPLETED  # the default success reply
    assert bank.received, "reset keeps what was received"
    bank.on(Cmd, reject="no again").reset()
    again = await env.start(OneStep, Count(steps=2))
    assert await again.status() == SagaStatus.COMPLETED


@pytest.mark.parametrize(
    "start_time",
    [
        None,
        datetime(2031, 5, 1, 12, 0),  # naive: taken as UTC
        datetime(2031, 5, 1, 14, 0, tzinfo=timezone(timedelta(hours=2))),
    ],
)
async def test_env_now_and_ctx_now_agree_in_form(start_time: datetime | None) -> None:
    env = SagaTestEnv([OneStep], start_time=start_time)
    env.participant("p").on(Cmd, no_reply=True, times=1)
    run = await env.start(OneStep, Count())
    await env.advance(timedelta(seconds=40))  # the attempt times out; the retry succeeds
    output = await run.output()
    assert isinstance(output, Done)
    saga_now = datetime.fromisoformat(output.values[1])
    now = env.now()  # a method, as ctx.now() is
    assert isinstance(now, datetime)
    assert now.tzinfo is UTC
    assert saga_now.utcoffset() == timedelta(0)
    assert env.now() - timedelta(seconds=40) <= saga_now <= env.now()
    if start_time is not None:
        assert (await run.history())[0].at == start_time.replace(tzinfo=start_time.tzinfo or UTC)
