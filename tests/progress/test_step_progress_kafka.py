"""Participants' step reports end to end on the real Kafka and Postgres (issue 41 §5): a
Python participant calls ``tx.progress`` while its handler runs; the engine worker's
admin API shows the reports on the command in flight (``GET /sagas/{id}``) and on the
stream (``?steps=true``, unnumbered ``step_progress`` events), and none once the reply is
in the history. Hostile records on ``{prefix}.progress`` are dropped without harm, and a
report the kit cannot send never fails the handler."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaProducer
from pydantic import BaseModel

from saga_engine import Saga, SagaContext, SagaStatus, Settings
from saga_engine.client import SagaClient
from saga_engine.participant import Participant, Transaction
from saga_engine.settings import AdminSettings
from saga_engine.worker import SagaWorker
from tests.conftest import PgTarget
from tests.participant.helpers import engine_settings
from tests.waiting import eventually

pytestmark = pytest.mark.integration


class Parcel(BaseModel):
    items: int


class Pack(BaseModel):
    items: int


class Packed(BaseModel):
    boxes: int


class Packing(Saga[Parcel, Packed]):
    name = "packing"

    async def run(self, ctx: SagaContext, input: Parcel) -> Packed:
        await ctx.emit("status", {"stage": "packing"})
        packed = await ctx.step(
            "pack", to="warehouse", command=Pack(items=input.items), returns=Packed, timeout=120
        )
        await ctx.emit("status", {"stage": "packed"})
        return packed


@pytest.fixture
async def settings(pg: PgTarget, kafka_bootstrap: str, unique_id: str) -> AsyncIterator[Settings]:
    async with engine_settings(pg, kafka_bootstrap, unique_id, "warehouse") as s:
        yield s.model_copy(update={"admin": AdminSettings(port=0)})


async def hostile(settings: Settings, saga_id: str) -> None:
    """Records no kit sends: no value, not JSON, the wrong shape, too large, unknown saga."""
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers)
    await producer.start()
    topic = f"{settings.kafka.topic_prefix}.progress"
    key = saga_id.encode()
    unknown = {"saga_id": "no-such-saga", "command_id": "c", "attempt": 1, "seq": 1}
    try:
        for value in (
            None,
            b"\xff\xfe not json",
            b'{"saga_id": 3}',
            b'{"x": "' + b"y" * 20_000 + b'"}',
            json.dumps({**unknown, "at": "2026-01-01T00:00:00Z"}).encode(),
        ):
            await producer.send_and_wait(topic, value, key=key)
    finally:
        await producer.stop()


def sse(block: str) -> dict[str, Any]:
    fields = dict(line.split(": ", 1) for line in block.split("\n") if not line.startswith(":"))
    return {
        "id": fields.get("id"),
        "event": fields.get("event", "message"),
        "data": json.loads(fields["data"]),
    }


async def follow(
    http: httpx.AsyncClient, saga_id: str, on_step: Callable[[], object]
) -> list[dict[str, Any]]:
    """The saga's stream with its steps' reports, read to its end; ``on_step`` is called
    on each ``step_progress`` event as it arrives."""
    got: list[dict[str, Any]] = []
    async with http.stream("GET", f"/sagas/{saga_id}/stream?steps=true") as stream:
        assert stream.status_code == 200
        block: list[str] = []
        async for line in stream.aiter_lines():
            if line:
                block.append(line)
                continue
            if block and not block[0].startswith(":"):
                got.append(sse("\n".join(block)))
                if got[-1]["event"] == "step_progress":
                    on_step()
            block = []
    return got


async def reported(http: httpx.AsyncClient, saga_id: str) -> list[dict[str, Any]]:
    """The reports ``GET /sagas/{id}`` shows on the command in flight, once it shows some."""

    async def probe() -> list[dict[str, Any]] | None:
        shown = await http.get(f"/sagas/{saga_id}")
        if shown.status_code == 404:
            return None  # its start is on its way through the inbox
        flying = shown.json()["in_flight"]
        return flying[0]["progress"] if flying and flying[0]["progress"] else None

    return await eventually(probe, what="a report on the running step")


async def check_followed(http: httpx.AsyncClient, saga_id: str, got: list[dict[str, Any]]) -> None:
    """Two numbered items around the step, its reports between them without an id, and
    none once its reply is in the history."""
    numbered = [f for f in got if f["event"] == "message"]
    steps = [f for f in got if f["event"] == "step_progress"]
    assert [f["id"] for f in numbered] == ["1", "2"]
    assert [f["data"]["payload"]["stage"] for f in numbered] == ["packing", "packed"]
    assert steps
    assert all(f["id"] is None for f in steps)
    assert {f["data"]["step"] for f in steps} == {"pack"}
    assert got[-1]["event"] == "end"
    assert got[-1]["data"] == {"status": SagaStatus.COMPLETED.value, "last_number": 2}
    # The step's reports came before its reply made item 2, and none after it.
    assert got.index(steps[-1]) < got.index(numbered[1])
    done = (await http.get(f"/sagas/{saga_id}")).json()
    assert done["status"] == "completed"
    assert done["in_flight"] == []
    again = (await http.get(f"/sagas/{saga_id}/stream?steps=true&follow=false")).text
    assert "step_progress" not in again


async def test_a_participants_reports_show_while_its_step_runs_and_go_with_its_reply(
    settings: Settings,
) -> None:
    warehouse = Participant("warehouse", settings)
    release = asyncio.Event()

    @warehouse.handles(Pack)
    async def pack(cmd: Pack, tx: Transaction) -> Packed:
        tx.progress({"note": "x" * 10_000})  # too large: dropped, counted, no failure
        tx.progress({"when": {1j}})  # not JSON: the same
        done = 0
        while not release.is_set():  # the slow work, reported on as it goes
            done += 1
            tx.progress({"packed": min(done, cmd.items), "of": cmd.items})
            await asyncio.wait([asyncio.ensure_future(release.wait())], timeout=0.05)
        return Packed(boxes=cmd.items)

    worker = SagaWorker(settings, [Packing])
    await worker.start()
    try:
        await warehouse.start()
        assert worker.admin_url is not None
        async with (
            SagaClient(settings) as client,
            httpx.AsyncClient(base_url=worker.admin_url) as http,
        ):
            saga_id = await client.start(Packing, Parcel(items=3))
            await hostile(settings, saga_id)

            progress = await reported(http, saga_id)
            assert progress[-1]["attempt"] == 1
            assert progress[-1]["body"]["of"] == 3
            assert [p["seq"] for p in progress] == sorted(p["seq"] for p in progress)
            assert len(progress) <= settings.admin.step_progress_items
            # Seen live on the stream: then the handler may finish.
            await check_followed(http, saga_id, await follow(http, saga_id, release.set))
            assert (await http.get("/health")).status_code == 200

            async def dropped() -> dict[str, int] | None:
                counters = (await http.get("/metrics")).json()["counters"]
                wanted = {k: v for k, v in counters.items() if "step_progress_dropped" in k}
                return wanted if sum(wanted.values()) >= 4 else None

            # The hostile records were dropped, counted by reason on /metrics (no value,
            # not JSON, the wrong shape; too large). The unknown saga's record is
            # well-formed: kept, never shown, forgotten after its TTL.
            assert await eventually(dropped, what="the hostile records counted") == {
                "step_progress_dropped_malformed": 3,
                "step_progress_dropped_oversized": 1,
            }
        assert warehouse.stats["step_progress_dropped"] == 2  # too large, not JSON
        assert warehouse.stats["step_progress_sent"] >= 1
    finally:
        release.set()
        await warehouse.stop()
        await worker.stop()
