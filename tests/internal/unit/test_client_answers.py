"""``SagaClient.cancel`` and ``.signal`` say what happened as far as the client can know
(issue 39, 8.4): refused at once with the reason when the saga's history says the engine
would refuse (before: published, then dead-lettered while the caller had its answer);
sent once the broker holds it; OutcomeUnknown when the broker took the record and did not
acknowledge it (before: "could not publish", though it may have been)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.errors import RequestTimedOutError
from pydantic import BaseModel

from saga_engine import (
    InvalidTransition,
    KafkaUnavailable,
    OutcomeUnknown,
    PastPivot,
    Saga,
    SagaContext,
    SagaStatus,
    Settings,
    Signal,
)
from saga_engine.client import SagaClient
from saga_engine.testing import SagaTestEnv


class Empty(BaseModel):
    pass


class Cmd(BaseModel):
    n: int


class Undo(BaseModel):
    n: int


class Waits(Saga[Empty, Empty]):
    """A step, then its pivot, then a wait for ``go``."""

    name = "waits"
    go = Signal(Empty)

    async def run(self, ctx: SagaContext, input: Empty) -> Empty:
        await ctx.step("reserve", to="stock", command=Cmd(n=1), compensate=Undo(n=1))
        await ctx.wait_signal(Waits.go)
        await ctx.step("capture", to="payments", command=Cmd(n=2), pivot=True)
        await ctx.wait_signal(Waits.go)
        return Empty()


class Producer:
    """An aiokafka producer's ``send``: the record is taken, and its acknowledgement is
    ``ack`` (a result, or an error)."""

    _closed = False

    def __init__(self, ack: BaseException | None = None) -> None:
        self.ack = ack
        self.sent: list[tuple[str, bytes | None]] = []

    async def send(self, topic: str, value: bytes, **_: Any) -> asyncio.Future[Any]:
        self.sent.append((topic, value))
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.ack is None:
            future.set_result(None)
        else:
            future.set_exception(self.ack)
        return future


def _client(env: SagaTestEnv, producer: Producer) -> SagaClient:
    return SagaClient(Settings(), producer=producer, store=env.store)


async def test_a_cancel_of_an_ended_saga_is_refused_at_once_and_nothing_is_sent() -> None:
    env = SagaTestEnv([Waits])
    run = await env.start(Waits, Empty())
    await env.signal(run, "go")
    await env.signal(run, "go")
    assert await run.status() == SagaStatus.COMPLETED
    producer = Producer()
    client = _client(env, producer)
    with pytest.raises(InvalidTransition, match="is completed; it accepts no cancel"):
        await client.cancel(run.saga_id, "late")
    with pytest.raises(InvalidTransition, match="is completed; it accepts no signal"):
        await client.signal(run.saga_id, Waits.go)
    assert producer.sent == []


async def test_a_cancel_past_the_pivot_is_refused_with_the_reason() -> None:
    env = SagaTestEnv([Waits])
    run = await env.start(Waits, Empty())
    await env.signal(run, "go")
    producer = Producer()
    with pytest.raises(PastPivot, match="past its pivot"):
        await _client(env, producer).cancel(run.saga_id, "too late")
    assert producer.sent == []


async def test_a_signal_to_a_saga_undoing_its_steps_is_refused() -> None:
    env = SagaTestEnv([Waits])
    env.participant("stock").on(Undo, no_reply=True)  # its undo stays in flight
    run = await env.start(Waits, Empty())
    await env.cancel(run)
    assert await run.status() == SagaStatus.COMPENSATING
    producer = Producer()
    with pytest.raises(InvalidTransition, match="undoing its steps"):
        await _client(env, producer).signal(run.saga_id, Waits.go)
    assert producer.sent == []


async def test_an_action_the_engine_may_accept_is_sent() -> None:
    env = SagaTestEnv([Waits])
    run = await env.start(Waits, Empty())
    producer = Producer()
    client = _client(env, producer)
    await client.signal(run.saga_id, Waits.go, signal_id="s-1")
    await client.cancel(run.saga_id, "changed my mind")
    await client.cancel("not-started-yet", "its start may be on its way")
    assert len(producer.sent) == 3


async def test_a_record_taken_and_not_acknowledged_is_an_unknown_outcome() -> None:
    env = SagaTestEnv([Waits])
    run = await env.start(Waits, Empty())
    producer = Producer(ack=RequestTimedOutError())
    with pytest.raises(OutcomeUnknown, match="may or may not be in the saga inbox"):
        await _client(env, producer).cancel(run.saga_id, "r")
    assert len(producer.sent) == 1


async def test_a_record_not_handed_over_is_not_sent() -> None:
    env = SagaTestEnv([Waits])
    run = await env.start(Waits, Empty())
    producer = Producer()
    producer._closed = True
    with pytest.raises(KafkaUnavailable) as raised:
        await _client(env, producer).cancel(run.saga_id, "r")
    assert not isinstance(raised.value, OutcomeUnknown)
    assert producer.sent == []
