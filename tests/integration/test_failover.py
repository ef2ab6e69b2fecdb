"""Failover on the real Kafka and Postgres, with engines in this process.

- A rebalance (another engine joins) keeps the sagas whose partitions stay: the same
  in-memory copies, not rebuilt, and their timers still fire; the moved ones are driven
  by the new owner.
- A member that comes back under its static name gets its partitions back without a
  rebalance: the other member keeps its partitions (no revocation).
- Start-up waits for Postgres and Kafka that come up late.

SIGKILLed engine processes are covered by tests/internal/e2e/test_instances.py and measured by
bench/failover.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from pydantic import BaseModel

from saga_engine import Saga, SagaContext, SagaStatus, Settings, Signal
from saga_engine.client import SagaClient
from saga_engine.participant import Participant, Transaction
from saga_engine.protocol import partition_for
from saga_engine.settings import (
    AdminSettings,
    EngineSettings,
    KafkaSettings,
    ParticipantSettings,
    PostgresSettings,
)
from saga_engine.worker import SagaWorker
from tests.conftest import PgTarget
from tests.waiting import eventually

pytestmark = pytest.mark.integration

PARTITIONS = 4


class Order(BaseModel):
    nap_s: float = 0


class Done(BaseModel):
    ok: bool = True


class Go(BaseModel):
    pass


class Parked(Saga[Order, Done]):
    """Waits on a durable timer (``nap_s`` > 0) or for a signal: in memory, no steps."""

    name = "parked"
    go = Signal(Go)

    async def run(self, ctx: SagaContext, input: Order) -> Done:
        if input.nap_s:
            await ctx.sleep(timedelta(seconds=input.nap_s))
        else:
            await ctx.wait_signal("go", timeout=timedelta(hours=1))
        return Done()


def make_settings(pg: PgTarget, bootstrap: str, unique_id: str, **kafka: object) -> Settings:
    return Settings(
        pg=PostgresSettings(dsn=pg.database_dsn, db_schema=pg.schema),
        kafka=KafkaSettings.model_validate(
            {
                "bootstrap_servers": bootstrap,
                "topic_prefix": f"t{unique_id}",
                "group_id": f"engines-{unique_id}",
                "partitions": PARTITIONS,
                **kafka,
            }
        ),
        engine=EngineSettings(),
        admin=AdminSettings(enabled=False, port=0),
    )


@pytest.fixture
def settings(pg: PgTarget, kafka_bootstrap: str, unique_id: str) -> Settings:
    return make_settings(pg, kafka_bootstrap, unique_id)


@contextlib.asynccontextmanager
async def running(*workers: SagaWorker) -> AsyncIterator[None]:
    try:
        yield
    finally:
        await asyncio.gather(*(w.stop() for w in workers), return_exceptions=True)


def owned(*workers: SagaWorker) -> Callable[[], bool]:
    """Every partition is owned, by exactly one of ``workers``, and each owns some."""

    def check() -> bool:
        parts = [w.owned_partitions for w in workers]
        return all(parts) and sorted(p for ps in parts for p in ps) == list(range(PARTITIONS))

    return check


async def status(worker: SagaWorker, saga_id: str) -> SagaStatus | None:
    assert worker.engine is not None
    with contextlib.suppress(Exception):
        return (await worker.engine.get(saga_id)).status
    return None


async def test_a_rebalance_keeps_the_sagas_whose_partitions_stay(settings: Settings) -> None:
    first = SagaWorker(settings, [Parked])
    second = SagaWorker(settings, [Parked])
    async with running(first, second), SagaClient(settings) as client:
        await first.start()
        await eventually(owned(first))
        waiting = [await client.start(Parked, Order()) for _ in range(16)]
        napping = [await client.start(Parked, Order(nap_s=4)) for _ in range(8)]
        assert first.engine is not None
        engine, parts = first.engine, first.parts
        await eventually(lambda: set(waiting + napping) <= set(engine.live_saga_ids()))
        before = {i: engine.runtime_of(i) for i in waiting + napping}

        await second.start()  # the group rebalances: sticky, so first keeps a share
        await eventually(owned(first, second), timeout=30)
        kept = first.owned_partitions
        moved = second.owned_partitions
        assert kept
        assert moved

        def part(i: str) -> int:
            return partition_for(i, PARTITIONS)

        assert second.engine is not None
        other = second.engine
        for saga_id in waiting:
            if part(saga_id) in kept:
                # The same copy: held across the rebalance, not rebuilt from history.
                assert engine.runtime_of(saga_id) is before[saga_id]
            else:
                assert engine.runtime_of(saga_id) is None
        await eventually(
            lambda: all(other.runtime_of(i) is not None for i in waiting if part(i) in moved)
        )
        assert parts.stats.counts["sagas_kept_across_rebalance"] > 0
        # Timers fire on both sides: the kept sagas' were stopped during the rebalance
        # and armed again; the moved ones' were armed by the new owner's recovery.
        for saga_id in napping:
            await _until_completed(first if part(saga_id) in kept else second, saga_id)
        # And signals reach the kept ones, driven by their owner as before.
        for saga_id in waiting:
            await client.signal(saga_id, "go", Go())
        for saga_id in waiting:
            await _until_completed(first if part(saga_id) in kept else second, saga_id)


async def _is(worker: SagaWorker, saga_id: str, want: SagaStatus) -> bool:
    return await status(worker, saga_id) == want


async def _until_completed(worker: SagaWorker, saga_id: str) -> None:
    await eventually(lambda: _is(worker, saga_id, SagaStatus.COMPLETED), timeout=30)


async def test_a_member_back_under_its_name_gets_its_partitions_without_a_rebalance(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    named = {
        name: make_settings(pg, kafka_bootstrap, unique_id, group_instance_id=name)
        for name in ("engine-a", "engine-b")
    }
    a = SagaWorker(named["engine-a"], [Parked])
    b = SagaWorker(named["engine-b"], [Parked])
    again = SagaWorker(named["engine-a"], [Parked])
    async with running(a, b, again):
        await a.start()
        await b.start()
        await eventually(owned(a, b), timeout=30)
        a_had, b_had = a.owned_partitions, b.owned_partitions
        assert b.engine is not None
        revoked_before = b.parts.stats.counts["partitions_revoked"]

        # A static member sends no LeaveGroup: to the group this stop is a crash.
        await a.stop()
        await again.start()
        # Its name's partitions come straight back, well inside the session timeout
        # (after which the group would have rebalanced them onto b).
        await eventually(lambda: again.owned_partitions == a_had, timeout=5)
        assert b.owned_partitions == b_had
        assert b.parts.stats.counts["partitions_revoked"] == revoked_before


# --------------------------------------------------------------------------- start-up


class _LateProxy:
    """A TCP port that refuses connections until ``open()``, then forwards to a target:
    a dependency that comes up after the service that needs it."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    async def open(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in self._pipes:
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.get_running_loop().create_task(self._pipe(src, dst))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            dst.close()


def _failed_attempts(caplog: pytest.LogCaptureFixture, what: str) -> int:
    return sum(
        1
        for r in caplog.records
        if r.name == "saga_engine.startup"
        and what in r.getMessage()
        and "attempt" in r.getMessage()
    )


async def test_the_engine_waits_for_postgres_that_comes_up_late(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    dsn = urlsplit(settings.pg.dsn.get_secret_value())
    assert dsn.hostname is not None
    assert dsn.port is not None
    proxy = _LateProxy(dsn.hostname, dsn.port)
    late_dsn = urlunsplit(dsn._replace(netloc=f"{dsn.username}@127.0.0.1:{proxy.port}"))
    late = Settings(
        pg=PostgresSettings(dsn=late_dsn, db_schema=settings.pg.db_schema),
        kafka=settings.kafka,
        admin=settings.admin,
    )
    worker = SagaWorker(late, [Parked])
    caplog.set_level(logging.WARNING, logger="saga_engine.startup")
    starting = asyncio.get_running_loop().create_task(worker.start())
    try:
        await eventually(lambda: _failed_attempts(caplog, "Postgres is not reachable") >= 1)
        assert not starting.done()
        await proxy.open()
        await asyncio.wait_for(starting, 30)
        await eventually(owned(worker), timeout=30)
        async with SagaClient(settings) as client:
            saga_id = await client.start(Parked, Order(nap_s=0.5))
            await eventually(lambda: _is(worker, saga_id, SagaStatus.COMPLETED), timeout=30)
    finally:
        if not starting.done():
            starting.cancel()
        await worker.stop()
        await proxy.close()


class Apply(BaseModel):
    n: int


async def test_a_participant_waits_for_kafka_that_comes_up_late(
    settings: Settings, pg: PgTarget, caplog: pytest.LogCaptureFixture
) -> None:
    host, _, port = settings.kafka.bootstrap_servers.partition(":")
    proxy = _LateProxy(host, int(port))
    late = Settings(
        pg=settings.pg,
        kafka=settings.kafka.model_copy(update={"bootstrap_servers": f"127.0.0.1:{proxy.port}"}),
        participant=ParticipantSettings(
            dsn=pg.database_dsn,
            db_schema=f"{pg.schema}_alpha",  # its own (dropped below)
        ),
        admin=settings.admin,
    )
    participant = Participant("alpha", late)

    @participant.handles(Apply)
    async def apply(cmd: Apply, tx: Transaction) -> None:
        return None

    caplog.set_level(logging.WARNING, logger="saga_engine.startup")
    starting = asyncio.get_running_loop().create_task(participant.start())
    try:
        await eventually(lambda: _failed_attempts(caplog, "Kafka is not reachable") >= 1)
        assert not starting.done()
        await proxy.open()  # bootstrap through it; the broker's own address after that
        await asyncio.wait_for(starting, 30)
        await eventually(lambda: bool(participant.assignment), timeout=30)
    finally:
        if not starting.done():
            starting.cancel()
        await participant.stop()
        await proxy.close()
        conn = await asyncpg.connect(pg.database_dsn)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{pg.schema}_alpha" CASCADE')
        finally:
            await conn.close()
