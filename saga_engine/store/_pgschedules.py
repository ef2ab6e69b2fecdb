"""Durable schedules in Postgres (migrations 0007 and 0009): the rows, and the claim that
fires them.

The claim (:meth:`PostgresScheduleStore.fire_due`) is the heart of "exactly once per
tick" with any number of engines:

1. ``SELECT ... FOR UPDATE SKIP LOCKED`` takes up to ``limit`` due rows;
2. the pure :func:`saga_engine.core.planning._schedule.plan` picks the ticks each row fires;
3. the ticks to fire are recorded in ``saga_schedule_sends`` (migration 0009), in a
   transaction of their own that commits at once;
4. ``fire`` sends every tick's start request and returns once Kafka acknowledged all;
5. the rows' ``next_fire_at`` moves past now, their sends are deleted, and the
   transaction commits.

A row stays locked from 1 to 5, so no other engine fires the same tick meanwhile. A
crash (or a failed send) before 5's commit leaves ``next_fire_at`` where it was and the
ticks of 3 recorded: the next claim sends those ticks again, under the same saga ids
(:func:`~saga_engine.core.planning._schedule.tick_saga_id`), which the engine's start path
deduplicates, counts them as fired, and takes the newest one's saga as the one
``overlap=skip`` waits on (``plan``'s ``sent``): their sagas may run though no row names
them. A tick is never lost (``next_fire_at`` moves only after the starts are
acknowledged), never doubled (its saga id is fixed), and a tick that may have started
is never taken for skipped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Final, TypeAlias

import asyncpg

from saga_engine.core.planning._schedule import (
    Overlap,
    Plan,
    Schedule,
    ScheduleState,
    plan,
    tick_key,
    trigger_key,
)
from saga_engine.kernel._errors import ScheduleConflict, ScheduleNotFound
from saga_engine.kernel._settings import PostgresSettings
from saga_engine.store._pgbase import _json, _unavailable_as_transient, side_pool
from saga_engine.store._schedule_store import (
    Fire,
    FireResult,
    Firing,
    SagaStatusOf,
    ScheduleRow,
    firing_for,
    previous_saga,
    still_running,
    stored_schedule,
)

__all__ = ["PostgresScheduleStore"]

_COLUMNS: Final = (
    "schedule_id, saga_type, spec, input, catchup, catchup_max, overlap, state, origin, "
    "definition, next_fire_at, last_fired_at, last_tick, last_saga_id, fired_count, "
    "skipped_count, created_at, updated_at"
)


#: Claimed rows with their sent ticks, and with their plans (aliases: the store's ``list``
#: method hides the builtin in its class body).
_Claimed: TypeAlias = list[tuple[ScheduleRow, list[datetime]]]
_Planned: TypeAlias = list[tuple[ScheduleRow, Plan]]


def _sent(r: asyncpg.Record) -> list[datetime]:
    """A claimed row's ticks in saga_schedule_sends, oldest first (``_CLAIM``'s ``sent``)."""
    return list(r["sent"] or ())


async def _locked(conn: Any, schedule_id: str) -> ScheduleRow:
    """The schedule's row, locked (FOR UPDATE) until the transaction ends; raises
    ScheduleNotFound."""
    r = await conn.fetchrow(
        f"SELECT {_COLUMNS} FROM saga_schedules WHERE schedule_id = $1 FOR UPDATE", schedule_id
    )
    if r is None:
        raise ScheduleNotFound(schedule_id)
    return _row(r)


def _row(r: asyncpg.Record) -> ScheduleRow:
    return ScheduleRow(
        schedule=stored_schedule(r["definition"]),
        state=ScheduleState(r["state"]),
        origin=r["origin"],
        next_fire_at=r["next_fire_at"],
        last_fired_at=r["last_fired_at"],
        last_tick=r["last_tick"],
        last_saga_id=r["last_saga_id"],
        fired_count=r["fired_count"],
        skipped_count=r["skipped_count"],
        created_at=r["created_at"],
        updated_at=r["updated_at"],
    )


# FOR UPDATE SKIP LOCKED: every engine polls the same due rows. Each takes the rows no
# other transaction holds and skips the locked ones instead of queueing behind them, so
# engines split a burst between them, and a row (its tick) is in one engine's hands at a
# time: the lock is held until the commit that moves next_fire_at, after the starts are
# acknowledged. ORDER BY next_fire_at: the most overdue first (the partial index's order).
# ``sent``: the ticks a claim of the row that never committed recorded before its send;
# only a claim holding the row writes them, so those of a row this claim locked are
# final (a row another claim holds is skipped).
_CLAIM: Final = f"""
SELECT {_COLUMNS},
    (SELECT array_agg(x.tick ORDER BY x.tick) FROM saga_schedule_sends AS x
     WHERE x.schedule_id = s.schedule_id) AS sent
FROM saga_schedules AS s
WHERE state = 'active' AND next_fire_at <= $1
ORDER BY next_fire_at
LIMIT $2
FOR UPDATE OF s SKIP LOCKED
"""

# ON CONFLICT DO NOTHING: a tick sent again (a previous claim's, see _CLAIM) is already
# there. Run outside the claim's transaction, so that it is durable before the send.
_RECORD_SENDS: Final = """
INSERT INTO saga_schedule_sends (schedule_id, tick)
SELECT * FROM unnest($1::text[], $2::timestamptz[])
ON CONFLICT DO NOTHING
"""

# The claimed rows' sends go in the same statement: the commit that records what they
# fired is the one that forgets them.
_ADVANCE: Final = """
WITH forgotten AS (
    DELETE FROM saga_schedule_sends WHERE schedule_id = ANY($1::text[])
)
UPDATE saga_schedules AS s SET
    next_fire_at  = u.next_fire_at,
    last_fired_at = CASE WHEN u.last_saga_id IS NULL THEN s.last_fired_at ELSE $7 END,
    last_tick     = coalesce(u.last_tick, s.last_tick),
    last_saga_id  = coalesce(u.last_saga_id, s.last_saga_id),
    fired_count   = s.fired_count + u.fired,
    skipped_count = s.skipped_count + u.skipped,
    updated_at    = $7
FROM unnest($1::text[], $2::timestamptz[], $3::timestamptz[], $4::text[], $5::int[], $6::int[])
    AS u(schedule_id, next_fire_at, last_tick, last_saga_id, fired, skipped)
WHERE s.schedule_id = u.schedule_id
"""


#: The previous sagas' statuses a claim reads at a time through ``status_of``.
_STATUS_READS: Final = 16


class PostgresScheduleStore:
    """The ``saga_schedules`` table. Open it with :meth:`connect` (a small pool of its
    own: the event store's writer keeps its pool for the hot path).

    ``status_of``: where ``overlap=skip`` reads its previous sagas' statuses when they
    are not in this database (past one database: the schedules live in the control
    database, the sagas in the shards; the sharded event store's, ``saga_status_of``).
    None: the ``sagas`` table of this database, in the claim's transaction."""

    def __init__(
        self,
        pool: asyncpg.Pool[asyncpg.Record],
        *,
        grace: timedelta,
        status_of: SagaStatusOf | None = None,
    ) -> None:
        self._pool = pool
        self._grace = grace
        self._status_of = status_of

    @classmethod
    async def connect(
        cls,
        settings: PostgresSettings,
        *,
        grace: timedelta = timedelta(seconds=60),
        claims_in_flight: int = 3,
        status_of: SagaStatusOf | None = None,
    ) -> PostgresScheduleStore:
        # Two per claim of a burst (its transaction, and the sends it records before
        # sending, committed apart), and two more: the loop's probe and the admin API.
        # With one per claim, claims holding every connection would wait for a second
        # one forever.
        pool = await side_pool(settings, max_size=2 * claims_in_flight + 2)
        return cls(pool, grace=grace, status_of=status_of)

    async def close(self) -> None:
        await self._pool.close()

    async def migrated(self) -> bool:
        with _unavailable_as_transient():
            found: bool = await self._pool.fetchval(
                "SELECT to_regclass('saga_schedules') IS NOT NULL "
                "AND to_regclass('saga_schedule_sends') IS NOT NULL"
            )
        return found

    # ------------------------------------------------------------------ definitions

    async def upsert(self, schedule: Schedule, now: datetime, *, origin: str) -> str:
        """Creates the schedule, or checks the existing one: ``created``, ``unchanged``
        or (code only) ``updated``. Raises ScheduleConflict for an operator's create over
        another definition, or a code declaration over an operator's schedule."""
        definition = schedule.definition()
        spec = schedule.spec
        with _unavailable_as_transient():
            async with self._pool.acquire() as conn, conn.transaction():
                # ON CONFLICT DO NOTHING: two engines starting with the same declared
                # schedules race to create it; the loser finds the winner's row below
                # (locked FOR UPDATE, so a change of definition is applied once).
                created = await conn.fetchval(
                    """
                    INSERT INTO saga_schedules (schedule_id, saga_type, spec, input, catchup,
                        catchup_max, overlap, state, origin, definition, next_fire_at,
                        created_at, updated_at)
                    VALUES ($1, $2, $3, $4, $5, $6, $7, 'active', $8, $9, $10, $11, $11)
                    ON CONFLICT (schedule_id) DO NOTHING
                    RETURNING true
                    """,
                    schedule.id,
                    schedule.saga,
                    _json(spec.model_dump(mode="json")),
                    _json(schedule.input),
                    schedule.catchup.value,
                    schedule.catchup_max,
                    schedule.overlap.value,
                    origin,
                    _json(definition),
                    spec.next_after(now),
                    now,
                )
                if created:
                    return "created"
                row = await conn.fetchrow(
                    "SELECT origin, definition FROM saga_schedules WHERE schedule_id = $1 "
                    "FOR UPDATE",
                    schedule.id,
                )
                if row is None:  # deleted between the two statements
                    raise ScheduleConflict(f"schedule {schedule.id!r} was deleted meanwhile")
                if row["definition"] == definition and row["origin"] == origin:
                    return "unchanged"
                if origin == "api" or row["origin"] != origin:
                    raise ScheduleConflict(
                        f"schedule {schedule.id!r} exists ({row['origin']}) with another "
                        "definition: delete it first, or use another id"
                    )
                # Code changed its declaration: the new spec applies from now on (its
                # state, an operator's pause, and its counts stay).
                await conn.execute(
                    """
                    UPDATE saga_schedules SET saga_type = $2, spec = $3, input = $4,
                        catchup = $5, catchup_max = $6, overlap = $7, definition = $8,
                        next_fire_at = $9, updated_at = $10
                    WHERE schedule_id = $1
                    """,
                    schedule.id,
                    schedule.saga,
                    _json(spec.model_dump(mode="json")),
                    _json(schedule.input),
                    schedule.catchup.value,
                    schedule.catchup_max,
                    schedule.overlap.value,
                    _json(definition),
                    spec.next_after(now),
                    now,
                )
                # Ticks of the old definition a dead claim sent are not sent again under
                # the new one (another saga type would give them other saga ids).
                await conn.execute(
                    "DELETE FROM saga_schedule_sends WHERE schedule_id = $1", schedule.id
                )
                return "updated"

    async def get(self, schedule_id: str) -> ScheduleRow:
        with _unavailable_as_transient():
            r = await self._pool.fetchrow(
                f"SELECT {_COLUMNS} FROM saga_schedules WHERE schedule_id = $1", schedule_id
            )
        if r is None:
            raise ScheduleNotFound(schedule_id)
        return _row(r)

    async def list(self, *, limit: int = 100, after: str = "") -> list[ScheduleRow]:
        with _unavailable_as_transient():
            rows = await self._pool.fetch(
                f"SELECT {_COLUMNS} FROM saga_schedules WHERE schedule_id > $1 "
                "ORDER BY schedule_id LIMIT $2",
                after,
                limit,
            )
        return [_row(r) for r in rows]

    async def set_state(self, schedule_id: str, state: ScheduleState, now: datetime) -> ScheduleRow:
        """Pauses or resumes (``ScheduleRow.moved_to``)."""
        with _unavailable_as_transient():
            async with self._pool.acquire() as conn, conn.transaction():
                # Locked: waits for a claim holding the row, so a resume's next_fire_at
                # is not overwritten by that claim's commit.
                moved = (await _locked(conn, schedule_id)).moved_to(state, now)
                await conn.execute(
                    "UPDATE saga_schedules SET state = $2, next_fire_at = $3, updated_at = $4 "
                    "WHERE schedule_id = $1",
                    schedule_id,
                    moved.state.value,
                    moved.next_fire_at,
                    now,
                )
        return await self.get(schedule_id)

    async def delete(self, schedule_id: str) -> None:
        with _unavailable_as_transient():
            # A claim holding the row makes this wait for its commit: a tick being fired
            # is fired, and nothing fires after the delete.
            found = await self._pool.fetchval(
                """
                WITH forgotten AS (
                    DELETE FROM saga_schedule_sends WHERE schedule_id = $1
                )
                DELETE FROM saga_schedules WHERE schedule_id = $1 RETURNING true
                """,
                schedule_id,
            )
        if not found:
            raise ScheduleNotFound(schedule_id)

    # ------------------------------------------------------------------ firing

    async def earliest_due(self) -> datetime | None:
        """The earliest next_fire_at of an active schedule (one index probe)."""
        with _unavailable_as_transient():
            value: datetime | None = await self._pool.fetchval(
                "SELECT next_fire_at FROM saga_schedules WHERE state = 'active' "
                "ORDER BY next_fire_at LIMIT 1"
            )
        return value

    async def fire_due(
        self,
        now: datetime,
        limit: int,
        fire: Fire,
        *,
        clock: Callable[[], datetime],
        after_fire: Callable[[], None] | None = None,
    ) -> FireResult:
        """Claims up to ``limit`` due schedules, fires their ticks, moves them on (see the
        module's docstring). ``clock`` stamps last_fired_at once the starts are durable."""
        with _unavailable_as_transient():
            async with self._pool.acquire() as conn, conn.transaction():
                claimed = await conn.fetch(_CLAIM, now, limit)
                if not claimed:
                    return FireResult(0, [], 0)
                rows = [(_row(r), _sent(r)) for r in claimed]
                plans = await self._plans(conn, rows, now)
                firings = [
                    firing_for(row.schedule, tick_key(row.schedule.id, tick), tick)
                    for row, p in plans
                    for tick in p.fire
                ]
                if firings:
                    # On another connection, committed before the send (see _CLAIM).
                    await self._pool.execute(
                        _RECORD_SENDS, [f.schedule_id for f in firings], [f.tick for f in firings]
                    )
                    await fire(firings)
                if after_fire is not None:
                    after_fire()  # the crash point between "starts durable" and the commit
                # The last firing of each schedule (firings are in tick order).
                last = {f.schedule_id: f for f in firings}
                await conn.execute(
                    _ADVANCE,
                    [row.schedule.id for row, _ in plans],
                    [p.next_fire_at for _, p in plans],
                    [p.fire[-1] if p.fire else None for _, p in plans],
                    [f.saga_id if (f := last.get(row.schedule.id)) else None for row, _ in plans],
                    [len(p.fire) for _, p in plans],
                    [p.skipped for _, p in plans],
                    clock(),
                )
        return FireResult(len(plans), firings, sum(p.skipped for _, p in plans))

    async def _plans(self, conn: Any, rows: _Claimed, now: datetime) -> _Planned:
        running = await self._running(conn, rows, now)
        plans: _Planned = []
        for row, sent in rows:
            s = row.schedule
            previous, _ = previous_saga(row, sent, now)
            plans.append(
                (
                    row,
                    plan(
                        s.spec,
                        row.next_fire_at,
                        now,
                        catchup=s.catchup,
                        catchup_max=s.catchup_max,
                        overlap=s.overlap,
                        previous_running=previous in running,
                        grace=self._grace,
                        sent=sent,
                    ),
                )
            )
        return plans

    async def trigger(self, schedule_id: str, now: datetime, fire: Fire) -> Firing:
        """Fires the schedule once now, outside its spec and whatever its state or
        overlap policy (an operator asked), under a saga id of its own."""
        with _unavailable_as_transient():
            async with self._pool.acquire() as conn, conn.transaction():
                # Locked: a claim firing this schedule finishes first (or waits for this),
                # so their updates of the counts do not overwrite each other.
                schedule = (await _locked(conn, schedule_id)).schedule
                fired = firing_for(schedule, trigger_key(schedule_id, now), now)
                await fire([fired])
                await conn.execute(
                    "UPDATE saga_schedules SET last_fired_at = $2, last_saga_id = $3, "
                    "fired_count = fired_count + 1, updated_at = $2 WHERE schedule_id = $1",
                    schedule_id,
                    now,
                    fired.saga_id,
                )
        return fired

    async def _running(self, conn: Any, rows: _Claimed, now: datetime) -> set[str]:
        """The previous sagas (``previous_saga``) of ``rows`` (overlap=skip ones) that
        have not ended."""
        wanted: dict[str, datetime | None] = {}
        for row, sent in rows:
            saga_id, fired_at = previous_saga(row, sent, now)
            if row.schedule.overlap is Overlap.SKIP and saga_id is not None:
                wanted[saga_id] = fired_at
        if not wanted:
            return set()
        found = await self._statuses(conn, list(wanted))
        return {i for i, at in wanted.items() if still_running(found.get(i), at, now)}

    async def _statuses(self, conn: Any, saga_ids: Sequence[str]) -> Mapping[str, str | None]:
        """The sagas' statuses (a saga not found: absent or None)."""
        status_of = self._status_of
        if status_of is None:
            rows = await conn.fetch(
                "SELECT saga_id, status FROM sagas WHERE saga_id = ANY($1::text[])", saga_ids
            )
            return {rec["saga_id"]: rec["status"] for rec in rows}
        gate = asyncio.Semaphore(_STATUS_READS)

        async def one(saga_id: str) -> str | None:
            async with gate:
                return await status_of(saga_id)

        found = await asyncio.gather(*(one(i) for i in saga_ids))
        return dict(zip(saga_ids, found, strict=True))
