"""Durable schedules, the pure part: specs, ticks, and which ticks a claim fires."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from saga_engine.core.planning._schedule import (
    CatchUp,
    Overlap,
    Plan,
    Schedule,
    ScheduleSpec,
    ScheduleState,
    plan,
    tick_key,
    tick_saga_id,
    trigger_key,
)
from saga_engine.kernel._errors import InvalidTransition, PermanentError

T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
GRACE = timedelta(seconds=60)
MINUTE = ScheduleSpec(every_s=60)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("fields", "where", "says"),
    [
        ({"cron": "61 * * * *"}, "cron", "is not a cron expression"),
        ({"cron": "every day"}, "cron", "is not a cron expression"),
        ({}, "", "exactly one of `cron` and `every_s`"),
        ({"cron": "* * * * *", "every_s": 60}, "", "exactly one"),
        ({"every_s": 0.5}, "every_s", "greater than or equal to 1"),
        ({"every_s": 60, "timezone": "Mars/Olympus"}, "timezone", "not an IANA time zone"),
        ({"every_s": 60, "offset_s": 60}, "", "less than `every_s`"),
        ({"cron": "* * * * *", "offset_s": 5}, "", "goes with `every_s`"),
    ],
)
def test_a_bad_spec_is_refused_naming_the_field(
    fields: dict[str, object], where: str, says: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        Schedule(id="s", saga="x", **fields)
    [error] = caught.value.errors()
    assert ".".join(str(p) for p in error["loc"]) == where
    assert says in error["msg"]


def test_a_schedule_takes_a_saga_class_by_its_name() -> None:
    from tests.sagas import PlaceOrder as OrderSaga

    schedule = Schedule(id="s", saga=OrderSaga, every_s=60)
    assert schedule.saga == OrderSaga.name
    assert schedule.definition()["saga"] == OrderSaga.name


def test_interval_ticks_fall_on_offset_plus_multiples_of_the_interval() -> None:
    spec = ScheduleSpec(every_s=60, offset_s=15)
    assert spec.next_after(at(0)) == at(15)
    assert spec.next_after(at(15)) == at(75)  # strictly after
    assert spec.last_at_or_before(at(15)) == at(15)
    assert spec.last_at_or_before(at(14.9)) == at(-45)


def test_cron_ticks_follow_the_time_zone_across_daylight_saving() -> None:
    spec = ScheduleSpec(cron="30 2 * * *", timezone="Europe/Paris")
    # 2026-03-29: Paris skips 02:00-03:00 (CET -> CEST).
    before = datetime(2026, 3, 28, 12, 0, tzinfo=UTC)
    first = spec.next_after(before)
    assert first == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)  # 03:00 CEST, the gap's end
    second = spec.next_after(first)
    assert second == datetime(2026, 3, 30, 0, 30, tzinfo=UTC)  # 02:30 CEST
    assert spec.last_at_or_before(second) == second
    utc = ScheduleSpec(cron="*/5 * * * *")
    assert utc.next_after(at(0)) == at(300)
    assert utc.last_at_or_before(at(299)) == at(0)


def test_a_tick_due_on_time_fires_once_and_the_schedule_moves_on() -> None:
    p = plan(
        MINUTE,
        at(60),
        at(60.4),
        catchup=CatchUp.SKIP,
        catchup_max=10,
        overlap=Overlap.ALLOW,
        previous_running=False,
        grace=GRACE,
    )
    assert p.fire == [at(60)]
    assert p.skipped == 0
    assert p.next_fire_at == at(120)


def test_nothing_fires_before_next_fire_at() -> None:
    p = plan(
        MINUTE,
        at(60),
        at(59),
        catchup=CatchUp.ALL,
        catchup_max=10,
        overlap=Overlap.ALLOW,
        previous_running=False,
        grace=GRACE,
    )
    assert p.fire == []
    assert p.next_fire_at == at(60)


@pytest.mark.parametrize(
    ("catchup", "cap", "fired", "skipped"),
    [
        # Down from 00:01 to 10:30: ticks at 1..10 minutes are due, the last 30 s late.
        (CatchUp.SKIP, 10, [], 10),
        (CatchUp.LAST, 10, [600], 9),
        (CatchUp.ALL, 10, [60 * i for i in range(1, 11)], 0),
        (CatchUp.ALL, 3, [480, 540, 600], 7),
    ],
)
def test_catch_up_after_downtime(
    catchup: CatchUp, cap: int, fired: list[int], skipped: int
) -> None:
    p = plan(
        MINUTE,
        at(60),
        at(630),
        catchup=catchup,
        catchup_max=cap,
        overlap=Overlap.ALLOW,
        previous_running=False,
        grace=timedelta(seconds=20),
    )
    assert p.fire == [at(s) for s in fired]
    assert p.skipped == skipped
    assert p.next_fire_at == at(660)


@pytest.mark.parametrize(
    ("catchup", "overlap", "running", "sent", "fired", "skipped"),
    [
        # A dead claim sent 1:00; the engines are back at 3:30 (grace 20 s).
        (CatchUp.LAST, Overlap.SKIP, True, [60], [60], 2),
        (CatchUp.LAST, Overlap.SKIP, False, [60], [60, 180], 1),
        (CatchUp.LAST, Overlap.ALLOW, True, [60], [60, 180], 1),
        (CatchUp.SKIP, Overlap.ALLOW, False, [60], [60], 2),
        (CatchUp.ALL, Overlap.ALLOW, False, [60, 120], [60, 120, 180], 0),
        # A resume moved next_fire_at past the sent tick: it does not fire again.
        (CatchUp.LAST, Overlap.SKIP, False, [0], [180], 2),
    ],
)
def test_ticks_a_dead_claim_sent_fire_again_and_count_as_fired(
    catchup: CatchUp,
    overlap: Overlap,
    running: bool,
    sent: list[int],
    fired: list[int],
    skipped: int,
) -> None:
    p = plan(
        MINUTE,
        at(60),
        at(210),
        catchup=catchup,
        catchup_max=10,
        overlap=overlap,
        previous_running=running,
        grace=timedelta(seconds=20),
        sent=[at(s) for s in sent],
    )
    assert p.fire == [at(s) for s in fired]
    assert p.skipped == skipped
    assert p.next_fire_at == at(240)


def test_catch_up_skip_still_fires_the_latest_tick_within_the_grace_period() -> None:
    p = plan(
        MINUTE,
        at(60),
        at(610),
        catchup=CatchUp.SKIP,
        catchup_max=10,
        overlap=Overlap.ALLOW,
        previous_running=False,
        grace=timedelta(seconds=20),
    )
    assert p.fire == [at(600)]
    assert p.skipped == 9


def test_overlap_skip_fires_nothing_while_the_previous_run_runs() -> None:
    def run(overlap: Overlap, running: bool) -> Plan:
        return plan(
            MINUTE,
            at(60),
            at(200),
            catchup=CatchUp.ALL,
            catchup_max=10,
            overlap=overlap,
            previous_running=running,
            grace=GRACE,
        )

    busy = run(Overlap.SKIP, True)
    assert busy.fire == []
    assert busy.skipped == 3
    assert busy.next_fire_at == at(240)
    # Not running: one tick, the latest (the others would overlap it).
    idle = run(Overlap.SKIP, False)
    assert idle.fire == [at(180)]
    assert idle.skipped == 2
    assert run(Overlap.ALLOW, True).fire == [at(60), at(120), at(180)]


def test_a_cron_catch_up_counts_every_missed_tick() -> None:
    spec = ScheduleSpec(cron="* * * * *")
    p = plan(
        spec,
        at(60),
        at(60 * 500 + 5),
        catchup=CatchUp.ALL,
        catchup_max=4,
        overlap=Overlap.ALLOW,
        previous_running=False,
        grace=GRACE,
    )
    assert p.fire == [at(60 * i) for i in range(497, 501)]
    assert p.skipped == 496


def test_tick_ids_are_deterministic_and_apart_from_triggers() -> None:
    assert tick_saga_id("order", "s", at(60)) == tick_saga_id("order", "s", at(60))
    assert tick_saga_id("order", "s", at(60)) != tick_saga_id("order", "s", at(120))
    assert tick_saga_id("order", "s", at(60)) != tick_saga_id("order", "t", at(60))
    assert tick_key("s", at(60)) != trigger_key("s", at(60))
    assert tick_key("s", at(60)) == "schedule:s:2026-12-03T12:01:00.000+00:00"


def test_state_transitions_refuse_a_no_op() -> None:
    assert ScheduleState.ACTIVE.to(ScheduleState.PAUSED) is ScheduleState.PAUSED
    assert ScheduleState.PAUSED.to(ScheduleState.ACTIVE) is ScheduleState.ACTIVE
    with pytest.raises(InvalidTransition, match="already paused"):
        ScheduleState.PAUSED.to(ScheduleState.PAUSED)


@settings(max_examples=300, deadline=None)
@given(
    every=st.integers(1, 3600),
    offset_frac=st.floats(0, 0.999),
    start=st.floats(-1e6, 1e6),
    steps=st.lists(st.floats(0.001, 5000), min_size=1, max_size=30),
)
def test_a_scheduler_polling_at_any_times_fires_every_tick_exactly_once(
    every: int, offset_frac: float, start: float, steps: list[float]
) -> None:
    """With catch-up ``all`` (cap large enough) and overlap allowed, claiming at any
    sequence of times fires each tick up to the last claim once, in order, none twice."""
    spec = ScheduleSpec(every_s=every, offset_s=round(offset_frac * every, 3))
    now = at(start)
    nxt = spec.next_after(now)
    first = nxt
    fired: list[datetime] = []
    for step in steps:
        now += timedelta(seconds=step)
        p = plan(
            spec,
            nxt,
            now,
            catchup=CatchUp.ALL,
            catchup_max=1000,
            overlap=Overlap.ALLOW,
            previous_running=False,
            grace=GRACE,
        )
        assert p.next_fire_at > now
        assert p.next_fire_at - now <= timedelta(seconds=every)
        if len(p.fire) + p.skipped:
            assert p.fire == sorted(p.fire)
            assert all(nxt <= t <= now for t in p.fire)
        fired_now = p.fire
        if p.skipped:  # only past the cap: the most recent ticks were kept
            assert len(fired_now) == 1000
        fired.extend(fired_now)
        nxt = p.next_fire_at
    assert len(set(fired)) == len(fired)
    if fired and len(fired) < 1000:
        expected = [first + timedelta(seconds=every * i) for i in range(len(fired))]
        assert [t.timestamp() for t in fired] == pytest.approx([t.timestamp() for t in expected])
        assert spec.next_after(fired[-1]) <= nxt


@settings(max_examples=200, deadline=None)
@given(
    catchup=st.sampled_from(list(CatchUp)),
    overlap=st.sampled_from(list(Overlap)),
    running=st.booleans(),
    cap=st.integers(1, 20),
    behind=st.floats(0, 3000),
)
def test_fired_plus_skipped_is_every_due_tick(
    catchup: CatchUp, overlap: Overlap, running: bool, cap: int, behind: float
) -> None:
    now = at(10_000)
    nxt = MINUTE.next_after(now - timedelta(seconds=behind) - timedelta(microseconds=1))
    due = [t for t in (nxt + timedelta(seconds=60 * i) for i in range(200)) if t <= now]
    p = plan(
        MINUTE,
        nxt,
        now,
        catchup=catchup,
        catchup_max=cap,
        overlap=overlap,
        previous_running=running,
        grace=GRACE,
    )
    assert len(p.fire) + p.skipped == len(due)
    assert set(p.fire) <= set(due)
    assert len(p.fire) <= (cap if catchup is CatchUp.ALL else 1)
    if overlap is Overlap.SKIP:
        assert len(p.fire) <= (0 if running else 1)
    if due and catchup is not CatchUp.SKIP and not (overlap is Overlap.SKIP and running):
        assert p.fire[-1] == due[-1]  # the most recent tick is never dropped


def test_the_fast_start_envelope_is_what_the_validated_one_would_be() -> None:
    from saga_engine.store._schedule_store import firing_for
    from saga_engine.transport._wire import Envelope, StartBody, decode, encode
    from saga_engine.worker._schedules import KafkaStarts, start_body

    schedule = Schedule(id="s", saga="report", every_s=60, input={"region": "eu", "n": [1, 2]})
    f = firing_for(schedule, tick_key("s", at(60)), at(60))
    validated = StartBody(input=f.input, idempotency_key=f.idempotency_key)
    # The fast body leaves out the optional fields a schedule never sets (their defaults).
    assert StartBody.model_validate(start_body(f)) == validated
    assert start_body(f) == validated.model_dump(mode="json", include=set(start_body(f)))
    fast = KafkaStarts(None, "inbox", "/test")._envelope(f)
    assert fast == Envelope.model_validate(fast.model_dump())
    key, value, headers = encode(fast)
    read = decode(key, value, headers, max_bytes=1 << 20)
    assert read.saga_id == tick_saga_id("report", "s", at(60))
    assert read.body_as(StartBody) == StartBody(input=f.input, idempotency_key=f.idempotency_key)


@pytest.mark.parametrize(
    ("schedule", "error", "says"),
    [
        (Schedule(id="s", saga="nope", every_s=60), "UnknownSagaType", "no saga named 'nope'"),
        (
            Schedule(id="s", saga="place-order", every_s=60, input={"total": "lots"}),
            "InvalidPayload",
            "input of saga 'place-order'",
        ),
    ],
)
async def test_a_worker_refuses_a_declared_schedule_it_cannot_start(
    schedule: Schedule, error: str, says: str
) -> None:
    """Refused before anything is opened or written: the worker's start fails with why."""
    from saga_engine import SagaRegistry, Settings
    from saga_engine.store._memstore import InMemoryEventStore
    from saga_engine.worker._schedules import WorkerSchedules
    from tests.sagas import PlaceOrder

    async def never(firings: object) -> None:
        raise AssertionError("nothing may be sent")

    registry = SagaRegistry([PlaceOrder])
    # A DSN nothing listens on: reaching it would fail differently.
    settings = Settings(pg={"dsn": "postgresql://nobody@127.0.0.1:1/none"})
    with pytest.raises(PermanentError, match=re.escape(says)) as caught:
        await WorkerSchedules.open(
            settings, registry, [schedule], never, None, InMemoryEventStore()
        )
    assert type(caught.value).__name__ == error


@settings(max_examples=200, deadline=None)
@given(
    cron=st.sampled_from(
        ["* * * * *", "*/7 * * * *", "30 2 * * *", "0 0 1 * *", "15 9 * * 1-5", "0 */6 * * *"]
    ),
    zone=st.sampled_from(["UTC", "Europe/Paris", "America/New_York", "Australia/Lord_Howe"]),
    t=st.datetimes(
        min_value=datetime(2020, 1, 1), max_value=datetime(2035, 1, 1), timezones=st.just(UTC)
    ),
)
def test_cron_ticks_are_consistent_in_any_zone(cron: str, zone: str, t: datetime) -> None:
    """next_after and last_at_or_before agree: no tick between t and the next one."""
    spec = ScheduleSpec(cron=cron, timezone=zone)
    nxt = spec.next_after(t)
    assert nxt > t
    assert nxt.tzinfo is not None
    assert spec.last_at_or_before(nxt) == nxt
    assert spec.last_at_or_before(nxt - timedelta(microseconds=1)) <= t
    assert spec.next_after(spec.last_at_or_before(t)) == nxt
