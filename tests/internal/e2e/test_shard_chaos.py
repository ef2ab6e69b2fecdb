"""The chaos run past one database (issue 43): two shards on Postgres clusters of the
test's own (the project's devstack on free ports: the suite's shared clusters are never
stopped), the control database in the suite's, engines and participants as real processes
under a steady load. Shard b's cluster is stopped for 30 s (``devstack.py pg-stop``), and
the engines are killed and started again while it is down, so that every partition is
taken and recovered anew with one shard away; then the cluster is started again.

Measured (and printed) in each shard's own ``sagas`` table, by the sagas' end times: shard
a's sagas go on completing during the outage, after the engines took their partitions
again; shard b's started during the outage wait and end once it is back. Every saga
started ends as its input says, and no participant applied a command twice (their own
ledgers). While b is down each engine's ``/health`` is degraded naming it, and ``GET
/sagas`` answers 200 with the shards that answered and ``missing_shards``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg
import httpx
import pytest

from saga_engine import SagaStatus
from saga_engine.client import SagaClient
from saga_engine.protocol import partition_for
from tests.conftest import PgTarget
from tests.internal.e2e.drill_app import PARTICIPANTS, OrderInput
from tests.internal.e2e.harness import ROOT, Cluster
from tests.internal.e2e.shard_app import ShardOrder
from tests.waiting import eventually, scaled

pytestmark = pytest.mark.integration

PARTITIONS = 8
#: Uneven on purpose: two engines of four partitions each cannot split them along the
#: shards, so an engine drives partitions of both, and its shard-a partitions must go on
#: while its shard-b ones wait.
RANGES = {"a": "0-2", "b": "3-7"}
#: How long shard b's cluster stays down (at least: until shard a showed progress).
OUTAGE_S = 30.0
#: Sagas started a second, through the outage.
RATE = 3.0
#: The sagas of a shard that must end in a phase before the run moves on.
ENOUGH = 3
#: Bounds of the times compared.
BEGIN, END = datetime.min.replace(tzinfo=UTC), datetime.max.replace(tzinfo=UTC)


def _free_port() -> int:
    """A free port below the kernel's ephemeral range: a stopped cluster's port must
    not be taken by an outgoing connection before it starts again."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 32000)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-32000")


@dataclass
class OwnClusters:
    """Postgres clusters 2 and 3 of a devstack of the test's own (its cluster 1 is the
    suite's, named by SAGA_PG__DSN, so nothing is started for it; its broker is the
    suite's likewise): shard a on cluster 2, shard b on cluster 3."""

    env: dict[str, str]
    ports: tuple[int, int]

    @property
    def dsns(self) -> dict[str, str]:
        return {
            shard: f"postgresql://postgres@127.0.0.1:{port}/saga"
            for shard, port in zip(RANGES, self.ports, strict=True)
        }

    def devstack(self, *args: str) -> None:
        done = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "devstack.py"), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=scaled(120),
            check=False,
        )
        assert done.returncode == 0, f"devstack {' '.join(args)}: {done.stdout}{done.stderr}"

    async def stop(self, shard: str) -> None:
        await asyncio.to_thread(self.devstack, "pg-stop", str(list(RANGES).index(shard) + 2))

    async def start(self, shard: str) -> None:
        await asyncio.to_thread(self.devstack, "pg-start", str(list(RANGES).index(shard) + 2))


@pytest.fixture
def own_clusters(pg: PgTarget, kafka_bootstrap: str) -> Iterator[OwnClusters]:
    first, kafka, controller = _free_port(), _free_port(), _free_port()
    ports = (_free_port(), _free_port())
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
    env.update(
        SAGA_PG__DSN=pg.database_dsn,
        SAGA_KAFKA__BOOTSTRAP_SERVERS=kafka_bootstrap,
        SAGA_DEV_PG_PORT=str(first),
        SAGA_DEV_PG_CLUSTERS="3",
        SAGA_DEV_PG_EXTRA_PORTS=",".join(map(str, ports)),
        SAGA_DEV_KAFKA_PORT=str(kafka),
        SAGA_DEV_KAFKA_CONTROLLER_PORT=str(controller),
    )
    clusters = OwnClusters(env, ports)
    state = ROOT / ".dev" / f"state-{first}-{kafka}-{controller}.json"
    try:
        clusters.devstack("up")
        yield clusters
    finally:
        datadirs = []
        if state.exists():
            recorded = json.loads(state.read_text()).get("extra_postgres", [])
            datadirs = [e["datadir"] for e in recorded if e.get("datadir")]
        clusters.devstack("down")
        for datadir in datadirs:
            shutil.rmtree(datadir, ignore_errors=True)
        for leftover in (ROOT / ".dev").glob(f"*-{first}-{kafka}-{controller}*"):
            leftover.unlink()


@dataclass
class Load:
    """Sagas started at ``RATE`` a second until stopped: id -> (shard, input, start)."""

    started: dict[str, tuple[str, OrderInput, datetime]] = field(default_factory=dict)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, client: SagaClient, prefix: str) -> None:
        n = 0
        while not self.stop.is_set():
            saga_id = f"{prefix}-{n:05d}"
            order = OrderInput(order=n, refuse=n % 4 == 3)
            await client.start(ShardOrder, order, saga_id=saga_id)
            self.started[saga_id] = (_shard(saga_id), order, datetime.now(UTC))
            n += 1
            with contextlib.suppress(TimeoutError):  # the pace of the load
                await asyncio.wait_for(self.stop.wait(), 1 / RATE)

    def of(self, shard: str) -> dict[str, datetime]:
        return {i: at for i, (s, _, at) in self.started.items() if s == shard}


def _shard(saga_id: str) -> str:
    return "a" if partition_for(saga_id, PARTITIONS) <= 2 else "b"


#: A shard's sagas: id -> (status, end time).
Rows = dict[str, tuple[SagaStatus, datetime | None]]


@dataclass(frozen=True)
class Outage:
    """When shard b was down for sure (``down_at``: pg-stop returned; ``up_at``: pg-start
    was called) and when the engines had taken the partitions again; how many of shard
    a's sagas ended while b was down, and after the retake."""

    down_at: datetime
    retaken_at: datetime
    up_at: datetime
    a_ended_during: int
    a_ended_after_retake: int

    @property
    def seconds(self) -> float:
        return round((self.up_at - self.down_at).total_seconds(), 1)

    def during(self, started: dict[str, datetime]) -> list[str]:
        return [i for i, at in started.items() if self.down_at < at <= self.up_at]


def _ended_between(rows: Rows, after: datetime, until: datetime) -> int:
    return sum(1 for _, ended in rows.values() if ended is not None and after < ended <= until)


async def settled_in_their_shards(
    read: Callable[[], Awaitable[dict[str, Rows]]],
    home: Callable[[str], str],
    expected: dict[str, SagaStatus],
    cluster: Cluster,
    what: str,
) -> dict[str, Rows]:
    """Each shard's sagas (``read``) once every expected saga has ended as expected in
    its ``home`` shard; and no shard holds another's saga."""
    final = await eventually(
        read,
        until=lambda found: all(
            found[home(i)].get(i, (None, None))[0] == want for i, want in expected.items()
        ),
        timeout=180,
        interval=0.5,
        what=what,
        context=cluster.logs_tail,
    )
    for shard, rows in final.items():
        strays = sorted(i for i in rows if home(i) != shard)
        assert not strays, f"shard {shard} holds other shards' sagas: {strays[:5]}"
    return final


async def _ended(dsn: str, schema: str) -> Rows:
    """Every saga of a shard's own ``sagas`` table: its status and end time."""
    conn = await asyncpg.connect(dsn, server_settings={"search_path": schema}, timeout=10)
    try:
        rows = await conn.fetch("SELECT saga_id, status, ended_at FROM sagas")
    finally:
        await conn.close()
    return {r["saga_id"]: (SagaStatus(r["status"]), r["ended_at"]) for r in rows}


async def _sagas_end(cluster: Cluster, dsn: str, schema: str, after: datetime, what: str) -> None:
    """Waits until ``ENOUGH`` sagas of the shard at ``dsn`` ended after ``after``."""
    await eventually(
        lambda: _ended(dsn, schema),
        until=lambda rows: _ended_between(rows, after, END) >= ENOUGH,
        timeout=90,
        interval=0.5,
        what=f"{ENOUGH} sagas to end: {what}",
        context=cluster.logs_tail,
    )


async def _engine_answers(port: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """``GET /sagas`` (200 asserted) and ``/health`` of the engine on ``port``."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
        listed = await http.get("/sagas", params={"limit": 5})
        health = await http.get("/health")
    assert listed.status_code == 200, listed.text
    return listed.json(), health.json()


def _degraded_naming(shard: str, found: tuple[dict[str, Any], dict[str, Any]]) -> bool:
    listed, health = found
    missing = [m["shard"] for m in listed.get("missing_shards", [])]
    return (
        missing == [shard]
        and health.get("status") == "degraded"
        and any(f"shard {shard!r}" in p for p in health.get("problems", []))
    )


class ChaosRun:
    """The processes of the run: two engines and the drill app's three participants."""

    def __init__(self, cluster: Cluster, pg: PgTarget, clusters: OwnClusters) -> None:
        self.cluster = cluster
        self.pg = pg
        shards = [
            {"name": name, "partitions": RANGES[name], "dsn": dsn}
            for name, dsn in clusters.dsns.items()
        ]
        self.sharded = {
            "SAGA_PG__SHARDS": json.dumps(shards),
            "SAGA_PG__CONTROL_DSN": pg.database_dsn,
            # Migrated once before (`saga migrate`): an engine's own migration would
            # wait for a shard that is down, and the engines start again while one is.
            "SAGA_ENGINE__AUTO_MIGRATE": "false",
        }
        self.admin_ports = {f"engine-{i}": _free_port() for i in range(2)}

    async def migrate(self) -> None:
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "saga_engine", "migrate"],
            cwd=ROOT,
            env=self.cluster.env(**self.sharded),
            capture_output=True,
            text=True,
            timeout=scaled(120),
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr

    def start_participants(self) -> None:
        for name in PARTICIPANTS:
            self.cluster._spawn(
                f"participant-{name}",
                ["-m", "tests.internal.e2e.drill_app", "participant", name],
                self.cluster.env(
                    SAGA_PARTICIPANT__DB_SCHEMA=self.ledger_schema(name),
                    SAGA_PARTICIPANT__DRILL_LEDGER="1",
                ),
            )

    def start_engine(self, engine: str, run: str) -> None:
        """``engine`` (its admin port kept across restarts), logging as ``engine-run``."""
        port = str(self.admin_ports[engine])
        self.cluster._spawn(
            f"{engine}-{run}",
            ["-m", "saga_engine", "worker", "tests.internal.e2e.shard_app", "--log-level", "INFO"],
            self.cluster.env(**self.sharded, SAGA_ADMIN__PORT=port),
        )

    async def each_engine(
        self, until: Callable[[tuple[dict[str, Any], dict[str, Any]]], bool], what: str
    ) -> None:
        """Waits until each engine's ``GET /sagas`` and ``/health`` answer ``until``."""
        for engine, port in self.admin_ports.items():
            await eventually(
                lambda p=port: _engine_answers(p),  # type: ignore[misc]
                until=until,
                timeout=30,
                interval=0.5,
                what=f"{engine}: {what}",
            )

    def ledger_schema(self, name: str) -> str:
        return f"{self.pg.schema}_{name}"

    async def ledger(self) -> list[asyncpg.Record]:
        conn = await asyncpg.connect(self.pg.database_dsn)
        try:
            rows: list[asyncpg.Record] = []
            for name in PARTICIPANTS:
                rows += await conn.fetch(
                    f"SELECT $1::text AS participant, command_id, saga_id, compensation "
                    f'FROM "{self.ledger_schema(name)}".drill_ledger',
                    name,
                )
            return rows
        finally:
            await conn.close()

    async def drop_ledgers(self) -> None:
        conn = await asyncpg.connect(self.pg.database_dsn)
        try:
            for name in PARTICIPANTS:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{self.ledger_schema(name)}" CASCADE')
        finally:
            await conn.close()


@pytest.fixture
async def chaos(
    cluster: Cluster, pg: PgTarget, own_clusters: OwnClusters
) -> AsyncIterator[ChaosRun]:
    cluster.partitions = PARTITIONS
    run = ChaosRun(cluster, pg, own_clusters)
    try:
        yield run
    finally:
        cluster.stop_all()
        await run.drop_ledgers()


@pytest.mark.timeout(scaled(420))
async def test_one_shard_down_for_30s_the_others_sagas_go_on_and_nothing_is_lost_or_doubled(
    chaos: ChaosRun, own_clusters: OwnClusters, pg: PgTarget, unique_id: str
) -> None:
    cluster, dsns, schema = chaos.cluster, own_clusters.dsns, pg.schema
    await chaos.migrate()
    chaos.start_participants()
    for engine in chaos.admin_ports:
        chaos.start_engine(engine, "first")
    await cluster.wait_partitions_taken("engine-0-first", "engine-1-first", timeout=90)
    load = Load()
    async with SagaClient(cluster.settings) as client:
        loading = asyncio.create_task(load.run(client, f"chaos-{unique_id}"))
        try:
            outage = await _outage(chaos, own_clusters, load, schema)
        finally:
            load.stop.set()
            await loading
    # Every saga started ends, as its input says, in its own shard only.
    expected = {
        i: SagaStatus.COMPENSATED if order.refuse else SagaStatus.COMPLETED
        for i, (_, order, _) in load.started.items()
    }

    async def both() -> dict[str, Rows]:
        return {s: await _ended(dsn, schema) for s, dsn in dsns.items()}

    final = await settled_in_their_shards(
        both, _shard, expected, cluster, "every saga started to end as its input says"
    )
    ledger = await chaos.ledger()
    _print(outage, load, final, ledger)
    _check_effects(ledger, expected)
    # Shard a went on throughout: sagas ended while b was down, after the engines had
    # taken every partition again (recovery did not wait for b).
    assert outage.a_ended_after_retake >= ENOUGH, outage
    # Shard b's sagas waited: none ended while it was down, and every one started then
    # ended after it came back.
    assert _ended_between(final["b"], outage.down_at, outage.up_at) == 0, outage
    waited = outage.during(load.of("b"))
    assert waited, f"no saga of shard b was started during the outage: {outage}"
    late = [i for i in waited if _ended_between({i: final["b"][i]}, outage.up_at, END) == 0]
    assert not late, f"sagas of shard b started during the outage, not ended after it: {late}"


async def _outage(chaos: ChaosRun, clusters: OwnClusters, load: Load, schema: str) -> Outage:
    """Stops shard b's cluster under the load, restarts the engines while it is down,
    checks what they answer, starts it again; the phase times and what was measured."""
    cluster, dsns = chaos.cluster, clusters.dsns
    for shard in RANGES:
        await _sagas_end(cluster, dsns[shard], schema, BEGIN, f"shard {shard}'s, before it")
    await clusters.stop("b")
    down_at = datetime.now(UTC)
    begin = time.monotonic()
    # The engines die and start again while b is down: every partition is taken anew,
    # and its sagas recovered from a store of which one shard does not answer.
    for engine in chaos.admin_ports:
        cluster.kill(f"{engine}-first")
        chaos.start_engine(engine, "again")
    await cluster.wait_partitions_taken("engine-0-again", "engine-1-again", timeout=90)
    retaken_at = datetime.now(UTC)
    await chaos.each_engine(
        lambda found: _degraded_naming("b", found),
        "GET /sagas missing shard b, /health degraded naming it",
    )
    await _sagas_end(
        cluster, dsns["a"], schema, retaken_at, "shard a's, after the engines took partitions"
    )
    # The fault's length (at least): not a wait for something to happen.
    await asyncio.sleep(max(0.0, begin + OUTAGE_S - time.monotonic()))
    a_rows = await _ended(dsns["a"], schema)
    # Down for sure from pg-stop's return to pg-start's call (it answers before
    # pg-start returns): the window in which shard b must have ended nothing.
    up_at = datetime.now(UTC)
    await clusters.start("b")
    # Shard b's sagas go on again, and /health says so once a call to b succeeded.
    await _sagas_end(cluster, dsns["b"], schema, up_at, "shard b's, once it is back")
    await chaos.each_engine(
        lambda found: found[1].get("status") == "ok" and not found[0].get("missing_shards"),
        "/health ok and nothing missing once shard b is back",
    )
    return Outage(
        down_at=down_at,
        retaken_at=retaken_at,
        up_at=up_at,
        a_ended_during=_ended_between(a_rows, down_at, up_at),
        a_ended_after_retake=_ended_between(a_rows, retaken_at, up_at),
    )


def _print(
    outage: Outage, load: Load, final: dict[str, Rows], ledger: list[asyncpg.Record]
) -> None:
    down_at, up_at = outage.down_at, outage.up_at
    print(f"\nshard chaos: shard b down {outage.seconds}s, engines restarted meanwhile")
    for shard, rows in final.items():
        ends = [e for _, e in rows.values() if e is not None]
        phases = Counter(
            "before" if e <= down_at else "during" if e <= up_at else "after" for e in ends
        )
        mine = load.of(shard)
        waits = [(e - at).total_seconds() for i, at in mine.items() if (e := rows[i][1])]
        statuses = Counter(s.value for s, _ in rows.values())
        print(
            f"  shard {shard}: {len(mine)} started ({len(outage.during(mine))} during the "
            f"outage); ended before {phases['before']}, during {phases['during']}, after "
            f"{phases['after']}; longest start-to-end {max(waits, default=0):.1f}s; "
            f"{dict(statuses)}"
        )
    print(
        f"  shard a ended during the outage: {outage.a_ended_during} "
        f"(after the engines took the partitions again: {outage.a_ended_after_retake})"
    )
    last_b = max((e for _, e in final["b"].values() if e is not None), default=up_at)
    print(f"  shard b drained {(last_b - up_at).total_seconds():.1f}s after it was back")
    print(f"  participants applied {len(ledger)} commands, none twice")


def _check_effects(ledger: list[asyncpg.Record], expected: dict[str, SagaStatus]) -> None:
    """No command applied twice, and each saga's effects as its outcome says: every
    participant applied a completed saga's step once; a compensated one's first two
    steps were applied and undone once, the refused third not applied."""
    twice = {c: n for c, n in Counter(r["command_id"] for r in ledger).items() if n > 1}
    assert not twice, f"commands applied more than once: {twice}"
    per_saga: dict[str, list[tuple[str, bool]]] = defaultdict(list)
    for r in ledger:
        per_saga[r["saga_id"]].append((r["participant"], r["compensation"]))
    for saga_id, status in expected.items():
        want = [(p, False) for p in PARTICIPANTS]
        if status is SagaStatus.COMPENSATED:
            want = [(p, c) for p in PARTICIPANTS[:-1] for c in (False, True)]
        assert sorted(per_saga[saga_id]) == sorted(want), (saga_id, status, per_saga[saga_id])
