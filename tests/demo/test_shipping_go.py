"""The demo's shipping service, written in Go (services_demo/shipping_go), on the real
servers: built and started as the demo does, it answers its commands over Kafka and its
HTTP endpoints as the Python service it replaced did, prints and voids the fulfilment's
labels, and stops cleanly on SIGTERM."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from saga_engine import Settings
from saga_engine.protocol import Envelope, ReplyBody
from services_demo.create_topics import create_topics
from services_demo.run import DemoStack, StackConfig, free_base_port
from tests.conftest import PgTarget
from tests.participant.helpers import Bus, command, compensation_of, resent

pytestmark = pytest.mark.integration

ALICE = {"order_id": "o-1", "customer": "alice", "items": [{"sku": "book", "qty": 2}]}


@pytest.fixture
async def shipping(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str, tmp_path: Path
) -> AsyncIterator[DemoStack]:
    """The Go shipping service alone, with its own schema, topics and port."""
    config = StackConfig(
        dsn=pg.database_dsn,
        bootstrap=kafka_bootstrap,
        namespace=f"g{unique_id}",
        base_port=free_base_port(),
        partitions=2,
        logs=tmp_path,
    )
    stack = DemoStack(config)
    try:
        await create_topics(Settings(kafka=config.kafka), config.demo)
        await stack.build_shipping()
        stack.start_service("shipping")
        await stack.wait_healthy("shipping")
        yield stack
        stack.stop()
        proc = stack.procs["shipping"]
        assert proc.returncode == 0, stack.log_tail("shipping")
        assert "participant stopped" in stack.log_tail("shipping")
    finally:
        stack.stop()
        await stack.drop_data()


@pytest.fixture
async def bus(shipping: DemoStack) -> AsyncIterator[Bus]:
    bus = Bus(shipping.config.kafka)
    bus.command_topic = f"{shipping.config.topic_prefix}.cmd.shipping"
    await bus.start()
    try:
        yield bus
    finally:
        await bus.stop()


def body_of(reply: Envelope) -> ReplyBody:
    return ReplyBody.model_validate(reply.body)


async def replies_by_command(bus: Bus, count: int) -> dict[str, list[ReplyBody]]:
    """The next ``count`` replies, by the command each answers."""
    by_command: dict[str, list[ReplyBody]] = {}
    for reply in await bus.wait_replies(count):
        by_command.setdefault(reply.command_id, []).append(body_of(reply))
    return by_command


async def test_health_and_shipments_answer_as_the_python_service_did(
    shipping: DemoStack,
) -> None:
    url = shipping.config.url("shipping")
    async with httpx.AsyncClient(timeout=5.0) as http:
        health = await http.get(f"{url}/health")
        assert health.status_code == 200
        assert health.json() == {
            "service": "shipping",
            "status": "ok",
            "schema": shipping.config.schema("shipping"),
            "commands": ["CancelShipment", "PrintLabel", "ScheduleShipment", "VoidLabel"],
        }
        missing = await http.get(f"{url}/shipments/nothing-here")
        assert missing.status_code == 404
        assert missing.json() == {"detail": "no shipment for order nothing-here"}
        assert (await http.post(f"{url}/health")).status_code == 405
        assert (await http.get(f"{url}/nowhere")).json() == {"detail": "Not Found"}


async def test_schedule_refuse_and_cancel(shipping: DemoStack, bus: Bus) -> None:
    scheduled = command("ScheduleShipment", ALICE, step="book-carrier")
    erin = command("ScheduleShipment", {**ALICE, "order_id": "o-2", "customer": "erin"})
    bad = command("ScheduleShipment", {**ALICE, "order_id": "o-3", "items": [{"sku": "b"}]})
    cancel = compensation_of(
        scheduled, "CancelShipment", {"order_id": "o-1"}, f"{scheduled.saga_id}:undo:0"
    )
    # After the compensation (one saga: one partition, in order): nothing left to cancel.
    again = command(
        "CancelShipment",
        {"order_id": "o-1"},
        saga_id=scheduled.saga_id,
        command_id=f"{scheduled.saga_id}:undo-again:0",
        step="undo-again",
    )
    never = command("CancelShipment", {"order_id": "o-404"})
    await bus.send(scheduled)
    await bus.send(resent(scheduled))  # a copy: the stored reply, the handler not run again
    for envelope in (erin, bad, cancel, again, never):
        await bus.send(envelope)

    by_command = await replies_by_command(bus, 7)
    shipment_id = f"shp-{scheduled.command_id[:12]}"
    assert by_command[scheduled.command_id] == 2 * [
        ReplyBody(outcome="success", payload={"order_id": "o-1", "shipment_id": shipment_id})
    ]
    assert by_command[erin.command_id] == [
        ReplyBody(
            outcome="failure",
            payload={},
            error="cannot ship to erin: the address is outside our area",
        )
    ]
    [refused] = by_command[bad.command_id]
    assert refused.outcome == "failure"
    assert "items.0.qty" in (refused.error or "")
    assert by_command[cancel.command_id] == [
        ReplyBody(outcome="success", payload={"order_id": "o-1", "cancelled": True})
    ]
    for nothing, order_id in ((again, "o-1"), (never, "o-404")):
        assert by_command[nothing.command_id] == [
            ReplyBody(outcome="success", payload={"order_id": order_id, "cancelled": False})
        ]

    async with httpx.AsyncClient(timeout=5.0) as http:
        got = await http.get(f"{shipping.config.url('shipping')}/shipments/o-1")
    assert got.status_code == 200
    assert got.json() == {
        "order_id": "o-1",
        "shipment_id": shipment_id,
        "customer": "alice",
        "status": "cancelled",
    }
    conn = await asyncpg.connect(shipping.config.dsn)
    try:
        rows = await conn.fetch(
            f'SELECT order_id, status FROM "{shipping.config.schema("shipping")}".shipments'
        )
    finally:
        await conn.close()
    assert [tuple(r) for r in rows] == [("o-1", "cancelled")]  # nothing for erin nor o-3


async def test_print_and_void_a_label(shipping: DemoStack, bus: Bus) -> None:
    label = {"order_id": "o-7", "customer": "alice", "parcel_id": "pcl-1", "invoice_id": "inv-1"}
    printed = command("PrintLabel", label, step="label")
    void = compensation_of(printed, "VoidLabel", {"order_id": "o-7"}, f"{printed.saga_id}:undo:0")
    again = command(
        "VoidLabel",
        {"order_id": "o-7"},
        saga_id=printed.saga_id,
        command_id=f"{printed.saga_id}:undo-again:0",
        step="undo-again",
    )
    bad = command("PrintLabel", {"order_id": "o-8", "customer": "alice"})
    await bus.send(printed)
    await bus.send(resent(printed))  # a copy: the stored reply, the handler not run again
    for envelope in (void, again, bad):
        await bus.send(envelope)

    by_command = await replies_by_command(bus, 5)
    tracking = f"trk-{printed.command_id[:12]}"
    assert by_command[printed.command_id] == 2 * [
        ReplyBody(outcome="success", payload={"order_id": "o-7", "tracking": tracking})
    ]
    assert by_command[void.command_id] == [
        ReplyBody(outcome="success", payload={"order_id": "o-7", "voided": True})
    ]
    assert by_command[again.command_id] == [
        ReplyBody(outcome="success", payload={"order_id": "o-7", "voided": False})
    ]
    [refused] = by_command[bad.command_id]
    assert refused.outcome == "failure"
    assert "invoice_id" in (refused.error or "")
    assert "parcel_id" in (refused.error or "")

    async with httpx.AsyncClient(timeout=5.0) as http:
        got = await http.get(f"{shipping.config.url('shipping')}/labels/o-7")
        missing = await http.get(f"{shipping.config.url('shipping')}/labels/o-8")
    assert got.status_code == 200
    assert got.json() == {**label, "tracking": tracking, "status": "void"}
    assert missing.status_code == 404
    assert missing.json() == {"detail": "no label for order o-8"}
