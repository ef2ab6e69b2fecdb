"""One size rule for the commands a saga issues (issue 39, 8.1), in the testing kit (the
real engine in memory): a step whose command, or whose compensation, is larger than the
message limit fails before the command is recorded, naming the limit; the refusal is
recorded, so that a replay (with any limit, or none) fails the step the same way; a send
that fails does not fail the input that caused it; a record the broker refuses as too
large is a refusal for good, not a transient failure."""

from __future__ import annotations

from datetime import timedelta

import pytest
from aiokafka.errors import KafkaConnectionError, MessageSizeTooLargeError
from pydantic import BaseModel

from saga_engine import Saga, SagaContext, SagaStatus, Settings
from saga_engine.core.history._events import CommandIssued, SideEffectRecorded
from saga_engine.core.runtime._runtime import SagaRuntime
from saga_engine.kernel._errors import KafkaUnavailable, PermanentError
from saga_engine.kernel._settings import KafkaSettings
from saga_engine.testing import SagaTestEnv
from saga_engine.transport._kafka import publish_error

LIMIT = 4096


class Order(BaseModel):
    note_size: int = 0
    undo_size: int = 0


class Done(BaseModel):
    pass


class Charge(BaseModel):
    note: str = ""


class Refund(BaseModel):
    note: str = ""


class Billing(Saga[Order, Done]):
    name = "billing"

    async def run(self, ctx: SagaContext, order: Order) -> Done:
        await ctx.step("reserve", to="stock", command=Charge(), compensate=Refund(), timeout=5)
        await ctx.step(
            "charge",
            to="payments",
            command=Charge(note="x" * order.note_size),
            compensate=Refund(note="y" * order.undo_size),
            timeout=5,
        )
        return Done()


def _env() -> SagaTestEnv:
    return SagaTestEnv([Billing], settings=Settings(kafka=KafkaSettings(max_message_bytes=LIMIT)))


@pytest.mark.parametrize(
    ("order", "what"),
    [
        (Order(note_size=LIMIT), "the command of step 'charge'"),
        (Order(undo_size=LIMIT), "the compensation of step 'charge'"),
    ],
)
async def test_a_step_too_large_for_the_broker_fails_before_it_is_recorded(
    order: Order, what: str
) -> None:
    env = _env()
    run = await env.start(Billing, order)
    assert await env.run_until_settled(run) == SagaStatus.COMPENSATED
    # Nothing of the step was sent; the step before it was undone.
    assert [c.step for c in env.commands("payments")] == []
    assert env.compensated_steps() == ["reserve"]
    history = await run.history()
    assert [e.step for e in history if isinstance(e, CommandIssued)] == ["reserve"]
    [refusal] = [e for e in history if isinstance(e, SideEffectRecorded)]
    assert refusal.op_id == "too_large:charge"
    error = await run.error()
    assert error is not None
    message = error["message"]
    assert what in message
    assert f"limit of {LIMIT:,} bytes" in message
    assert "SAGA_KAFKA__MAX_MESSAGE_BYTES" in message
    # A replay, by a process with no limit (a view, the replay tool) or a larger one,
    # fails the step the same way: the refusal is read from history.
    definition = env.parts.registry.get("billing")
    _, decision = SagaRuntime.replay(definition, run.saga_id, history)
    assert decision.nondeterminism is None
    assert decision.events == []


async def test_a_step_within_the_limit_is_sent() -> None:
    env = _env()
    run = await env.start(Billing, Order(note_size=LIMIT // 2))
    assert await env.run_until_settled(run) == SagaStatus.COMPLETED
    assert len(env.commands("payments")) == 1


async def test_a_failed_send_is_sent_again_without_failing_the_input() -> None:
    env = _env()
    env.bus.fail(lambda command: command.participant == "payments", times=3)
    run = await env.start(Billing, Order())
    # The reply that issued the failing command was applied (not answered with the
    # send's error for its caller to apply again): the saga goes on, re-sent by itself.
    await env.advance(timedelta(seconds=4))
    assert await env.run_until_settled(run) == SagaStatus.COMPLETED
    assert env.parts.stats.counts.get("reloaded", 0) >= 3


def test_a_record_too_large_for_the_broker_is_refused_for_good() -> None:
    refused = publish_error("saga.cmd.payments", MessageSizeTooLargeError(), 1_200_000)
    assert isinstance(refused, PermanentError)
    assert "1,200,000 bytes" in str(refused)
    assert isinstance(publish_error("t", KafkaConnectionError()), KafkaUnavailable)
