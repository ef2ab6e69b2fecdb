"""``ctx.wait_event`` in the testing kit (the in-memory adapters): a domain event another
service publishes answers the saga waiting for its key, once; one published before the
wait is matched within its source's retention; several waiting sagas each get it; one
nobody waits for is dropped after the window, counted."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from saga_engine.events import DomainEventReceived, Event, EventAwaited
from saga_engine.testing import SagaTestEnv
from tests.events.sagas import (
    AwaitPayment,
    CheckoutResult,
    Order,
    PaymentCaptured,
    Shipped,
    payment_captured,
)


def _env() -> SagaTestEnv:
    env = SagaTestEnv([AwaitPayment], event_sources=[payment_captured])
    env.participant("shipping").on("Ship", reply=Shipped(tracking="t-1"))
    return env


def _kinds(history: list[Event]) -> list[str]:
    return [e.kind for e in history]


async def test_an_event_published_while_the_saga_waits_answers_it_once() -> None:
    env = _env()
    run = await env.start(AwaitPayment, Order(order_id=42))
    assert str(await run.status()) == "running"
    waiting = await env.publish_event(PaymentCaptured(order_id=42, amount=30))
    assert waiting == [run.saga_id]
    assert await run.output() == CheckoutResult(amounts=[30])
    history = await run.history()
    received = [e for e in history if isinstance(e, DomainEventReceived)]
    assert len(received) == 1
    assert received[0].key == "42"
    assert received[0].payload == {"order_id": 42, "amount": 30}
    awaited = [e for e in history if isinstance(e, EventAwaited)]
    assert [(a.source, a.key) for a in awaited] == [("PaymentCaptured", "42")]
    assert len(env.commands("shipping")) == 1


async def test_an_event_for_another_key_does_not_answer() -> None:
    env = _env()
    run = await env.start(AwaitPayment, Order(order_id=42))
    assert await env.publish_event(PaymentCaptured(order_id=7, amount=1)) == []
    assert str(await run.status()) == "running"
    assert "domain_event_received" not in _kinds(await run.history())


async def test_an_event_published_before_the_wait_is_matched_within_the_retention() -> None:
    env = _env()
    await env.publish_event(PaymentCaptured(order_id=5, amount=12))
    await env.advance(timedelta(minutes=50))  # the source keeps it for an hour
    run = await env.start(AwaitPayment, Order(order_id=5))
    assert await run.output() == CheckoutResult(amounts=[12])
    assert env.parts.stats.counts["domain_events_matched"] == 1


async def test_an_event_older_than_the_retention_is_dropped_and_counted() -> None:
    env = _env()
    await env.publish_event(PaymentCaptured(order_id=6, amount=12))
    await env.advance(timedelta(minutes=61))
    assert env.parts.stats.counts["domain_events_expired_unmatched"] == 1
    run = await env.start(AwaitPayment, Order(order_id=6, timeout_s=60))
    await env.advance(timedelta(seconds=61))
    assert await run.output() == CheckoutResult(amounts=[], timed_out=True)
    assert env.commands("shipping") == []


async def test_every_saga_waiting_on_the_key_gets_the_event() -> None:
    env = _env()
    first = await env.start(AwaitPayment, Order(order_id=9), idempotency_key="a")
    second = await env.start(AwaitPayment, Order(order_id=9), idempotency_key="b")
    other = await env.start(AwaitPayment, Order(order_id=10), idempotency_key="c")
    waiting = await env.publish_event(PaymentCaptured(order_id=9, amount=3))
    assert sorted(waiting) == sorted([first.saga_id, second.saga_id])
    assert await first.output() == CheckoutResult(amounts=[3])
    assert await second.output() == CheckoutResult(amounts=[3])
    assert str(await other.status()) == "running"


async def test_a_saga_never_receives_the_same_event_twice() -> None:
    env = _env()
    run = await env.start(AwaitPayment, Order(order_id=11, captures=2))
    await env.publish_event(PaymentCaptured(order_id=11, amount=1), event_id="cap-1")
    # The same fact again (a redelivered record), then the saga's second wait: the
    # first fact is kept, but it was received already.
    await env.publish_event(PaymentCaptured(order_id=11, amount=1), event_id="cap-1")
    assert str(await run.status()) == "running"
    await env.publish_event(PaymentCaptured(order_id=11, amount=2), event_id="cap-2")
    assert await run.output() == CheckoutResult(amounts=[1, 2])
    received = [e for e in await run.history() if isinstance(e, DomainEventReceived)]
    assert [e.event_id for e in received] == ["cap-1", "cap-2"]


async def test_the_wait_times_out_with_event_timeout() -> None:
    env = _env()
    run = await env.start(AwaitPayment, Order(order_id=12, timeout_s=30))
    await env.advance(timedelta(seconds=31))
    assert await run.output() == CheckoutResult(amounts=[], timed_out=True)
    # Too late: the saga no longer waits, and nothing is recorded.
    assert await env.publish_event(PaymentCaptured(order_id=12, amount=1)) == []
    assert "domain_event_received" not in _kinds(await run.history())


async def test_a_cancelled_saga_takes_no_event() -> None:
    env = _env()
    run = await env.start(AwaitPayment, Order(order_id=13))
    await env.cancel(run)
    assert str(await run.status()) == "cancelled"
    await env.publish_event(PaymentCaptured(order_id=13, amount=1))
    assert "domain_event_received" not in _kinds(await run.history())


async def test_a_restarted_engine_replays_the_wait_and_still_gets_the_event() -> None:
    env = _env()
    run = await env.start(AwaitPayment, Order(order_id=14))
    env.engine = env.new_engine()  # a restarted process: nothing in memory
    assert await env.engine.recover() == 1
    await env.publish_event(PaymentCaptured(order_id=14, amount=4))
    assert await run.output() == CheckoutResult(amounts=[4])
    assert _kinds(await run.history()).count("domain_event_received") == 1


async def test_a_saga_that_does_not_wait_never_asks_the_store() -> None:
    env = SagaTestEnv([AwaitPayment], event_sources=[payment_captured])
    asked: list[str] = []
    kept = env.domain_events.kept

    async def counting(source: str, key: str, now: datetime) -> Any:
        asked.append(key)
        return await kept(source, key, now)

    env.domain_events.kept = counting  # type: ignore[method-assign]
    # Waits for no capture at all: straight to its step.
    run = await env.start(AwaitPayment, Order(order_id=15, captures=0))
    assert str(await run.status()) == "completed"
    assert asked == []
    waiting = await env.start(AwaitPayment, Order(order_id=16), idempotency_key="w")
    assert asked == ["16"]
    assert str(await waiting.status()) == "running"
