"""The fold's side of ``ctx.wait_event``: the gist lines, the timeline's wait row (received
or timed out), what the view says the saga waits for, and a key the code cannot use."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel

from saga_engine import Saga, SagaContext
from saga_engine.core.views._event_lines import event_line
from saga_engine.core.views._view import WaitKind, saga_view_of
from saga_engine.testing import SagaTestEnv
from tests.events.sagas import AwaitPayment, Order, PaymentCaptured, payment_captured


async def test_received_and_timed_out_waits_in_the_gist_the_timeline_and_the_view() -> None:
    env = SagaTestEnv([AwaitPayment], event_sources=[payment_captured])
    env.participant("shipping").on("Ship", no_reply=True)
    paid = await env.start(AwaitPayment, Order(order_id=1, timeout_s=60), idempotency_key="p")
    late = await env.start(AwaitPayment, Order(order_id=2, timeout_s=60), idempotency_key="l")
    view = saga_view_of(await late.history(), saga_id=late.saga_id)
    [wait] = view.waiting_for
    assert (wait.kind, wait.what, wait.name) == (
        WaitKind.EVENT,
        "event PaymentCaptured key=2",
        "PaymentCaptured",
    )
    assert wait.until == env.now() + timedelta(seconds=60)
    await env.publish_event(PaymentCaptured(order_id=1, amount=9), event_id="e-1")
    await env.advance(timedelta(seconds=61))

    history = await paid.history()
    lines = [event_line(e) for e in history]
    assert lines[1].startswith("wait for event PaymentCaptured key=1; until ")
    assert (
        lines[2]
        == 'event PaymentCaptured key=1 received; id e-1; payload {"amount":9,"order_id":1}'
    )
    received = saga_view_of(history, saga_id=paid.saga_id)
    assert [(s.label, s.outcome, s.detail) for s in received.segments[:1]] == [
        ("wait for PaymentCaptured key=1", "received", "e-1")
    ]

    timed_out = saga_view_of(await late.history(), saga_id=late.saga_id)
    assert [(s.label, s.outcome) for s in timed_out.segments] == [
        ("wait for PaymentCaptured key=2", "timed_out")
    ]
    assert timed_out.waiting_for == ()


class Weird(BaseModel):
    ok: bool = True


class BadKey(Saga[Weird, Weird]):
    name = "bad-key"

    async def run(self, ctx: SagaContext, _: Weird) -> Weird:
        await ctx.wait_event(PaymentCaptured, key=1.5)  # type: ignore[arg-type]
        return Weird()


async def test_a_key_the_code_cannot_use_parks_the_saga_as_a_definition_error() -> None:
    env = SagaTestEnv([BadKey])
    run = await env.start(BadKey, Weird())
    assert str(await run.status()) == "nondeterministic"
    error = await run.error()
    assert error is not None
    assert error["type"] == "DefinitionError"
    assert "a correlation key must be a string, an integer or a UUID" in error["message"]
