"""A range moved under load, with SIGKILLs at each step of the move (issue 43): the
deployment of the chaos run past one database (``test_shard_chaos``: shards a and b on
Postgres clusters of the test's own, two engines and the drill's three participants as
real processes, a steady load of sagas over every partition), and partitions
``MOVED`` moved from b to a with ``saga shard move`` run as a process.

One move, killed at each of its crash points in turn (``SAGA_CRASH_AT``: the move
process SIGKILLs itself there, and each run gets one step further); during each run one
engine (the two in turn) is SIGKILLed too, as the run starts, and started again at once,
and the sagas of the other ranges must go on ending before the next run. Then the move is
run to its end.

At the end, in each shard's own tables and the participants' ledgers: every saga started
ended as its input says (nothing lost), every command was applied once (nothing
doubled), every history replays (the replay API, through the sharded store), and the
moved range's sagas are on a only, none left on b. While the range was paused (from the
step that paused it to the commit point) none of its sagas ended. Printed: how long the
moved range went without a saga ending, and the other ranges' throughput during the
move."""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from saga_engine import SagaStatus
from saga_engine.client import SagaClient
from saga_engine.core.planning._replay import HistoryExport, replay
from saga_engine.protocol import partition_for
from saga_engine.settings import PostgresSettings
from saga_engine.store._connect import connect_event_store
from saga_engine.store._pgshard_move import MOVE_CRASH_POINTS
from tests.conftest import PgTarget
from tests.internal.e2e.harness import ROOT
from tests.internal.e2e.shard_app import ShardOrder
from tests.internal.e2e.test_shard_chaos import (
    END,
    ENOUGH,
    PARTITIONS,
    RANGES,
    ChaosRun,
    Load,
    OwnClusters,
    Rows,
    _check_effects,
    _ended,
    _ended_between,
    chaos,  # noqa: F401 - the fixture
    own_clusters,  # noqa: F401 - the fixture
    settled_in_their_shards,
)
from tests.waiting import eventually, scaled

pytestmark = pytest.mark.integration

#: The range moved, from b (which holds 3-7) to a (0-2).
MOVED = frozenset({5, 6, 7})
MOVE_ARGS = ("shard", "move", "--partitions", "5-7", "--to", "a", "--batch", "25", "--json")


def _moved(saga_id: str) -> bool:
    return partition_for(saga_id, PARTITIONS) in MOVED


def _home(saga_id: str) -> str:
    """A saga's shard after the move."""
    return "a" if partition_for(saga_id, PARTITIONS) <= 2 or _moved(saga_id) else "b"


async def _both(clusters: OwnClusters, schema: str) -> dict[str, Rows]:
    return {s: await _ended(dsn, schema) for s, dsn in clusters.dsns.items()}


def _others(found: dict[str, Rows]) -> Rows:
    """The sagas of the ranges that do not move, wherever they are."""
    return {i: row for rows in found.values() for i, row in rows.items() if not _moved(i)}


async def _move(run: ChaosRun, crash_at: str | None = None) -> subprocess.CompletedProcess[str]:
    extra = {"SAGA_CRASH_AT": crash_at} if crash_at else {}
    return await _saga(run, *MOVE_ARGS, **extra)


async def _saga(run: ChaosRun, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    """``saga *args`` as a process of the deployment (``extra``: more environment)."""
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "saga_engine", *args],
        cwd=ROOT,
        env=run.cluster.env(**run.sharded, **extra),
        capture_output=True,
        text=True,
        timeout=scaled(180),
        check=False,
    )


async def _fence(dsn: str, schema: str) -> dict[int, str]:
    """A shard's ``shard_partitions``: the partitions it accepts writes of, and how."""
    conn = await asyncpg.connect(dsn, server_settings={"search_path": schema}, timeout=10)
    try:
        rows = await conn.fetch("SELECT partition, state FROM shard_partitions")
    finally:
        await conn.close()
    return {r["partition"]: r["state"] for r in rows}


class Steps:
    """The move, killed at each crash point with an engine; when each step was reached."""

    def __init__(self, run: ChaosRun, clusters: OwnClusters, schema: str) -> None:
        self.run, self.clusters, self.schema = run, clusters, schema
        self.runs = dict.fromkeys(run.admin_ports, "first")
        self.at: dict[str, datetime] = {}
        self.report: dict[str, Any] = {}

    async def kill_engine(self, n: int, step: str) -> None:
        """SIGKILLs engine ``n % 2`` and starts it again; waits until it took
        partitions and the other ranges' sagas went on ending after."""
        cluster = self.run.cluster
        engine = f"engine-{n % 2}"
        cluster.kill(f"{engine}-{self.runs[engine]}")
        killed_at = _now()
        self.runs[engine] = step
        self.run.start_engine(engine, step)
        await cluster.wait_partitions_taken(f"{engine}-{step}", timeout=90)
        await eventually(
            lambda: _both(self.clusters, self.schema),
            until=lambda found: _ended_between(_others(found), killed_at, END) >= ENOUGH,
            timeout=90,
            interval=0.5,
            what=f"{ENOUGH} sagas of the other ranges to end after {step}",
            context=cluster.logs_tail,
        )

    async def through(self) -> None:
        for n, point in enumerate(MOVE_CRASH_POINTS):
            self.at[f"{point} begun"] = _now()
            # The engine dies as the move's run starts, and recovers its partitions while
            # the run does its step (and the steps before it again, found done).
            killed, _ = await asyncio.gather(
                _move(self.run, point), self.kill_engine(n, point.removeprefix("move_"))
            )
            assert killed.returncode == -9, (point, killed.stdout, killed.stderr)
            assert f"crash point {point} reached" in killed.stderr, killed.stderr
            self.at[point] = _now()
        done = await _move(self.run)
        assert done.returncode == 0, done.stdout + done.stderr
        self.at["done"] = _now()
        self.report = json.loads(done.stdout)
        assert (self.report["outcome"], self.report["epoch"]) == ("moved", 2), self.report
        status = await _saga(self.run, "shard", "status", "--json")
        assert status.returncode == 0, status.stdout + status.stderr
        shown = json.loads(status.stdout)
        assert (shown["map"]["epoch"], shown["map"]["moving"]) == (2, None), shown
        held = {r["name"]: r["partitions"] for r in shown["shards"]}
        assert held == {"a": "0-2,5-7", "b": "3-4"}, shown
        for shard, want in (("a", {0, 1, 2, *MOVED}), ("b", {3, 4})):
            fence = await _fence(self.clusters.dsns[shard], self.schema)
            assert fence == dict.fromkeys(want, "active"), (shard, fence)


def _now() -> datetime:
    return datetime.now(UTC)


@pytest.mark.timeout(scaled(600))
async def test_a_move_killed_at_each_step_with_an_engine_loses_and_doubles_nothing(
    chaos: ChaosRun,  # noqa: F811 - the fixture
    own_clusters: OwnClusters,  # noqa: F811 - the fixture
    pg: PgTarget,
    unique_id: str,
) -> None:
    cluster, schema = chaos.cluster, pg.schema
    await chaos.migrate()
    chaos.start_participants()
    for engine in chaos.admin_ports:
        chaos.start_engine(engine, "first")
    await cluster.wait_partitions_taken("engine-0-first", "engine-1-first", timeout=90)
    load = Load()
    steps = Steps(chaos, own_clusters, schema)
    async with SagaClient(cluster.settings) as client:
        loading = asyncio.create_task(load.run(client, f"move-{unique_id}"))
        try:
            await eventually(
                lambda: _both(own_clusters, schema),
                until=lambda found: (
                    sum(1 for rows in found.values() for i in rows if _moved(i)) >= ENOUGH
                ),
                timeout=90,
                interval=0.5,
                what=f"{ENOUGH} sagas of the range to move before the move",
                context=cluster.logs_tail,
            )
            await steps.through()
        finally:
            load.stop.set()
            await loading
    expected = {
        i: SagaStatus.COMPENSATED if order.refuse else SagaStatus.COMPLETED
        for i, (_, order, _) in load.started.items()
    }
    final = await settled_in_their_shards(
        lambda: _both(own_clusters, schema),
        _home,
        expected,
        cluster,
        "every saga started to end as its input says, in its shard after the move",
    )
    ledger = await chaos.ledger()
    _print(steps, load, final, len(ledger))
    _check_effects(ledger, expected)
    await _replays(chaos, own_clusters, pg, sorted(expected))
    one = min(i for i in expected if _moved(i))  # and `saga replay`, read from shard a
    shown = await _saga(chaos, "replay", one, "--sagas", "tests.internal.e2e.shard_app", "--json")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert json.loads(shown.stdout)["saga_id"] == one
    # The range was paused from the step that paused it to the commit point: none of its
    # sagas ended in between (their writes were refused), and they went on after.
    paused = {i: row for i, row in final["a"].items() if _moved(i)}
    assert (
        _ended_between(paused, steps.at["move_after_pause"], steps.at["move_after_commit begun"])
        == 0
    )
    assert _ended_between(paused, steps.at["move_after_commit"], END) >= 1


async def _replays(run: ChaosRun, clusters: OwnClusters, pg: PgTarget, ids: list[str]) -> None:
    """Every saga's history, loaded through the sharded store (it follows the map in the
    control database), replays deterministically."""
    shards = [
        {"name": name, "partitions": RANGES[name], "dsn": dsn}
        for name, dsn in clusters.dsns.items()
    ]
    sharded = PostgresSettings.model_validate(
        {
            "dsn": pg.database_dsn,
            "db_schema": pg.schema,
            "control_dsn": pg.database_dsn,
            "shards": shards,
        }
    )
    store = await connect_event_store(run.cluster.settings.model_copy(update={"pg": sharded}))
    try:
        for saga_id in ids:
            loaded = await store.load(saga_id)
            history = HistoryExport(
                saga_id, loaded.record.saga_type, [s.event for s in loaded.events]
            )
            result = replay([ShardOrder], history)
            assert result.deterministic, (saga_id, result.error)
    finally:
        await store.close()


def _longest_gap(ends: list[datetime], begin: datetime, end: datetime) -> float:
    """The longest time within [begin, end] in which none of ``ends`` fell."""
    marks = [begin, *sorted(e for e in ends if begin < e < end), end]
    return max((b - a).total_seconds() for a, b in itertools.pairwise(marks))


def _print(steps: Steps, load: Load, final: dict[str, Rows], applied: int) -> None:
    begin, end = steps.at[f"{MOVE_CRASH_POINTS[0]} begun"], steps.at["done"]
    seconds = (end - begin).total_seconds()
    ends = {
        moved: [
            e for rows in final.values() for i, (_, e) in rows.items() if e and _moved(i) == moved
        ]
        for moved in (True, False)
    }
    others = sum(1 for e in ends[False] if begin < e <= end)
    moved = [i for i in load.started if _moved(i)]
    print(
        f"\nshard move under SIGKILLs: partitions 5-7 from b to a, "
        f"{len(MOVE_CRASH_POINTS)} crash points, an engine killed at each"
    )
    print(
        f"  {len(load.started)} sagas started ({len(moved)} of the moved range), "
        f"{applied} commands applied, none twice"
    )
    print(
        f"  the move took {seconds:.1f}s over {len(MOVE_CRASH_POINTS) + 1} runs; "
        f"paused {steps.report.get('paused_s')}s by its record (pause to commit, with the kills)"
    )
    print(
        f"  moved range: longest time without a saga ending {_longest_gap(ends[True], begin, end):.1f}s"
    )
    print(
        f"  other ranges: {others} sagas ended during the move ({others / seconds:.2f}/s), "
        f"longest time without one ending {_longest_gap(ends[False], begin, end):.1f}s"
    )
