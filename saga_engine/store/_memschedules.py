"""The schedule-store port in memory: the testing kit's, and the contract suite's second
adapter. It fails as the Postgres one does: a send that raises leaves the tick due,
ScheduleNotFound and ScheduleConflict where Postgres raises them, and a claim skips the
schedules another claim holds (SKIP LOCKED) while pause, resume, delete and trigger
wait for it (FOR UPDATE). A claim records the ticks it sends before sending them (as
Postgres commits them apart from the claim), so one that raises after its send (the
crash point) leaves them for the next claim to send again.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from saga_engine.core.planning._schedule import (
    Plan,
    Schedule,
    ScheduleState,
    plan,
    tick_key,
    trigger_key,
)
from saga_engine.kernel._errors import ScheduleConflict, ScheduleNotFound
from saga_engine.store._schedule_store import (
    Fire,
    FireResult,
    Firing,
    SagaStatusOf,
    ScheduleRow,
    firing_for,
    previous_saga,
    still_running,
)

__all__ = ["InMemoryScheduleStore"]


async def _no_sagas(saga_id: str) -> None:
    return None


class InMemoryScheduleStore:
    def __init__(self, status_of: SagaStatusOf = _no_sagas, *, grace_s: float = 60.0) -> None:
        self._rows: dict[str, ScheduleRow] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        #: saga_schedule_sends: the ticks a claim sent and did not record (yet).
        self._sent: dict[str, list[datetime]] = {}
        self._status_of = status_of
        self._grace = timedelta(seconds=grace_s)

    def _lock(self, schedule_id: str) -> asyncio.Lock:
        return self._locks.setdefault(schedule_id, asyncio.Lock())

    async def close(self) -> None:
        return None

    async def upsert(self, schedule: Schedule, now: datetime, *, origin: str) -> str:
        async with self._lock(schedule.id):
            row = self._rows.get(schedule.id)
            if row is None:
                self._rows[schedule.id] = ScheduleRow(
                    schedule=schedule,
                    state=ScheduleState.ACTIVE,
                    origin=origin,
                    next_fire_at=schedule.spec.next_after(now),
                    last_fired_at=None,
                    last_tick=None,
                    last_saga_id=None,
                    fired_count=0,
                    skipped_count=0,
                    created_at=now,
                    updated_at=now,
                )
                return "created"
            if row.schedule.definition() == schedule.definition() and row.origin == origin:
                return "unchanged"
            if origin == "api" or row.origin != origin:
                raise ScheduleConflict(
                    f"schedule {schedule.id!r} exists ({row.origin}) with another "
                    "definition: delete it first, or use another id"
                )
            self._rows[schedule.id] = dataclasses.replace(
                row, schedule=schedule, next_fire_at=schedule.spec.next_after(now), updated_at=now
            )
            self._sent.pop(schedule.id, None)
            return "updated"

    async def get(self, schedule_id: str) -> ScheduleRow:
        try:
            return self._rows[schedule_id]
        except KeyError:
            raise ScheduleNotFound(schedule_id) from None

    async def list(self, *, limit: int = 100, after: str = "") -> list[ScheduleRow]:
        return [self._rows[k] for k in sorted(self._rows) if k > after][:limit]

    async def set_state(self, schedule_id: str, state: ScheduleState, now: datetime) -> ScheduleRow:
        async with self._lock(schedule_id):
            row = await self.get(schedule_id)
            self._rows[schedule_id] = row.moved_to(state, now)
            return self._rows[schedule_id]

    async def delete(self, schedule_id: str) -> None:
        async with self._lock(schedule_id):
            await self.get(schedule_id)
            del self._rows[schedule_id]
            self._sent.pop(schedule_id, None)
        self._locks.pop(schedule_id, None)

    async def earliest_due(self) -> datetime | None:
        active = [r.next_fire_at for r in self._rows.values() if r.state is ScheduleState.ACTIVE]
        return min(active, default=None)

    async def fire_due(
        self,
        now: datetime,
        limit: int,
        fire: Fire,
        *,
        clock: Callable[[], datetime],
        after_fire: Callable[[], None] | None = None,
    ) -> FireResult:
        due = sorted(
            (
                r
                for r in self._rows.values()
                if r.state is ScheduleState.ACTIVE
                and r.next_fire_at <= now
                and not self._lock(r.schedule.id).locked()
            ),
            key=lambda r: r.next_fire_at,
        )[:limit]
        locks = [self._lock(r.schedule.id) for r in due]
        for lock in locks:  # SKIP LOCKED: only free ones were taken, nothing waits here
            await lock.acquire()
        try:
            plans = [(row, await self._plan(row, now)) for row in due]
            firings = [
                firing_for(row.schedule, tick_key(row.schedule.id, t), t)
                for row, p in plans
                for t in p.fire
            ]
            if firings:
                for f in firings:  # recorded before the send, as Postgres commits them
                    sent = self._sent.setdefault(f.schedule_id, [])
                    sent[:] = sorted({*sent, f.tick})
                await fire(firings)
            if after_fire is not None:
                after_fire()
            self._advance(plans, clock())
        finally:
            for lock in locks:
                lock.release()
        return FireResult(len(due), firings, sum(p.skipped for _, p in plans))

    async def _plan(self, row: ScheduleRow, now: datetime) -> Plan:
        s = row.schedule
        sent = self._sent.get(s.id, [])
        saga_id, fired_at = previous_saga(row, sent, now)
        status = await self._status_of(saga_id) if saga_id else None
        return plan(
            s.spec,
            row.next_fire_at,
            now,
            catchup=s.catchup,
            catchup_max=s.catchup_max,
            overlap=s.overlap,
            grace=self._grace,
            sent=sent,
            previous_running=saga_id is not None and still_running(status, fired_at, now),
        )

    def _advance(self, plans: Sequence[tuple[ScheduleRow, Plan]], durable_at: datetime) -> None:
        """The claim's commit: the rows move on, and their sent ticks are recorded."""
        for row, p in plans:
            self._sent.pop(row.schedule.id, None)
            if row.schedule.id not in self._rows:
                continue
            last = p.fire[-1] if p.fire else None
            self._rows[row.schedule.id] = dataclasses.replace(
                self._rows[row.schedule.id],
                next_fire_at=p.next_fire_at,
                last_fired_at=durable_at if last else row.last_fired_at,
                last_tick=last or row.last_tick,
                last_saga_id=(
                    firing_for(row.schedule, tick_key(row.schedule.id, last), last).saga_id
                    if last
                    else row.last_saga_id
                ),
                fired_count=row.fired_count + len(p.fire),
                skipped_count=row.skipped_count + p.skipped,
                updated_at=durable_at,
            )

    async def trigger(self, schedule_id: str, now: datetime, fire: Fire) -> Firing:
        async with self._lock(schedule_id):
            row = await self.get(schedule_id)
            fired = firing_for(row.schedule, trigger_key(schedule_id, now), now)
            await fire([fired])
            self._rows[schedule_id] = dataclasses.replace(
                row,
                last_fired_at=now,
                last_saga_id=fired.saga_id,
                fired_count=row.fired_count + 1,
                updated_at=now,
            )
            return fired
