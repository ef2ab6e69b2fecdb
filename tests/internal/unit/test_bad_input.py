"""Bad input never undoes a saga: declared signals, checked skip results, held replies,
idempotency keys and values Postgres cannot store, in the engine's core (in memory).

The same paths over the real servers (HTTP, Kafka records) are in tests/edge.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel, Field

from saga_engine import (
    DefinitionError,
    IdempotencyConflict,
    InvalidPayload,
    InvalidTransition,
    Saga,
    SagaContext,
    SagaStatus,
    Signal,
    UnstorableValue,
)
from saga_engine.client import SagaClient
from saga_engine.events import (
    InvalidReplyReceived,
    ReplyReceived,
    SagaParked,
    SagaStarted,
    StepSkipped,
)
from saga_engine.replay import HistoryExport, replay
from saga_engine.testing import SagaRun, SagaTestEnv


class Go(BaseModel):
    ok: bool


class Order(BaseModel):
    n: int = 1
    note: str = ""


class Done(BaseModel):
    charged: int = 0
    ok: bool = True


class Charge(BaseModel):
    n: int


class Refund(BaseModel):
    n: int


class Ship(BaseModel):
    n: int


class Charged(BaseModel):
    amount: int


class LenientCharged(BaseModel):
    amount: float


class Gated(Saga[Order, Done]):
    """Charges (reply model Charged), ships, then waits for ``go``."""

    name = "gated"
    go = Signal(Go)
    reply_model: ClassVar[type[Charged | LenientCharged]] = Charged

    async def run(self, ctx: SagaContext, order: Order) -> Done:
        charged = await ctx.step(
            "charge",
            to="bank",
            command=Charge(n=order.n),
            compensate=Refund(n=order.n),
            returns=self.reply_model,
        )
        await ctx.step("ship", to="depot", command=Ship(n=order.n))
        decision = await ctx.wait_signal(self.go, timeout=timedelta(hours=1))
        return Done(charged=int(charged.amount), ok=decision.ok)


class GatedFixed(Gated):
    """The same saga after a fix: the bank's amounts may have decimals ("5.5")."""

    name = "gated"
    reply_model = LenientCharged


async def _kinds(run: SagaRun) -> list[str]:
    return [e.kind for e in await run.history()]


async def _waiting(env: SagaTestEnv) -> SagaRun:
    env.participant("bank").on(Charge, reply=Charged(amount=5))
    run = await env.start(Gated, Order())
    assert await run.status() == SagaStatus.RUNNING  # waiting for "go"
    return run


# --------------------------------------------------------------------------- signals


def test_signals_are_declared_on_the_class() -> None:
    assert dict(Gated.signals) == {"go": Gated.go}
    assert Gated.go.name == "go"
    assert Gated.go.model is Go

    shared = Signal(Go, name="approval")

    class A(Saga[Order, Done]):
        name = "a"
        approval = shared

        async def run(self, ctx: SagaContext, order: Order) -> Done:
            return Done()

    class B(Saga[Order, Done]):
        name = "b"
        yes = shared  # an explicit name: the same signal in two sagas

        async def run(self, ctx: SagaContext, order: Order) -> Done:
            return Done()

    assert set(A.signals) == set(B.signals) == {"approval"}


def test_bad_signal_declarations_are_refused_at_definition() -> None:
    with pytest.raises(DefinitionError, match="pydantic model class"):
        Signal(dict)  # type: ignore[type-var]
    with pytest.raises(DefinitionError, match="signal name"):
        Signal(Go, name=" padded ")
    with pytest.raises(DefinitionError, match="two signals are named 'go'"):

        class Twice(Saga[Order, Done]):
            name = "twice"
            go = Signal(Go)
            also = Signal(Order, name="go")

            async def run(self, ctx: SagaContext, order: Order) -> Done:
                return Done()

    with pytest.raises(DefinitionError, match="as attributes"):

        class Mapping(Saga[Order, Done]):
            name = "mapping"
            signals = {"go": Go}  # type: ignore[dict-item]

            async def run(self, ctx: SagaContext, order: Order) -> Done:
                return Done()


class Sloppy(Saga[Order, Done]):
    """Charges, then waits for a signal it forgot to declare."""

    name = "sloppy"

    async def run(self, ctx: SagaContext, order: Order) -> Done:
        await ctx.step("charge", to="bank", command=Charge(n=1), compensate=Refund(n=1))
        await ctx.wait_signal("go", Go)
        return Done()


class SloppyFixed(Saga[Order, Done]):
    """The fix: the signal is declared."""

    name = "sloppy"
    go = Signal(Go)

    async def run(self, ctx: SagaContext, order: Order) -> Done:
        await ctx.step("charge", to="bank", command=Charge(n=1), compensate=Refund(n=1))
        decision = await ctx.wait_signal("go", Go)
        return Done(ok=decision.ok)


async def test_a_bug_in_the_code_parks_the_saga_and_undoes_nothing() -> None:
    """Waiting for an undeclared signal is a bug in the code, not a reason to undo a
    business transaction: the saga parks (definition_error) until a fixed deploy."""
    env = SagaTestEnv([Sloppy])
    run = await env.start(Sloppy, Order())
    assert await run.status() == SagaStatus.NONDETERMINISTIC
    error = await run.error()
    assert error is not None
    assert error["type"] == "DefinitionError"
    assert "add `go = Signal(Go)`" in error["message"]
    parked = (await run.history())[-1]
    assert isinstance(parked, SagaParked)
    assert parked.reason == "definition_error"
    assert env.commands(compensation=True) == []
    # Redeployed with the same bug, a resume is refused; the history is not touched.
    env.engine = env.new_engine()
    with pytest.raises(InvalidTransition, match="cannot be driven by the code deployed"):
        await env.engine.resume(run.saga_id, reason="try")
    # The fix is deployed: resume, and the saga goes on where it stood.
    env.engine = env.new_engine([SloppyFixed])
    await env.engine.resume(run.saga_id, reason="declared the signal")
    await env.signal(run, "go", Go(ok=True))
    assert await run.status() == SagaStatus.COMPLETED
    assert env.compensated_steps() == []
    assert [c.command_type for c in env.commands()] == ["Charge"]


async def test_a_signal_the_model_refuses_is_refused_and_records_nothing() -> None:
    env = SagaTestEnv([Gated])
    run = await _waiting(env)
    before = await _kinds(run)

    with pytest.raises(InvalidPayload) as bad:
        await env.signal(run, "go", {"ok": "not-a-bool"})
    assert bad.value.errors[0]["loc"] == ["payload", "ok"]
    assert "valid boolean" in bad.value.errors[0]["msg"]
    with pytest.raises(InvalidPayload) as unknown:
        await env.signal(run, "og", {"ok": True})
    assert unknown.value.errors == [
        {
            "loc": ["name"],
            "msg": "saga 'gated' declares no signal 'og' (it declares: go)",
            "type": "unknown_signal",
        }
    ]
    with pytest.raises(UnstorableValue) as nul:
        await env.signal(run, "go", {"ok": True, "by": "a\u0000b"})
    assert nul.value.errors[0]["loc"] == ["payload", "by"]

    assert await _kinds(run) == before
    assert await run.status() == SagaStatus.RUNNING
    await env.signal(run, "go", Go(ok=True))
    assert await run.status() == SagaStatus.COMPLETED


async def test_the_client_checks_what_it_can_before_sending() -> None:
    client = SagaClient.__new__(SagaClient)  # never started: a check that passes would fail
    with pytest.raises(InvalidPayload, match=r"payload\.ok"):
        await client.signal("s-1", Gated.go, {"ok": "maybe"})
    with pytest.raises(InvalidPayload, match="declares no signal 'nope'"):
        await client.signal("s-1", "nope", {}, saga=Gated)
    with pytest.raises(UnstorableValue, match=r"payload\.x"):
        await client.signal("s-1", "go", {"x": "\u0000"})
    with pytest.raises(InvalidPayload, match=r"input of saga 'gated' does not match Order: n"):
        await client.start(Gated, {"n": "many"})
    with pytest.raises(UnstorableValue, match="note"):
        await client.start("gated", {"note": "\u0000"})


# --------------------------------------------------------------------------- skip


async def test_a_skip_result_is_checked_against_the_steps_reply_model() -> None:
    env = SagaTestEnv([Gated])
    env.participant("bank").on(Charge, no_reply=True)
    run = await env.start(Gated, Order())
    before = await _kinds(run)

    with pytest.raises(InvalidPayload) as bad:
        await env.engine.skip_step(run.saga_id, "charge", {"amount": "lots"}, reason="by hand")
    assert bad.value.errors[0]["loc"] == ["result", "amount"]
    with pytest.raises(UnstorableValue):
        await env.engine.skip_step(run.saga_id, "charge", {"amount": 1, "x": "\u0000"})
    assert await _kinds(run) == before

    await env.engine.skip_step(run.saga_id, "charge", {"amount": 3}, reason="by hand")
    await env.settle()
    await env.signal(run, "go", Go(ok=True))
    output = await run.output()
    assert isinstance(output, Done)
    assert output.charged == 3


# --------------------------------------------------------------------------- held replies


async def _held(env: SagaTestEnv, reply: dict[str, Any]) -> SagaRun:
    env.participant("bank").on(Charge, reply=reply)
    run = await env.start(Gated, Order())
    assert await env.run_until_settled(run) == SagaStatus.STEP_STUCK
    return run


async def test_a_reply_its_model_refuses_parks_the_saga_and_compensates_nothing() -> None:
    env = SagaTestEnv([Gated])
    run = await _held(env, {"amount": "five"})

    history = await run.history()
    held = history[-1]
    assert isinstance(held, InvalidReplyReceived)
    assert held.payload == {"amount": "five"}  # the raw reply, kept
    assert held.error.details["errors"][0]["loc"] == ["payload", "amount"]
    record = await run.record()
    assert record.error is not None
    assert "does not match Charged" in record.error["message"]
    assert record.error["step"] == "charge"
    assert env.commands(compensation=True) == []
    assert [c.command_type for c in env.commands()] == ["Charge"]

    # Time passes: the attempt does not time out (the bank answered), nothing moves.
    await env.advance(timedelta(hours=2))
    assert await run.status() == SagaStatus.STEP_STUCK
    assert [c.command_type for c in env.commands()] == ["Charge"]
    # A repeat of the same reply (a participant's relay) changes nothing.
    command = env.commands("bank")[0]
    decision = await env.engine.reply(run.saga_id, command.command_id, "success", {"amount": 5})
    assert decision.dropped is not None
    assert await run.status() == SagaStatus.STEP_STUCK


async def test_retry_without_a_fix_is_refused_then_skip_with_a_valid_result_goes_on() -> None:
    env = SagaTestEnv([Gated])
    run = await _held(env, {"amount": "five"})
    before = await _kinds(run)

    with pytest.raises(InvalidTransition, match="still does not match Charged"):
        await env.engine.retry_step(run.saga_id, "charge", reason="try again")
    with pytest.raises(InvalidPayload):
        await env.engine.skip_step(run.saga_id, "charge", {"amount": "5 EUR"}, reason="typo")
    with pytest.raises(InvalidTransition, match="retry the step"):
        await env.engine.resume(run.saga_id, reason="go on")
    assert await _kinds(run) == before

    await env.engine.skip_step(run.saga_id, "charge", {"amount": 5}, reason="read the ledger")
    await env.settle()
    assert await run.status() == SagaStatus.RUNNING
    assert (await run.record()).error is None
    await env.signal(run, "go", Go(ok=True))
    output = await run.output()
    assert isinstance(output, Done)
    assert output.charged == 5


async def test_retry_after_a_fixed_deploy_accepts_the_held_reply() -> None:
    env = SagaTestEnv([Gated])
    run = await _held(env, {"amount": "5.5"})

    env.engine = env.new_engine([GatedFixed])  # a deploy with a model that reads it
    await env.engine.retry_step(run.saga_id, "charge", reason="deployed the fix")
    await env.settle()
    assert await run.status() == SagaStatus.RUNNING
    await env.signal(run, "go", Go(ok=True))
    assert await run.status() == SagaStatus.COMPLETED
    history = HistoryExport(run.saga_id, "gated", await run.history())
    assert replay([GatedFixed], history).deterministic
    # The old code cannot replay past the retry: it would not have accepted the reply.
    assert not replay([Gated], history).deterministic


async def test_cancelling_a_stuck_saga_compensates_the_held_step() -> None:
    env = SagaTestEnv([Gated])
    run = await _held(env, {"amount": "five"})
    await env.cancel(run, "customer gave up")
    assert await run.status() == SagaStatus.CANCELLED
    # The bank did apply the charge (it answered success): its refund is owed and sent.
    assert env.compensated_steps() == ["charge"]


async def test_a_skip_of_a_held_step_keeps_its_compensation_owed() -> None:
    env = SagaTestEnv([Gated])
    run = await _held(env, {"amount": "five"})
    await env.engine.skip_step(run.saga_id, "charge", {"amount": 5}, reason="ledger says 5")
    await env.settle()
    await env.cancel(run, "changed our mind")
    assert env.compensated_steps() == ["charge"]


async def test_a_reply_postgres_cannot_store_is_held_escaped_and_only_a_skip_answers_it() -> None:
    env = SagaTestEnv([Gated])
    run = await _held(env, {"amount": 5, "memo": "a\u0000b"})
    held = (await run.history())[-1]
    assert isinstance(held, InvalidReplyReceived)
    assert held.unstorable
    assert held.payload == {"amount": 5, "memo": "a\\u0000b"}
    with pytest.raises(InvalidTransition, match="cannot be accepted as it came"):
        await env.engine.retry_step(run.saga_id, "charge", reason="r")
    await env.engine.skip_step(run.saga_id, "charge", {"amount": 5, "memo": "ab"}, reason="r")
    await env.settle()
    assert await run.status() == SagaStatus.RUNNING


async def test_a_held_step_survives_a_restart_and_is_not_sent_again() -> None:
    env = SagaTestEnv([Gated])
    run = await _held(env, {"amount": "five"})
    sent = len(env.commands())
    env.engine = env.new_engine()
    assert await env.engine.recover() == 1
    await env.settle()
    assert await run.status() == SagaStatus.STEP_STUCK
    assert len(env.commands()) == sent  # answered already: nothing re-sent
    await env.engine.skip_step(run.saga_id, "charge", {"amount": 5}, reason="r")
    await env.settle()
    kinds = [type(e) for e in await run.history()]
    assert StepSkipped in kinds
    assert ReplyReceived in kinds  # the ship step's reply, after the skip


async def test_failure_replies_are_recorded_even_when_they_hold_unstorable_text() -> None:
    env = SagaTestEnv([Gated])
    env.participant("bank").on(Charge, reject="no\u0000pe")
    run = await env.start(Gated, Order())
    assert await run.status() == SagaStatus.FAILED
    error = await run.error()
    assert error is not None
    assert "no\\u0000pe" in error["message"]


# --------------------------------------------------------------------------- starts


async def test_a_start_postgres_cannot_store_is_refused_before_anything_is_recorded() -> None:
    env = SagaTestEnv([Gated])
    for bad in ({"note": "\u0000"}, {"n": 2**70}, {"note": "\ud800"}):
        with pytest.raises(UnstorableValue):
            await env.engine.start(Gated, bad, saga_id="never")
    with pytest.raises(InvalidPayload, match=r"does not match Order: n"):
        await env.engine.start(Gated, {"n": "many"}, saga_id="never")
    assert await env.store.list_sagas() == []


async def test_an_idempotency_key_reused_with_another_input_is_a_conflict() -> None:
    env = SagaTestEnv([Gated])
    env.participant("bank").on(Charge, reply=Charged(amount=1))
    first = await env.engine.start(Gated, Order(n=1), idempotency_key="k-1")
    assert await env.engine.start(Gated, {"n": "1"}, idempotency_key="k-1") == first
    with pytest.raises(IdempotencyConflict) as conflict:
        await env.engine.start(Gated, Order(n=2), idempotency_key="k-1")
    assert conflict.value.saga_id == first
    assert first in str(conflict.value)
    # Evicted from memory, the store's history tells the same.
    env.engine = env.new_engine()
    with pytest.raises(IdempotencyConflict):
        await env.engine.start(Gated, Order(n=2), idempotency_key="k-1")
    assert len(await env.store.list_sagas()) == 1


# --------------------------------------------------------------------------- review findings


class Stamped(BaseModel):
    customer: str
    request_id: str = Field(default_factory=lambda: str(uuid.uuid4()))
    amount: int = 1


class Tag(BaseModel):
    request_id: str


class StampedSaga(Saga[Stamped, Done]):
    name = "stamped"

    async def run(self, ctx: SagaContext, order: Stamped) -> Done:
        # The default's value travels in a command: a replay that made a new one would
        # diverge from the history.
        await ctx.step("tag", to="ledger", command=Tag(request_id=order.request_id))
        return Done()


async def test_a_default_factory_neither_breaks_idempotency_nor_replay() -> None:
    env = SagaTestEnv([StampedSaga])
    first = await env.engine.start(StampedSaga, {"customer": "a"}, idempotency_key="k")
    await env.settle()
    # The same request, sent again as JSON, as a rebuilt model (a fresh default_factory
    # value), and with a static default spelt out: the same saga each time.
    for again in ({"customer": "a"}, Stamped(customer="a"), {"customer": "a", "amount": 1}):
        assert await env.engine.start(StampedSaga, again, idempotency_key="k") == first
    with pytest.raises(IdempotencyConflict):
        await env.engine.start(StampedSaga, {"customer": "a", "amount": 2}, idempotency_key="k")
    history = await env.engine.history(first)
    started = history[0]
    assert isinstance(started, SagaStarted)
    request_id = started.input["request_id"]  # filled in once, at the start
    assert [c.payload for c in env.commands()] == [{"request_id": request_id}]
    assert replay([StampedSaga], HistoryExport(first, "stamped", history)).deterministic


class GatedThenWaits(Saga[Order, Done]):
    """A held step, then a wait with no timeout: nothing follows a retry in its history."""

    name = "gated-waits"
    go = Signal(Go)
    reply_model: ClassVar[type[BaseModel]] = Charged

    async def run(self, ctx: SagaContext, order: Order) -> Done:
        await ctx.step("charge", to="bank", command=Charge(n=1), returns=self.reply_model)
        decision = await ctx.wait_signal(self.go)
        return Done(ok=decision.ok)


class GatedThenWaitsFixed(GatedThenWaits):
    name = "gated-waits"
    reply_model = LenientCharged


async def test_a_retry_replayed_under_code_that_refuses_the_reply_is_nondeterminism() -> None:
    env = SagaTestEnv([GatedThenWaits])
    env.participant("bank").on(Charge, reply={"amount": "5.5"})
    run = await env.start(GatedThenWaits, Order())
    assert await run.status() == SagaStatus.STEP_STUCK
    env.engine = env.new_engine([GatedThenWaitsFixed])
    await env.engine.retry_step(run.saga_id, "charge", reason="fixed")
    assert await run.status() == SagaStatus.RUNNING
    history = HistoryExport(run.saga_id, "gated-waits", await run.history())
    assert replay([GatedThenWaitsFixed], history).deterministic
    rolled_back = replay([GatedThenWaits], history)
    assert not rolled_back.deterministic
    assert "retry of 'charge'" in str(rolled_back.error)


async def test_texts_and_headers_postgres_cannot_store_never_reach_it() -> None:
    env = SagaTestEnv([Gated])
    env.participant("bank").on(Charge, reply={"amount": "five"})
    run = await env.start(Gated, Order(), trace_context={"tracestate": "a=\u0000"})
    started = (await run.history())[0]
    assert isinstance(started, SagaStarted)
    assert "tracestate" not in started.trace_context  # telemetry only: dropped, not refused
    before = await _kinds(run)
    with pytest.raises(UnstorableValue, match="reason"):
        await env.engine.cancel(run.saga_id, "because\u0000")
    with pytest.raises(UnstorableValue, match="reason"):
        await env.engine.skip_step(run.saga_id, "charge", {"amount": 1}, reason="\ud800")
    assert await _kinds(run) == before
    with pytest.raises(InvalidPayload, match="deadline_s: is too far in the future"):
        await env.engine.start(Gated, Order(), deadline=timedelta(seconds=1e12))


async def test_a_gather_with_a_held_step_counts_one_park() -> None:
    class Both(Saga[Order, Done]):
        name = "both"

        async def run(self, ctx: SagaContext, order: Order) -> Done:
            await asyncio.gather(
                ctx.step("a", to="bank", command=Charge(n=1), returns=Charged),
                ctx.step("b", to="bank", command=Charge(n=2), returns=Charged),
            )
            return Done()

    env = SagaTestEnv([Both])
    env.participant("bank").on(Charge, reply={"amount": "x"})
    run = await env.start(Both, Order())
    assert await run.status() == SagaStatus.STEP_STUCK
    kinds = await _kinds(run)
    assert kinds.count("invalid_reply_received") == 2
    assert env.parts.stats.counts["sagas_parked"] == 1
