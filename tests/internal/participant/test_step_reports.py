"""The Python kit's step reports (``tx.progress``, issue 41 §5) without Kafka: sent in
the order they were made, numbered per attempt, and never failing the handler: what
cannot be encoded, queued or sent is dropped and counted."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import orjson
from pydantic import BaseModel

from saga_engine.participant import Transaction
from saga_engine.participant._step_reports import _MAX_IN_FLIGHT, StepReporter
from saga_engine.transport._wire import Envelope, MessageType
from tests.waiting import eventually


class FakeProducer:
    """Hands back a delivery future per send, resolved by the test."""

    def __init__(self, *, refuse: bool = False) -> None:
        self.sent: list[tuple[str, bytes, bytes]] = []
        self.deliveries: list[asyncio.Future[Any]] = []
        self.refuse = refuse

    async def send(
        self, topic: str, value: bytes, *, key: bytes, headers: list[tuple[str, bytes]]
    ) -> asyncio.Future[Any]:
        await asyncio.sleep(0)  # as aiokafka may: the next report is not in yet
        if self.refuse:
            raise RuntimeError("Kafka is away")
        assert dict(headers) == {"ce_type": b"saga.progress", "content-type": b"application/json"}
        self.sent.append((topic, key, value))
        delivery: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.deliveries.append(delivery)
        return delivery


def command(saga_id: str = "s-1") -> Envelope:
    return Envelope(
        message_type=MessageType.COMMAND,
        source="/saga-engine/test",
        subject="Pack",
        saga_id=saga_id,
        saga_type="packing",
        command_id=f"{saga_id}:pack:0",
        step="pack",
    )


class Stage(BaseModel):
    packed: int


async def settled(producer: FakeProducer, n: int) -> None:
    await eventually(lambda: len(producer.sent) >= n or None, what=f"{n} reports handed over")


async def test_reports_go_out_in_order_numbered_per_attempt_and_counted_once_acknowledged() -> None:
    producer, stats = FakeProducer(), collections.Counter[str]()
    reporter = StepReporter(producer, "t.progress", stats)
    tx = Transaction(None, command(), participant="p", attempt=2, reports=reporter)  # type: ignore[arg-type]
    for n in range(1, 6):
        tx.progress(Stage(packed=n) if n % 2 else {"packed": n})
    await settled(producer, 5)
    values = [orjson.loads(value) for _, _, value in producer.sent]
    assert [(v["seq"], v["attempt"], v["body"]) for v in values] == [
        (n, 2, {"packed": n}) for n in range(1, 6)
    ]
    assert {(topic, key) for topic, key, _ in producer.sent} == {("t.progress", b"s-1")}
    assert values[0]["command_id"] == "s-1:pack:0"
    assert values[0]["step"] == "pack"
    assert stats["step_progress_sent"] == 0  # not acknowledged yet
    producer.deliveries[0].set_result(None)
    producer.deliveries[1].set_exception(RuntimeError("the broker refused it"))
    await asyncio.sleep(0)
    assert stats == {"step_progress_sent": 1, "step_progress_dropped": 1}


async def test_what_cannot_be_encoded_queued_or_sent_is_dropped_and_counted() -> None:
    producer, stats = FakeProducer(), collections.Counter[str]()
    reporter = StepReporter(producer, "t.progress", stats)
    reporter.report(command(), 1, 1, {"when": {1j}})  # not JSON
    reporter.report(command(), 1, 2, "x" * 10_000)  # over 8 KiB
    assert stats["step_progress_dropped"] == 2
    for seq in range(3, 3 + _MAX_IN_FLIGHT + 1):  # one more than may wait
        reporter.report(command(), 1, seq, seq)
    assert stats["step_progress_dropped"] == 3
    await settled(producer, _MAX_IN_FLIGHT)

    away, lost = FakeProducer(refuse=True), collections.Counter[str]()
    refused = StepReporter(away, "t.progress", lost)
    refused.report(command(), 1, 1, "fine")
    await eventually(lambda: lost or None, what="the refused report counted")
    assert lost == {"step_progress_dropped": 1}


def test_a_transaction_without_a_reporter_reports_nothing() -> None:
    tx = Transaction(None, command(), participant="p", attempt=1)  # type: ignore[arg-type]
    tx.progress({"packed": 1})  # no error: a handler run outside a participant


def test_a_report_outside_a_running_loop_is_dropped_too() -> None:
    stats = collections.Counter[str]()
    reporter = StepReporter(FakeProducer(), "t.progress", stats)
    reporter.report(command(), 1, 1, object())  # not JSON
    reporter.report(command(), 1, 2, "fine, but no loop runs")
    assert stats["step_progress_dropped"] == 2
