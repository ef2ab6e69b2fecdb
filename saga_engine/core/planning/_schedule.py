"""Durable schedules, the pure part: what a schedule is, when it ticks, and which ticks
a due schedule fires now. No I/O and no clock: every function takes ``now``.

A schedule starts one saga type with one input on a cron expression (``croniter``,
evaluated in the schedule's time zone, so ``0 3 * * *`` in ``Europe/Paris`` follows
daylight saving) or on a fixed interval (ticks at ``epoch + offset + k * every``, in
UTC: an interval has no wall clock to follow).

The store keeps ``next_fire_at``, the first tick not yet handled. When the scheduler
claims a due schedule, :func:`plan` says which of the ticks since then to fire under
the catch-up policy and the overlap policy, how many are skipped, and the next tick
after ``now``. Each fired tick's saga id is :func:`tick_saga_id`: the same tick always
gives the same id, so a tick fired twice (a crash after the start was sent, before
``next_fire_at`` moved) starts one saga.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from functools import cached_property
from typing import Any, Self
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, croniter
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from saga_engine.core.authoring._definition import Saga, SagaDefinition
from saga_engine.core.history._decision import saga_id_for
from saga_engine.kernel._errors import InvalidTransition

__all__ = [
    "MAX_CATCHUP",
    "CatchUp",
    "Overlap",
    "Plan",
    "Schedule",
    "ScheduleSpec",
    "ScheduleState",
    "first_fire_at",
    "plan",
    "tick_key",
    "tick_saga_id",
    "to_resend",
    "trigger_key",
]

#: The most ticks ``catchup="all"`` fires for one schedule after a downtime.
MAX_CATCHUP = 1000
#: A cron schedule's missed ticks are enumerated to be counted: past this many beyond
#: those fired, a claim stops counting (``skipped_count`` then undercounts a very long
#: downtime), so that 10,000 schedules back from a week away are claimed in seconds.
_COUNT_LIMIT = 1_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class CatchUp(StrEnum):
    """What a schedule fires for the ticks it missed (the engines were down, or busy
    for longer than the grace period).

    ``skip``: nothing missed; only a tick due within the grace period fires.
    ``last``: the most recent due tick, whether on time or missed; the older ones are
    skipped. ``all``: every due tick, oldest first, up to ``catchup_max`` (the most
    recent ones); the older ones are skipped.
    """

    SKIP = "skip"
    LAST = "last"
    ALL = "all"


class Overlap(StrEnum):
    """What a tick does while the saga of the schedule's previous tick still runs.

    ``skip``: nothing (the tick is counted as skipped); so at most one tick fires per
    claim, the most recent one chosen. ``allow``: it fires anyway.
    """

    SKIP = "skip"
    ALLOW = "allow"


class ScheduleState(StrEnum):
    """A schedule fires while active. Deleting one removes its row."""

    ACTIVE = "active"
    PAUSED = "paused"

    def to(self, new: ScheduleState) -> ScheduleState:
        """The state after an operator's pause or resume; refuses a no-op, so that the
        caller learns the schedule was already so."""
        if new is self:
            raise InvalidTransition(f"the schedule is already {self.value}")
        return new


class ScheduleSpec(BaseModel):
    """When a schedule ticks: ``cron`` in ``timezone``, or ``every_s`` (+ ``offset_s``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cron: str | None = Field(
        default=None,
        max_length=200,
        description="A cron expression (5 fields; a 6th is seconds), in `timezone`.",
    )
    every_s: float | None = Field(
        default=None, ge=1, le=366 * 86400, description="A fixed interval, in seconds."
    )
    offset_s: float = Field(
        default=0,
        ge=0,
        description="With `every_s`: ticks fall at offset_s + k * every_s after the Unix epoch.",
    )
    timezone: str = Field(default="UTC", max_length=64, description="An IANA time zone name.")

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if not croniter.is_valid(value):
            raise ValueError(
                f"{value!r} is not a cron expression: use 5 fields (minute hour day-of-month "
                "month day-of-week), for example '*/5 * * * *'"
            )
        try:
            # Well-formed is not enough: one no date matches would fail at every tick.
            croniter(value, _EPOCH).get_next(datetime)
        except CroniterBadDateError:
            raise ValueError(
                f"{value!r} never fires: no date matches it (e.g. the 31st of February)"
            ) from None
        return value

    @field_validator("timezone")
    @classmethod
    def _valid_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"{value!r} is not an IANA time zone (e.g. 'Europe/Paris')") from None
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> Self:
        if (self.cron is None) == (self.every_s is None):
            raise ValueError("give exactly one of `cron` and `every_s`")
        if self.every_s is not None and self.offset_s >= self.every_s:
            raise ValueError("`offset_s` must be less than `every_s`")
        if self.cron is not None and self.offset_s:
            raise ValueError("`offset_s` goes with `every_s`, not with `cron`")
        return self

    def describe(self) -> str:
        if self.cron is not None:
            return f"cron {self.cron} ({self.timezone})"
        offset = f" +{self.offset_s:g}s" if self.offset_s else ""
        return f"every {self.every_s:g}s{offset}"

    def next_after(self, t: datetime) -> datetime:
        """The first tick strictly after ``t`` (UTC)."""
        if self.every_s is not None:
            every, offset = self.every_s, self.offset_s
            k = math.floor(((t - _EPOCH).total_seconds() - offset) / every) + 1
            tick = _EPOCH + timedelta(seconds=offset + k * every)
            # Float rounding may land on t itself: a tick must be strictly after it.
            return tick if tick > t else tick + timedelta(seconds=every)
        zone = ZoneInfo(self.timezone)
        assert self.cron is not None
        nxt = croniter(self.cron, t.astimezone(zone)).get_next(datetime)
        return nxt.astimezone(UTC)

    def last_at_or_before(self, t: datetime) -> datetime:
        """The latest tick at or before ``t`` (UTC)."""
        if self.every_s is not None:
            every, offset = self.every_s, self.offset_s
            k = math.floor(((t - _EPOCH).total_seconds() - offset) / every)
            tick = _EPOCH + timedelta(seconds=offset + k * every)
            return tick if tick <= t else tick - timedelta(seconds=every)
        # croniter's get_prev is strictly before its start: start just after t.
        zone = ZoneInfo(self.timezone)
        assert self.cron is not None
        start = (t + timedelta(microseconds=1)).astimezone(zone)
        return croniter(self.cron, start).get_prev(datetime).astimezone(UTC)

    def ticks_between(
        self, first: datetime, last: datetime, limit: int
    ) -> tuple[list[datetime], int]:
        """The most recent ``limit`` ticks in ``[first, last]`` (oldest first), and how
        many ticks that interval holds (counted up to a bound for cron)."""
        if last < first:
            return [], 0
        if self.every_s is not None:
            newest = self.last_at_or_before(last)
            oldest = self.next_after(first - timedelta(microseconds=1))
            if newest < oldest:
                return [], 0
            total = round((newest - oldest).total_seconds() / self.every_s) + 1
            n = min(limit, total)
            ticks = [newest - timedelta(seconds=self.every_s * i) for i in range(n)]
            return ticks[::-1], total
        picked: list[datetime] = []
        tick = self.last_at_or_before(last)
        while tick >= first and len(picked) < limit:
            picked.append(tick)
            tick = self.last_at_or_before(tick - timedelta(microseconds=1))
        total = len(picked)
        if tick >= first:  # more than ``limit``: count the rest, up to a bound
            while tick >= first and total < limit + _COUNT_LIMIT:
                total += 1
                tick = self.last_at_or_before(tick - timedelta(microseconds=1))
        return picked[::-1], total


class Schedule(BaseModel):
    """A schedule, as declared in code (``SagaWorker(..., schedules=[...])``) or sent to
    the admin API (``POST /schedules``).

    ``saga`` is the saga type's name (a ``Saga`` class is accepted in code). The input is
    checked against the saga's input model when the schedule is created.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1, max_length=120, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")
    saga: str = Field(min_length=1, max_length=200)
    cron: str | None = None
    every_s: float | None = None
    offset_s: float = 0
    timezone: str = "UTC"
    input: dict[str, Any] = Field(default_factory=dict)
    catchup: CatchUp = CatchUp.LAST
    catchup_max: int = Field(default=10, ge=1, le=MAX_CATCHUP)
    overlap: Overlap = Overlap.SKIP

    @field_validator("saga", mode="before")
    @classmethod
    def _saga_name(cls, value: Any) -> Any:
        # A Saga class is accepted in code: its registered name is what is stored.
        if isinstance(value, type) and issubclass(value, Saga):
            return SagaDefinition.of(value).name
        return value

    @model_validator(mode="after")
    def _valid_spec(self) -> Self:
        self.spec  # noqa: B018 - raises ValidationError's ValueError on a bad spec
        return self

    @cached_property
    def spec(self) -> ScheduleSpec:
        return ScheduleSpec(
            cron=self.cron, every_s=self.every_s, offset_s=self.offset_s, timezone=self.timezone
        )

    def definition(self) -> dict[str, Any]:
        """What makes two declarations the same schedule (compared at an upsert)."""
        return self.model_dump(mode="json")


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do with one claimed schedule now."""

    #: The ticks to fire, oldest first.
    fire: list[datetime]
    #: Due ticks not fired (missed under the catch-up policy, or overlapping).
    skipped: int
    #: The first tick after ``now``.
    next_fire_at: datetime


def plan(
    spec: ScheduleSpec,
    next_fire_at: datetime,
    now: datetime,
    *,
    catchup: CatchUp,
    catchup_max: int,
    overlap: Overlap,
    previous_running: bool,
    grace: timedelta,
    sent: Sequence[datetime] = (),
) -> Plan:
    """Which of the ticks due since ``next_fire_at`` (inclusive) up to ``now`` to fire.

    A tick is on time while ``now - tick <= grace``; only the most recent due tick can
    be. ``sent``: ticks whose starts a claim that never committed may have sent (oldest
    first, none before ``next_fire_at``). Their sagas may run, so they fire again (under
    the same saga ids, which the engine deduplicates) and count as fired; the policies
    then apply to the ticks after them. ``previous_running``: the saga of the newest of
    ``sent``, or else of the schedule's last fired tick, has not ended.
    """
    resent = to_resend(sent, next_fire_at)
    if next_fire_at > now and not resent:
        return Plan([], 0, next_fire_at)
    # The ticks the sent ones stand for (counted, and not planned again).
    if resent:
        _, handled = spec.ticks_between(next_fire_at, resent[-1], 0)
        first = spec.next_after(resent[-1])
    else:
        handled, first = 0, next_fire_at
    keep = catchup_max if catchup is CatchUp.ALL else 1
    ticks, total = spec.ticks_between(first, now, keep)
    chosen = _choose(ticks, now, catchup=catchup, overlap=overlap, grace=grace)
    if overlap is Overlap.SKIP and previous_running:
        chosen = []
    fired = resent + chosen
    # max(): a sent tick may be after this engine's now (another engine's clock was ahead).
    nxt = spec.next_after(max(now, resent[-1])) if resent else spec.next_after(now)
    return Plan(fired, max(0, handled + total - len(fired)), nxt)


def to_resend(sent: Sequence[datetime], next_fire_at: datetime) -> list[datetime]:
    """The ticks of ``sent`` (oldest first) that fire again: not those before
    ``next_fire_at``, which a resume moved past (a paused schedule's ticks do not run)."""
    return [t for t in sent if t >= next_fire_at]


def _choose(
    ticks: list[datetime], now: datetime, *, catchup: CatchUp, overlap: Overlap, grace: timedelta
) -> list[datetime]:
    """The due ``ticks`` (the most recent ones, oldest first) the catch-up policy fires."""
    if not ticks or (catchup is CatchUp.SKIP and now - ticks[-1] > grace):
        return []
    chosen = ticks if catchup is CatchUp.ALL else ticks[-1:]
    # overlap=skip: the chosen ticks would overlap each other too, so at most one fires.
    return chosen[-1:] if overlap is Overlap.SKIP else chosen


def tick_key(schedule_id: str, tick: datetime) -> str:
    """The idempotency key of a tick's start; its saga id is derived from it."""
    return f"schedule:{schedule_id}:{tick.astimezone(UTC).isoformat(timespec='milliseconds')}"


def trigger_key(schedule_id: str, at: datetime) -> str:
    """The idempotency key of an operator's trigger-now, apart from every tick's."""
    return f"schedule:{schedule_id}:trigger:{at.astimezone(UTC).isoformat(timespec='milliseconds')}"


def tick_saga_id(saga_type: str, schedule_id: str, tick: datetime) -> str:
    return saga_id_for(saga_type, tick_key(schedule_id, tick))


def first_fire_at(spec: ScheduleSpec, now: datetime) -> datetime:
    """A new (or resumed) schedule's first tick: the next one after ``now``."""
    return spec.next_after(now)
