"""Saga versions and their rollout on the real Postgres and Kafka, with engines (workers)
in this process: a change through the admin API reaches a second engine within the
refresh delay, starts split exactly as the bucket says, a rollback stops new starts on
the new version while its running sagas finish on it, and sagas written by a newer
engine (a saga version, an event version) are left untouched until one runs.

(The SIGKILL of an engine process during a rollout is test_rollout_crash.py.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import httpx
import pytest
from pydantic import BaseModel, SecretStr

from saga_engine import Saga, SagaContext, Settings, Signal
from saga_engine.admin import create_admin_app
from saga_engine.client import SagaClient
from saga_engine.core.history import _events as events_module
from saga_engine.core.history._events import VERSIONS, SagaCompleted
from saga_engine.core.planning._rollout import RolloutSpec, bucket
from saga_engine.settings import AdminSettings, EngineSettings, KafkaSettings, PostgresSettings
from saga_engine.store._migrations import migrate
from saga_engine.store._pgstore import PostgresEventStore
from saga_engine.worker import SagaWorker
from tests.conftest import PgTarget
from tests.waiting import eventually

pytestmark = pytest.mark.integration

TYPE = "rollout-order"
PARTITIONS = 4
REFRESH_S = 0.5
TOKEN = "operator-token-0123456789-abcdef"
OPERATOR = {"Authorization": f"Bearer {TOKEN}"}


class Order(BaseModel):
    nap_s: float = 0


class Done(BaseModel):
    version: int


class Go(BaseModel):
    pass


class OrderV1(Saga[Order, Done]):
    name = TYPE
    go = Signal(Go)

    async def run(self, ctx: SagaContext, input: Order) -> Done:
        if input.nap_s:
            await ctx.sleep(timedelta(seconds=input.nap_s))
        return Done(version=1)


class OrderV2(Saga[Order, Done]):
    name = TYPE
    version = 2
    go = Signal(Go)

    async def run(self, ctx: SagaContext, input: Order) -> Done:
        if input.nap_s:
            await ctx.sleep(timedelta(seconds=input.nap_s))
        return Done(version=2)


@pytest.fixture
def settings(pg: PgTarget, kafka_bootstrap: str, unique_id: str) -> Settings:
    return Settings(
        pg=PostgresSettings(dsn=pg.database_dsn, db_schema=pg.schema),
        kafka=KafkaSettings(
            bootstrap_servers=kafka_bootstrap,
            topic_prefix=f"t{unique_id}",
            group_id=f"engines-{unique_id}",
            partitions=PARTITIONS,
        ),
        engine=EngineSettings(rollout_refresh_s=REFRESH_S),
        admin=AdminSettings(enabled=False, port=0, operators={"olivia": SecretStr(TOKEN)}),
    )


@contextlib.asynccontextmanager
async def running(*workers: SagaWorker) -> AsyncIterator[None]:
    try:
        yield
    finally:
        await asyncio.gather(*(w.stop() for w in workers), return_exceptions=True)


@contextlib.asynccontextmanager
async def admin_of(worker: SagaWorker, settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    assert worker.engine is not None
    app = create_admin_app(worker.engine, settings, parts=worker.parts)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://admin") as http:
        yield http


async def _pg_row(pg: PgTarget, sql: str, *args: object) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(pg.dsn)
    try:
        return await conn.fetch(sql, *args)
    finally:
        await conn.close()


async def _versions_and_outputs(pg: PgTarget, ids: list[str]) -> dict[str, tuple[str, int, int]]:
    """saga id -> (status, sagas.saga_version, the version its output names)."""
    rows = await _pg_row(
        pg,
        "SELECT s.saga_id, s.status, s.saga_version, e.data->'output'->>'version' AS ran "
        "FROM sagas s LEFT JOIN saga_events e ON e.saga_id = s.saga_id AND e.seq = s.last_seq "
        "AND e.kind = 'saga_completed' WHERE s.saga_id = ANY($1)",
        ids,
    )
    return {r["saga_id"]: (r["status"], r["saga_version"], int(r["ran"] or 0)) for r in rows}


async def _all_completed(pg: PgTarget, ids: list[str]) -> bool:
    found = await _versions_and_outputs(pg, ids)
    return len(found) == len(ids) and all(s == "completed" for s, _, _ in found.values())


async def test_rollout_through_the_api_reaches_another_engine_and_rolls_back(
    settings: Settings, pg: PgTarget
) -> None:
    a = SagaWorker(settings, [OrderV1, OrderV2])
    b = SagaWorker(settings, [OrderV1, OrderV2])
    async with running(a, b), SagaClient(settings) as client:
        await a.start()
        await b.start()
        await eventually(
            lambda: (
                a.owned_partitions
                and b.owned_partitions
                and sorted(a.owned_partitions | b.owned_partitions) == list(range(PARTITIONS))
            ),
            timeout=60,
        )
        assert a.engine is not None
        assert b.engine is not None
        async with admin_of(a, settings) as http:
            # 30 % through engine a's API: engine b applies it within its refresh delay.
            put = await http.put(
                f"/rollouts/{TYPE}",
                json={"version": 2, "percent": 30, "reason": "canary"},
                headers=OPERATOR,
            )
            assert put.status_code == 200, put.text
            changed_at = time.monotonic()
            parts_b = b.parts

            def b_applies(percent: int) -> bool:
                row = parts_b.rollouts.get(TYPE)
                return row is not None and row.percent == percent

            await eventually(lambda: b_applies(30), timeout=10)
            assert time.monotonic() - changed_at < REFRESH_S + 2.0

            ids = [f"canary-{i}" for i in range(40)]
            for saga_id in ids:
                await client.start(TYPE, Order(), saga_id=saga_id)
            await eventually(lambda: _all_completed(pg, ids), timeout=60)
            found = await _versions_and_outputs(pg, ids)
            for saga_id in ids:
                want = 2 if bucket(TYPE, saga_id) < 30 else 1
                # Recorded and run: the row, and the class that produced the output.
                assert found[saga_id] == ("completed", want, want), saga_id
            assert {v for _, v, _ in found.values()} == {1, 2}

            # 100 %, long sagas in flight on v2; then roll back to 0 %.
            await http.put(
                f"/rollouts/{TYPE}",
                json={"version": 2, "percent": 100, "reason": "all in"},
                headers=OPERATOR,
            )
            await eventually(lambda: b_applies(100), timeout=10)
            long = [f"long-{i}" for i in range(8)]
            for saga_id in long:
                await client.start(TYPE, Order(nap_s=4), saga_id=saga_id)

            async def long_started() -> bool:
                found = await _versions_and_outputs(pg, long)
                return len(found) == len(long)

            await eventually(long_started, timeout=30)
            assert {v for _, v, _ in (await _versions_and_outputs(pg, long)).values()} == {2}
            back = await http.put(
                f"/rollouts/{TYPE}",
                json={"version": 2, "percent": 0, "reason": "rollback: errors in v2"},
                headers=OPERATOR,
            )
            assert back.status_code == 200
            assert "0% of new starts" in back.json()["summary"]
            await eventually(lambda: b_applies(0), timeout=10)
            after = [f"after-{i}" for i in range(12)]
            for saga_id in after:
                await client.start(TYPE, Order(), saga_id=saga_id)
            await eventually(lambda: _all_completed(pg, after + long), timeout=60)
            found = await _versions_and_outputs(pg, after + long)
            # No new start on v2; the running v2 sagas finished on v2.
            assert {found[i] for i in after} == {("completed", 1, 1)}
            assert {found[i] for i in long} == {("completed", 2, 2)}

            # Audited: who, when, before -> after, why; newest first.
            view = (await http.get(f"/rollouts/{TYPE}", headers=OPERATOR)).json()
            trail = [
                (
                    c["principal"],
                    c["reason"],
                    (c["before"] or {}).get("percent"),
                    c["after"]["percent"],
                )
                for c in view["audit"]
            ]
            assert trail == [
                ("olivia", "rollback: errors in v2", 100, 0),
                ("olivia", "all in", 30, 100),
                ("olivia", "canary", None, 30),
            ]
            rows = await _pg_row(pg, "SELECT principal, reason FROM saga_rollout_audit ORDER BY id")
            assert [r["reason"] for r in rows] == ["canary", "all in", "rollback: errors in v2"]
            # The saga's version in the API's detail and list.
            detail = (await http.get(f"/sagas/{long[0]}", headers=OPERATOR)).json()
            assert detail["saga_version"] == 2
            listed = (await http.get("/sagas", params={"q": "long-0"}, headers=OPERATOR)).json()
            assert listed["items"][0]["saga_version"] == 2


async def test_a_saga_version_an_engine_lacks_waits_for_an_engine_that_has_it(
    settings: Settings, pg: PgTarget, caplog: pytest.LogCaptureFixture
) -> None:
    await migrate(pg.database_dsn, pg.schema)
    store = await PostgresEventStore.connect(settings.pg)
    try:
        await store.set_rollout(
            TYPE, RolloutSpec(version=2, percent=100), principal="t", reason="v2", at=_now()
        )
    finally:
        await store.close()
    new = SagaWorker(settings, [OrderV1, OrderV2])
    async with running(new), SagaClient(settings) as client:
        await new.start()
        saga_id = await client.start(TYPE, Order(nap_s=6), saga_id="v2-saga")
        await eventually(lambda: _pg_row(pg, "SELECT 1 FROM sagas WHERE saga_id = $1", saga_id))
    before = await _pg_row(pg, "SELECT status, last_seq, saga_version FROM sagas")
    assert [tuple(r) for r in before] == [("running", 2, 2)]

    # An engine of the previous deploy (v1 only) recovers the partition: it leaves the saga
    # as it is (nothing appended, not parked) and says why.
    old = SagaWorker(settings, [OrderV1])
    caplog.set_level(logging.ERROR, logger="saga_engine.engine")
    async with running(old):
        await old.start()
        parts = old.parts
        await eventually(lambda: parts.stats.counts["recovery_failed"] >= 1, timeout=30)
        assert "version 2 is not deployed on this engine" in caplog.text
        after = await _pg_row(pg, "SELECT status, last_seq, saga_version FROM sagas")
        assert [tuple(r) for r in after] == [("running", 2, 2)]

    # The new deploy takes over: the saga goes on, on the class it started with.
    again = SagaWorker(settings, [OrderV1, OrderV2])
    async with running(again):
        await again.start()
        await eventually(lambda: _all_completed(pg, [saga_id]), timeout=30)
    assert (await _versions_and_outputs(pg, [saga_id]))[saga_id] == ("completed", 2, 2)


def _now() -> datetime:
    return datetime.now(UTC)


async def test_an_event_written_by_a_newer_engine_is_left_untouched_and_reported(
    settings: Settings, pg: PgTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = SagaWorker(settings, [OrderV1])
    async with running(first), SagaClient(settings) as client:
        await first.start()
        saga_id = await client.start(TYPE, Order(nap_s=5), saga_id="newer-event")
        await eventually(lambda: _pg_row(pg, "SELECT 1 FROM sagas WHERE saga_id = $1", saga_id))
    # As a newer engine would have written it: its sleep's timer_started at version 2.
    await _pg_row(
        pg,
        "UPDATE saga_events SET data = data || '{\"_v\": 2}' WHERE saga_id = $1 AND seq = 2 "
        "AND kind = 'timer_started'",
        saga_id,
    )
    stored = await _pg_row(
        pg, "SELECT data->>'_v' AS v FROM saga_events WHERE saga_id = $1 AND seq = 2", saga_id
    )
    assert stored[0]["v"] == "2"

    old = SagaWorker(settings, [OrderV1])
    async with running(old), SagaClient(settings) as client:
        await old.start()
        parts = old.parts
        await eventually(lambda: parts.stats.counts["recovery_failed"] >= 1, timeout=30)
        async with admin_of(old, settings) as http:
            shown = await http.get(f"/sagas/{saga_id}", headers=OPERATOR)
            assert shown.status_code == 409
            assert shown.json()["reason"] == "newer_event"
            assert "'timer_started' at version 2" in shown.json()["detail"]
        # A signal for it is dead-lettered as newer_version, not lost in a crash.
        await client.signal(saga_id, "go", Go(), saga=OrderV1)
        await eventually(lambda: old.stats_dead_lettered >= 1, timeout=30)
        assert parts.stats.counts["dead_lettered_newer_version"] == 1
        rows = await _pg_row(pg, "SELECT status, last_seq FROM sagas WHERE saga_id = $1", saga_id)
        assert [tuple(r) for r in rows] == [("running", 2)]

    # A newer engine (reads timer_started v2) takes over: the saga goes on and completes,
    # and the newer event is still stored as it was written.
    monkeypatch.setattr(
        events_module,
        "VERSIONS",
        VERSIONS.with_version("timer_started", 2, lambda data: data),
    )
    newer = SagaWorker(settings, [OrderV1])
    async with running(newer):
        await newer.start()
        await eventually(lambda: _all_completed(pg, [saga_id]), timeout=30)
    stored = await _pg_row(
        pg, "SELECT data->>'_v' AS v FROM saga_events WHERE saga_id = $1 AND seq = 2", saga_id
    )
    assert stored[0]["v"] == "2"
    last = await _pg_row(
        pg, "SELECT kind FROM saga_events WHERE saga_id = $1 ORDER BY seq DESC LIMIT 1", saga_id
    )
    assert last[0]["kind"] == SagaCompleted.kind
