"""The progress stream on the real stack (issue 41 §5): a client follows a saga's items
through the engine's admin API while the engine is SIGKILLed and restarted; it
reconnects by itself and gets every item once, numbered with no gap, to the saga's end.
The store holds each number once: replay after the kill recorded none again."""

from __future__ import annotations

import asyncio
import re
import socket

import pytest

from saga_engine import SagaStatus
from saga_engine.client import SagaClient
from tests.internal.e2e.harness import Cluster
from tests.internal.e2e.progress_app import Tick, Ticker, Ticks
from tests.waiting import eventually

pytestmark = pytest.mark.integration

APP = "tests.internal.e2e.progress_app:SAGAS"
TICKS = 8
#: One item when it starts, then a status and an eta per tick.
ITEMS = 1 + 2 * TICKS


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_engine(cluster: Cluster, port: int) -> None:
    # A fixed port: the restarted engine serves where the client reconnects.
    args = ["-m", "saga_engine", "worker", APP, "--log-level", "INFO"]
    cluster._spawn("engine", args, cluster.env(SAGA_ADMIN__PORT=str(port)))


async def _admin_up(cluster: Cluster, times: int) -> str:
    found = await eventually(
        lambda: re.findall(r"admin API on (http://\S+)", cluster.log_tail("engine", 2000)),
        until=lambda found: len(found) >= times,
        timeout=90,
        interval=0.1,
        what="the engine's admin API to start",
        context=lambda: cluster.log_tail("engine"),
    )
    return str(found[-1])


async def test_a_stream_survives_a_sigkill_of_the_engine(cluster: Cluster) -> None:
    port = _free_port()
    _start_engine(cluster, port)
    url = await _admin_up(cluster, 1)
    seen: list[int] = []
    async with SagaClient(cluster.settings, admin_url=url) as client:
        saga_id = await client.start(Ticker, Ticks(count=TICKS))
        await eventually(  # started through the inbox: a stream of it before is a 404
            lambda: cluster.statuses([saga_id]),
            until=lambda found: saga_id in found,
            timeout=60,
            interval=0.05,
            what=f"saga {saga_id} to be stored",
            context=lambda: cluster.log_tail("engine"),
        )

        async def follow() -> None:
            stream = client.stream(saga_id, reconnect_delay=0.2, max_reconnects=500)
            async for item in stream:
                seen.append(item.number)

        follower = asyncio.create_task(follow())
        half = TICKS // 2
        for n in range(half):
            await client.signal(saga_id, Ticker.tick, Tick(n=n))
        # Some items were read live; then the engine dies, maybe in the middle of a tick.
        await eventually(
            lambda: len(seen),
            until=lambda count: count >= 3,
            timeout=60,
            interval=0.05,
            what="the first items to be streamed",
            context=lambda: f"{follower!r}\n{cluster.log_tail('engine')}",
        )
        cluster.kill("engine")
        for n in range(half, TICKS):  # queued in the inbox while no engine runs
            await client.signal(saga_id, Ticker.tick, Tick(n=n))
        _start_engine(cluster, port)
        await _admin_up(cluster, 2)
        await asyncio.wait_for(follower, timeout=120)
        statuses = await cluster.wait_settled([saga_id], timeout=60)
    assert statuses[saga_id] == SagaStatus.COMPLETED
    assert seen == list(range(1, ITEMS + 1))
    rows = await cluster.query(
        f"SELECT (data->>'number')::int AS number FROM \"{cluster.schema}\".saga_events "
        "WHERE saga_id = $1 AND kind = 'progress_emitted' ORDER BY seq",
        saga_id,
    )
    assert [r["number"] for r in rows] == list(range(1, ITEMS + 1))
