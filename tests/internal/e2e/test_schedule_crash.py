"""Schedules with real engine processes.

- A SIGKILL of the engine in the middle of firing a schedule's tick: after its start
  request was acknowledged by Kafka, before the claim that moves ``next_fire_at``
  committed (crash point ``schedule_after_fire``). After a restart every tick has exactly
  one saga, none is missing, and the tick in flight at the crash was sent again and
  deduplicated.
- The same crash with ``overlap=skip`` and ``catchup=last``, the engine back after the
  next tick is due while the crashed tick's saga runs: no newer tick starts beside it,
  and the crashed tick counts as fired, not skipped (issue 22 §3).
- Two engine processes racing for forty schedules: one saga per tick, none missing, and
  both engines fired some.
"""

from __future__ import annotations

import itertools
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from saga_engine.core.planning._schedule import tick_key, tick_saga_id
from saga_engine.transport._topics import Topics
from saga_engine.transport._wire import decode
from tests.integration.kafka_helpers import read_topic_to_end
from tests.internal.e2e.harness import Cluster
from tests.waiting import eventually

pytestmark = pytest.mark.integration

APP = ["-m", "saga_engine", "worker", "tests.internal.e2e.schedule_app", "--log-level", "INFO"]


async def _inbox_ids(cluster: Cluster) -> Counter[str]:
    """The saga id of every start request in the inbox, to its end: each was acknowledged
    (the engine sent it before it recorded the tick, or before it crashed)."""
    records = await read_topic_to_end(cluster.settings.kafka, Topics(cluster.prefix).inbox)
    return Counter(
        decode(r.key, r.value, list(r.headers), max_bytes=1 << 20).saga_id for r in records
    )


async def test_sigkill_between_the_start_and_the_claim_commit_fires_the_tick_once(
    cluster: Cluster,
) -> None:
    # The third claim dies after Kafka acknowledged its start, before its commit.
    cluster._spawn("engine", APP, cluster.env(SAGA_CRASH_AT="schedule_after_fire:3"))
    assert await cluster.wait_exit("engine", timeout=90) == -9, cluster.log_tail("engine")
    assert "crash point schedule_after_fire reached" in cluster.log_tail("engine")
    [row] = await cluster.query("SELECT * FROM saga_schedules")
    crashed: datetime = row["next_fire_at"]  # its start was sent; the row did not move
    crashed_id = tick_saga_id("heartbeat", "heartbeat", crashed)
    assert row["fired_count"] >= 2
    assert (await _inbox_ids(cluster))[crashed_id] == 1

    cluster._spawn("engine", APP, cluster.env())
    # Sagas for at least three more seconds of ticks, every one completed.
    until = crashed + timedelta(seconds=3)

    async def caught_up() -> bool:
        [r] = await cluster.query("SELECT last_tick FROM saga_schedules")
        if r["last_tick"] is None or r["last_tick"] < until:
            return False
        open_ = await cluster.query("SELECT 1 FROM sagas WHERE status <> 'completed'")
        return not open_

    await eventually(
        caught_up,
        timeout=90,
        interval=0.2,
        what="the ticks to catch up, every saga completed",
        context=lambda: cluster.log_tail("engine"),
    )
    # The engine ticks on: stop it, then let an engine that fires nothing apply the starts
    # already sent, so that the schedule's row and the sagas are read as of one moment.
    cluster.stop_all()
    [row] = await cluster.query("SELECT * FROM saga_schedules")
    cluster._spawn("engine", APP, cluster.env(SAGA_SCHEDULES__ENABLED="false"))

    async def sagas() -> int:
        return int((await cluster.query("SELECT count(*) AS n FROM sagas"))[0]["n"])

    await eventually(
        sagas,
        until=lambda n: n >= row["fired_count"],
        timeout=90,
        interval=0.2,
        what="a saga for every tick fired",
        context=lambda: cluster.log_tail("engine"),
    )
    per_key = Counter(
        {
            r["idempotency_key"]: r["n"]
            for r in await cluster.query(
                "SELECT idempotency_key, count(*) AS n FROM sagas GROUP BY idempotency_key",
            )
        }
    )
    # One saga per tick, and no tick missing from the first to the last fired.
    assert set(per_key.values()) == {1}
    ticks = sorted(per_key)
    assert tick_key("heartbeat", crashed) in per_key
    first = min(datetime.fromisoformat(k.removeprefix("schedule:heartbeat:")) for k in ticks)
    last: datetime = row["last_tick"]
    expected = {
        tick_key("heartbeat", first + timedelta(seconds=i))
        for i in range(int((last - first).total_seconds()) + 1)
    }
    assert set(per_key) == expected
    # The crashed claim's count rolled back with it: each tick is counted once.
    assert row["fired_count"] == len(expected)
    # The crashed tick's start went out twice, and the engine started one saga.
    assert (await _inbox_ids(cluster))[crashed_id] == 2


OVERLAP_APP = [
    "-m",
    "saga_engine",
    "worker",
    "tests.internal.e2e.schedule_overlap_app",
    "--log-level",
    "INFO",
]


async def test_sigkill_between_the_start_and_the_claim_commit_keeps_overlap_skip(
    cluster: Cluster,
) -> None:
    # The first claim that fires dies after Kafka acknowledged its start.
    cluster._spawn("engine", OVERLAP_APP, cluster.env(SAGA_CRASH_AT="schedule_after_fire:1"))
    assert await cluster.wait_exit("engine", timeout=90) == -9, cluster.log_tail("engine")
    [row] = await cluster.query("SELECT * FROM saga_schedules")
    first_due: datetime = row["next_fire_at"]  # the row did not move
    assert (row["fired_count"], row["last_saga_id"]) == (0, None)
    # The one start it sent is of the tick due last when it claimed (catchup=last): the
    # first due, or a later one when the engine came up slowly (a busy machine).
    [(crashed_id, sent)] = (await _inbox_ids(cluster)).items()
    assert sent == 1
    crashed = next(
        tick
        for tick in (first_due + timedelta(seconds=n) for n in range(3600))
        if tick_saga_id("slow-report", "one-at-a-time", tick) == crashed_id
    )

    # Back once the next tick is due, the crashed tick's saga not even started yet.
    await eventually(lambda: _utc_now() > crashed + timedelta(seconds=1.5), timeout=10)
    cluster._spawn("engine", OVERLAP_APP, cluster.env())

    async def two_ran() -> bool:
        done = await cluster.query("SELECT 1 FROM sagas WHERE status = 'completed'")
        return len(done) >= 2

    await eventually(
        two_ran,
        timeout=90,
        interval=0.2,
        what="two sagas completed",
        context=lambda: cluster.log_tail("engine"),
    )
    cluster.stop_all()
    sagas = await cluster.query(
        "SELECT saga_id, idempotency_key, status, created_at, updated_at FROM sagas "
        "ORDER BY idempotency_key",
    )
    # The crashed tick ran, once; each saga started after the one before it ended.
    assert sagas[0]["saga_id"] == crashed_id
    assert len({s["idempotency_key"] for s in sagas}) == len(sagas)
    for before, after in itertools.pairwise(sagas):
        assert before["status"] == "completed"
        assert after["created_at"] >= before["updated_at"], (before, after)
    [row] = await cluster.query("SELECT * FROM saga_schedules")
    # The crashed tick is counted as fired; the ticks of its run as skipped.
    assert row["fired_count"] == len(sagas)
    due = int((row["next_fire_at"] - first_due).total_seconds())
    assert row["skipped_count"] == due - len(sagas)
    # Its start went out again after the restart, under its own saga id.
    assert (await _inbox_ids(cluster))[crashed_id] == 2


def _utc_now() -> datetime:
    return datetime.now(UTC)


RACE_APP = [
    "-m",
    "saga_engine",
    "worker",
    "tests.internal.e2e.schedule_race_app",
    "--log-level",
    "INFO",
]


async def test_two_engine_processes_racing_start_one_saga_per_tick(cluster: Cluster) -> None:
    from tests.internal.e2e.schedule_race_app import COUNT

    cluster._spawn("engine-a", RACE_APP, cluster.env())
    cluster._spawn("engine-b", RACE_APP, cluster.env())

    async def enough() -> bool:
        for name in ("engine-a", "engine-b"):
            assert cluster.procs[name].poll() is None, cluster.log_tail(name)
        rows = await cluster.query("SELECT fired_count FROM saga_schedules")
        return len(rows) == COUNT and min(r["fired_count"] for r in rows) >= 5

    async def sources() -> Counter[str]:
        """Whose start requests the inbox holds (each names the engine that sent it)."""
        records = await read_topic_to_end(cluster.settings.kafka, Topics(cluster.prefix).inbox)
        return Counter(
            decode(r.key, r.value, list(r.headers), max_bytes=1 << 20).source for r in records
        )

    await eventually(
        enough,
        timeout=90,
        interval=0.2,
        what="five ticks of every schedule",
        context=cluster.logs_tail,
    )
    # Both race: on a busy machine the second engine may come up after the first fired
    # five ticks of each, so wait until it fired some too.
    await eventually(
        sources,
        until=lambda found: len(found) == 2,
        timeout=90,
        interval=0.5,
        what="start requests from both engines",
        context=cluster.logs_tail,
    )
    cluster.stop_all()
    rows = await cluster.query("SELECT schedule_id, last_tick, fired_count FROM saga_schedules")
    # A claim the stop interrupted after its sends leaves its ticks here (migration 0009):
    # sent, perhaps, but not counted as fired; the schedule's next claim would send them
    # again under the same saga ids and count them.
    pending = {
        (r["schedule_id"], r["tick"])
        for r in await cluster.query("SELECT schedule_id, tick FROM saga_schedule_sends")
    }
    records = await read_topic_to_end(cluster.settings.kafka, Topics(cluster.prefix).inbox)
    sent = {r.key for r in records}  # the saga id of every start the engines sent

    async def all_started() -> bool:
        [n] = await cluster.query("SELECT count(*) AS n FROM sagas")
        return bool(n["n"] >= len(sent))

    # The engines stopped: the starts they sent are applied when one runs again.
    cluster._spawn("engine-a", RACE_APP, cluster.env(SAGA_SCHEDULES__ENABLED="false"))
    await eventually(all_started, timeout=90, interval=0.2)
    per_key = {
        r["idempotency_key"]: r["n"]
        for r in await cluster.query(
            "SELECT idempotency_key, count(*) AS n FROM sagas GROUP BY idempotency_key"
        )
    }
    assert set(per_key.values()) == {1}
    assert len(per_key) == len(sent)
    # Every schedule's ticks, from its first to its last fired, are all there: none lost;
    # after its last fired tick, only ticks an interrupted claim was sending.
    for r in rows:
        prefix = f"schedule:{r['schedule_id']}:"
        ticks = sorted(
            datetime.fromisoformat(k[len(prefix) :]) for k in per_key if k.startswith(prefix)
        )
        fired = [t for t in ticks if t <= r["last_tick"]]
        assert len(fired) == r["fired_count"]
        assert fired[-1] == r["last_tick"]
        assert all(b - a == timedelta(seconds=1) for a, b in itertools.pairwise(ticks))
        assert all((r["schedule_id"], t) in pending for t in ticks if t > r["last_tick"])
    # Both engines fired some of them.
    assert len(await sources()) == 2
