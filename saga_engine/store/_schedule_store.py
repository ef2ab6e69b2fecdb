"""The schedule-store port: what the scheduler, the admin API and the web page need from
wherever schedules are kept, and the records they exchange.

Two adapters: ``_pgschedules.PostgresScheduleStore`` (a worker's; migration 0007) and
``_memschedules.InMemoryScheduleStore`` (the testing kit's and unit tests'). One contract
suite (``tests/internal/contract/test_schedule_store.py``) runs against both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final, Protocol

from saga_engine.core.history._decision import saga_id_for
from saga_engine.core.history._status import SagaStatus
from saga_engine.core.planning._schedule import (
    CatchUp,
    Overlap,
    Schedule,
    ScheduleState,
    tick_saga_id,
    to_resend,
)
from saga_engine.kernel._errors import SagaNotFound, ShardUnavailable
from saga_engine.kernel._serde import JsonDict
from saga_engine.store._store import EventStore

__all__ = [
    "START_LANDS_WITHIN",
    "Fire",
    "FireResult",
    "Firing",
    "SagaStatusOf",
    "ScheduleRow",
    "ScheduleStore",
    "firing_for",
    "previous_saga",
    "saga_status_of",
    "still_running",
    "stored_schedule",
]

#: A start sent for a previous tick whose saga does not exist after this long was
#: refused by the engines (dead-lettered): it no longer counts as running.
START_LANDS_WITHIN: Final = timedelta(minutes=5)
#: The statuses in which a schedule's previous saga still runs (overlap=skip waits).
_RUNNING: Final = frozenset({SagaStatus.RUNNING.value, SagaStatus.COMPENSATING.value})


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    """A schedule as stored, with its progress."""

    schedule: Schedule
    state: ScheduleState
    origin: str
    next_fire_at: datetime
    last_fired_at: datetime | None
    last_tick: datetime | None
    last_saga_id: str | None
    fired_count: int
    skipped_count: int
    created_at: datetime
    updated_at: datetime

    def moved_to(self, state: ScheduleState, now: datetime) -> ScheduleRow:
        """The row paused or resumed at ``now`` (InvalidTransition for a move its state
        does not allow). A resumed schedule fires from its next tick after now: the ticks
        of the pause are not caught up (pausing says "do not run these")."""
        new = self.state.to(state)
        next_fire_at = (
            self.schedule.spec.next_after(now) if new is ScheduleState.ACTIVE else self.next_fire_at
        )
        return dataclasses.replace(self, state=new, next_fire_at=next_fire_at, updated_at=now)


@dataclass(frozen=True, slots=True)
class Firing:
    """One start request to send: a tick of a schedule (or an operator's trigger)."""

    schedule_id: str
    saga_type: str
    saga_id: str
    idempotency_key: str
    input: JsonDict
    tick: datetime


@dataclass(frozen=True, slots=True)
class FireResult:
    claimed: int
    fired: list[Firing]
    skipped: int


#: Sends the start requests and returns once every one is durable (raises if not).
Fire = Callable[[Sequence[Firing]], Awaitable[None]]


class ScheduleStore(Protocol):
    async def upsert(self, schedule: Schedule, now: datetime, *, origin: str) -> str: ...

    async def get(self, schedule_id: str) -> ScheduleRow: ...

    async def list(self, *, limit: int = 100, after: str = "") -> list[ScheduleRow]: ...

    async def set_state(
        self, schedule_id: str, state: ScheduleState, now: datetime
    ) -> ScheduleRow: ...

    async def delete(self, schedule_id: str) -> None: ...

    async def earliest_due(self) -> datetime | None: ...

    async def fire_due(
        self,
        now: datetime,
        limit: int,
        fire: Fire,
        *,
        clock: Callable[[], datetime],
        after_fire: Callable[[], None] | None = None,
    ) -> FireResult: ...

    async def trigger(self, schedule_id: str, now: datetime, fire: Fire) -> Firing: ...

    async def close(self) -> None: ...


def firing_for(schedule: Schedule, key: str, tick: datetime) -> Firing:
    return Firing(
        schedule_id=schedule.id,
        saga_type=schedule.saga,
        saga_id=saga_id_for(schedule.saga, key),
        idempotency_key=key,
        input=schedule.input,
        tick=tick,
    )


def previous_saga(
    row: ScheduleRow, sent: Sequence[datetime], now: datetime
) -> tuple[str | None, datetime | None]:
    """The saga overlap=skip waits on, and when its start was last sent.

    ``sent``: the ticks (oldest first) a claim that never committed may have sent (see
    ``plan``). Their sagas may run although no row names them: the newest one's saga is
    the tick's own deterministic id, and its start goes again now. Else it is the saga of
    the last fired tick the row recorded."""
    live = to_resend(sent, row.next_fire_at)
    if live:
        return tick_saga_id(row.schedule.saga, row.schedule.id, live[-1]), now
    return row.last_saga_id, row.last_fired_at


#: The status of a saga by id (None: no such saga), for the overlap policy: where a
#: schedule store that does not keep the sagas asks (the in-memory one; Postgres past one
#: database, its schedules in the control database and its sagas in the shards).
SagaStatusOf = Callable[[str], Awaitable[str | None]]


def saga_status_of(store: EventStore) -> SagaStatusOf:
    """``SagaStatusOf`` read from an event store. A saga whose shard does not answer is
    taken as running: ``overlap=skip`` skips its schedule's tick rather than risk two of
    its sagas at once (the next tick asks again)."""

    async def status_of(saga_id: str) -> str | None:
        try:
            return (await store.get(saga_id)).status.value
        except SagaNotFound:
            return None
        except ShardUnavailable:
            return SagaStatus.RUNNING.value

    return status_of


def still_running(status: str | None, fired_at: datetime | None, now: datetime) -> bool:
    """Whether a schedule's previous saga (``status`` None: no such saga yet) runs."""
    if status is not None:
        return status in _RUNNING
    # Its start is on its way through the inbox, unless it was refused long ago.
    return fired_at is not None and now - fired_at < START_LANDS_WITHIN


def stored_schedule(definition: JsonDict) -> Schedule:
    """A stored definition, validated when it was written: rebuilt without validating it
    again (a claim reads up to batch_size of them per transaction)."""
    fields = dict(definition)
    fields["catchup"] = CatchUp(fields.get("catchup", CatchUp.LAST))
    fields["overlap"] = Overlap(fields.get("overlap", Overlap.SKIP))
    return Schedule.model_construct(**fields)
