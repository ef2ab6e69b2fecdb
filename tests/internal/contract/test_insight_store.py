"""The insight aggregates (``InsightStore``), against every adapter (memory and
Postgres, with and without group commit and a payload codec): a run is counted once,
when its terminal event is stored, with its nodes, latencies, errors and overlaps, in
the rows of the flow policy it was started under."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Literal

from saga_engine.core.history._events import (
    CallbackAwaited,
    CallbackReceived,
    CommandIssued,
    CompensationIssued,
    Event,
    ReplyReceived,
    ReplyTimings,
    SagaCompensated,
    SagaCompleted,
    SagaStarted,
    SignalReceived,
    TimerFired,
    TimerStarted,
)
from saga_engine.core.history._status import SagaStatus
from saga_engine.core.history._structs import replace
from saga_engine.core.views._insight_report import build_report
from saga_engine.core.views._insights import Counters
from saga_engine.store._insight_store import InsightStore
from saga_engine.store._pgstore import PostgresEventStore
from saga_engine.store._store import Append, EventStore, NewSaga, Projection
from tests.internal.contract.test_event_store import Backend, backend, pg_store, store

__all__ = ["backend", "pg_store", "store"]  # the fixtures, shared with the event store's

T0 = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=30)


def _at(ms: int) -> datetime:
    return T0 + timedelta(milliseconds=ms)


def _cmd(ms: int, step: str, command_id: str, attempt: int = 1) -> CommandIssued:
    return CommandIssued(
        at=_at(ms),
        step=step,
        participant="svc",
        command_type=step,
        payload={"p": 1},
        payload_hash="h",
        command_id=command_id,
        attempt=attempt,
    )


def _reply(
    ms: int,
    step: str,
    command_id: str,
    outcome: Literal["success", "failure", "retryable"] = "success",
    error: str | None = None,
) -> ReplyReceived:
    return ReplyReceived(
        at=_at(ms),
        step=step,
        command_id=command_id,
        outcome=outcome,
        payload={"ok": True},
        error=error,
    )


def _happy(saga: str) -> list[Event]:
    """reserve (retried once: busy), then pay and ship in parallel, a sleep, a signal."""
    return [
        SagaStarted(at=_at(0), saga_type="trip", input={"who": saga}),
        _cmd(1, "reserve", f"{saga}-r1"),
        _reply(11, "reserve", f"{saga}-r1", "retryable", "busy"),
        _cmd(20, "reserve", f"{saga}-r2", 2),
        _reply(60, "reserve", f"{saga}-r2"),
        _cmd(61, "pay", f"{saga}-p"),
        _cmd(61, "ship", f"{saga}-s"),
        _reply(300, "pay", f"{saga}-p"),
        _reply(900, "ship", f"{saga}-s"),
        TimerStarted(at=_at(901), timer_id="sleep:1", purpose="sleep", fire_at=_at(2901)),
        TimerFired(at=_at(2901), timer_id="sleep:1"),
        SignalReceived(at=_at(4000), signal_id="g1", name="approve"),
        SagaCompleted(at=_at(4001), output={"done": True}),
    ]


def _refused(saga: str) -> list[Event]:
    return [
        SagaStarted(at=_at(0), saga_type="trip", input={"who": saga}),
        _cmd(1, "reserve", f"{saga}-r1"),
        _reply(41, "reserve", f"{saga}-r1", "failure", "no rooms"),
        CompensationIssued(
            at=_at(42),
            step="reserve",
            participant="svc",
            command_type="undo",
            payload={},
            payload_hash="h",
            command_id=f"{saga}-u",
            attempt=1,
        ),
        SagaCompensated(at=_at(50)),
    ]


async def _run(store: EventStore, saga: str, events: list[Event], status: SagaStatus) -> None:
    """Writes the history as an engine does: created, then appended in two steps."""
    await store.create(NewSaga(saga, "trip", events[:1], Projection(SagaStatus.RUNNING)))
    await store.append(Append(saga, 1, events[1:-1], Projection(SagaStatus.RUNNING)))
    await store.append(Append(saga, len(events) - 1, events[-1:], Projection(status)))


async def _report(store: EventStore, sla: timedelta | None = None) -> dict:  # type: ignore[type-arg]
    assert isinstance(store, InsightStore)
    since, until = T0 - timedelta(hours=1), T0 + timedelta(hours=1)
    rows = await store.insight_rows("trip", since, until)
    return build_report("trip", "1h", since, until, rows, sla)


async def test_a_run_counts_once_it_ends(store: EventStore) -> None:
    events = _happy("a")
    await store.create(NewSaga("a", "trip", events[:1], Projection(SagaStatus.RUNNING)))
    await store.append(Append("a", 1, events[1:-1], Projection(SagaStatus.RUNNING)))
    assert (await _report(store))["runs"] == 0  # still running: nothing counted yet
    await store.append(Append("a", len(events) - 1, events[-1:], Projection(SagaStatus.COMPLETED)))
    report = await _report(store)
    assert report["runs"] == 1
    assert report["outcomes"] == {"completed": 1}
    assert report["duration_ms"] == {"p50": 5000, "p95": 5000, "p99": 5000}


async def test_nodes_paths_errors_and_parallel_branches(store: EventStore) -> None:
    await _run(store, "a", _happy("a"), SagaStatus.COMPLETED)
    await _run(store, "b", _happy("b"), SagaStatus.COMPLETED)
    await _run(store, "c", _refused("c"), SagaStatus.COMPENSATED)
    report = await _report(store, sla=timedelta(seconds=1))
    assert report["runs"] == 3
    assert report["outcomes"] == {"compensated": 1, "completed": 2}
    nodes = {n["name"]: n for n in report["nodes"]}
    # The graph's order: by when the node starts in its runs.
    assert [n["name"] for n in report["nodes"]] == [
        "reserve",
        "pay",
        "ship",
        "sleep:1",
        "signal:approve",
    ]
    reserve = nodes["reserve"]
    assert (reserve["kind"], reserve["runs"], reserve["share"]) == ("step", 3, 1.0)
    assert (reserve["attempts"], reserve["successes"]) == (5, 2)
    assert reserve["attempts_per_success"] == 2.5
    assert reserve["refusal_rate"] == 0.2
    assert reserve["compensation_rate"] == round(1 / 3, 4)
    assert reserve["latency_ms"] == {"p50": 50, "p95": 50, "p99": 50}
    assert reserve["errors"] == [
        {"message": "busy", "count": 2},
        {"message": "no rooms", "count": 1},
    ]
    assert nodes["pay"]["share"] == round(2 / 3, 4)
    assert nodes["ship"]["latency_ms"]["p50"] == 1000
    assert (nodes["sleep:1"]["kind"], nodes["sleep:1"]["latency_ms"]["p50"]) == ("timer", 2000)
    assert nodes["signal:approve"]["kind"] == "signal"
    assert report["parallel"] == [{"nodes": ["pay", "ship"], "runs": 2, "share": round(2 / 3, 4)}]
    # Two runs took 4 s against an SLA of 1 s; the refused one took 50 ms.
    assert report["sla"] == {
        "seconds": 1.0,
        "within": 1,
        "breached": 2,
        "share_within": 0.3333,
        "breaching_runs": [],
    }
    breaches = await store.sla_breaches(  # type: ignore[attr-defined]
        "trip", T0 - timedelta(hours=1), T0 + timedelta(hours=1), timedelta(seconds=1)
    )
    assert sorted(breaches) == ["a", "b"]


async def test_a_window_reads_only_its_buckets(store: EventStore) -> None:
    await _run(store, "a", _happy("a"), SagaStatus.COMPLETED)
    assert isinstance(store, InsightStore)
    later = T0 + timedelta(hours=2)
    assert await store.insight_rows("trip", later, later + timedelta(hours=1)) == []
    assert await store.insight_rows("other", T0 - timedelta(hours=1), later) == []


async def test_a_roll_up_adds_each_ended_run_once(store: EventStore) -> None:
    assert isinstance(store, InsightStore)
    await _run(store, "a", _happy("a"), SagaStatus.COMPLETED)
    await _run(store, "b", _refused("b"), SagaStatus.COMPENSATED)
    events = _happy("c")
    await store.create(NewSaga("c", "trip", events[:1], Projection(SagaStatus.RUNNING)))
    # Two ended runs wait; the running one is not recorded. A limit takes part of them.
    assert await store.roll_up_insights(1) == 1
    assert await store.roll_up_insights() == 1
    assert await store.roll_up_insights() == 0
    report = await _report(store)
    assert report["outcomes"] == {"completed": 1, "compensated": 1}
    # Rolled up again (and read again), nothing is added twice.
    assert await store.roll_up_insights() == 0
    assert (await _report(store))["runs"] == 2


async def test_concurrent_roll_ups_take_disjoint_runs(pg_store: PostgresEventStore) -> None:
    for i in range(40):
        await _run(pg_store, f"r{i}", _happy(f"r{i}"), SagaStatus.COMPLETED)
    taken = await asyncio.gather(*(pg_store.roll_up_insights(7) for _ in range(8)))
    assert sum(taken) <= 40
    # Whatever the concurrent roll-ups left, the read adds; each run counted once.
    assert (await _report(pg_store))["outcomes"] == {"completed": 40}
    assert await pg_store.roll_up_insights() == 0


def _timed(saga: str, cpu: float | None) -> list[Event]:
    """One step whose reply carries the timing headers: sent 5 ms after its issue,
    received 2 ms later, handled from 8 to 18 ms, committed at 20, read at 25."""
    reply = _reply(25, "book", f"{saga}-b")
    timings = ReplyTimings(
        sent_at=_at(6),
        received_at=_at(8),
        handler_started_at=_at(10),
        handler_ended_at=_at(20),
        committed_at=_at(22),
        handler_cpu_ms=cpu,
    )
    return [
        SagaStarted(at=_at(0), saga_type="trip", input={"who": saga}),
        _cmd(1, "book", f"{saga}-b"),
        replace(reply, timings=timings),
        SagaCompleted(at=_at(30), output={}),
    ]


async def test_reply_timings_make_phases_and_a_learned_cost(
    store: EventStore, backend: Backend
) -> None:
    await _run(store, "a", _timed("a", 4.0), SagaStatus.COMPLETED)
    await _run(store, "b", _timed("b", 2.0), SagaStatus.COMPLETED)
    await _run(store, "c", _timed("c", None), SagaStatus.COMPLETED)  # the Go kit: no CPU
    await _run(store, "d", _happy("d"), SagaStatus.COMPLETED)  # no timings at all
    report = await _report(store)
    nodes = {n["name"]: n for n in report["nodes"]}
    timings = nodes["book"]["timings_ms"]
    # apply ends when the reply's event was stored: Postgres's recorded_at (here long
    # after these made-up times), which the in-memory store does not keep.
    apply = {"apply"} if "postgres" in backend.name else set()
    assert (
        set(timings)
        == {"held", "to_participant", "waiting", "handler", "commit", "back", "cpu"} | apply
    )
    figures = {
        phase: (t["samples"], t["mean_ms"]) for phase, t in timings.items() if phase != "apply"
    }
    assert figures == {
        "held": (3, 5.0),
        "to_participant": (3, 2.0),
        "waiting": (3, 2.0),
        "handler": (3, 10.0),
        "commit": (3, 2.0),
        "back": (3, 3.0),
        "cpu": (2, 3.0),
    }
    assert timings["handler"]["p50"] == 10
    assert nodes["book"]["learned_cost"] == {
        "samples": 3,
        "handler_ms": 10.0,
        "handler_p95_ms": 10,
        "cpu_ms": 3.0,
        "cpu_samples": 2,
    }
    # Steps whose replies had no timing headers: no learned cost, and no phase but the
    # engine's own, apply (where the store keeps when the reply's event was stored).
    assert set(nodes["reserve"]["timings_ms"]) == apply
    assert nodes["reserve"]["learned_cost"] is None
    assert isinstance(store, InsightStore)
    costs = await store.learned_costs("trip", T0 - timedelta(hours=1), T0 + timedelta(hours=1))
    assert list(costs) == ["book"]
    assert (costs["book"].handler_ms, costs["book"].cpu_ms, costs["book"].samples) == (10.0, 3.0, 3)
    assert (
        await store.learned_costs("other", T0 - timedelta(hours=1), T0 + timedelta(hours=1)) == {}
    )


# ------------------------------------------------------------------ flow policies


def _under(flow_policy: int | None, events: list[Event]) -> list[Event]:
    """The history with its start recorded under ``flow_policy`` (None: none recorded)."""
    return [replace(events[0], flow_policy=flow_policy), *events[1:]]


def _sorted(rows: list[tuple[str, str, str, Counters]]) -> list[tuple[str, str, str, Counters]]:
    return sorted(rows, key=lambda r: r[:3])


WINDOW = (T0 - timedelta(hours=1), T0 + timedelta(hours=1))


async def test_runs_are_split_by_their_flow_policy(store: EventStore) -> None:
    assert isinstance(store, InsightStore)
    await _run(store, "a", _happy("a"), SagaStatus.COMPLETED)  # no policy recorded: 1
    await _run(store, "b", _under(1, _happy("b")), SagaStatus.COMPLETED)
    policy_1 = _sorted(await store.insight_rows("trip", *WINDOW, flow_policy=1))
    await _run(store, "c", _under(2, _happy("c")), SagaStatus.COMPLETED)
    await _run(store, "d", _under(2, _refused("d")), SagaStatus.COMPENSATED)
    assert await store.insight_policies("trip", *WINDOW) == {1: 2, 2: 2}
    # Policy 2's runs changed none of policy 1's figures.
    assert _sorted(await store.insight_rows("trip", *WINDOW, flow_policy=1)) == policy_1
    since, until = WINDOW
    one = build_report("trip", "1h", since, until, policy_1)
    two = build_report(
        "trip", "1h", since, until, await store.insight_rows("trip", *WINDOW, flow_policy=2)
    )
    every = await _report(store)
    assert (one["runs"], one["outcomes"]) == (2, {"completed": 2})
    assert (two["runs"], two["outcomes"]) == (2, {"compensated": 1, "completed": 1})
    assert (every["runs"], every["outcomes"]) == (4, {"compensated": 1, "completed": 3})
    reserve = {v: {n["name"]: n for n in r["nodes"]}["reserve"] for v, r in ((1, one), (2, two))}
    assert (reserve[1]["attempts"], reserve[2]["attempts"]) == (4, 3)  # 2 + 2; 2 + 1
    assert (reserve[1]["refusal_rate"], reserve[2]["refusal_rate"]) == (0.0, round(1 / 3, 4))
    # Summed over every policy: each (facet, key, detail) once, the two policies added.
    assert len({r[:3] for r in await store.insight_rows("trip", *WINDOW)}) == len(
        await store.insight_rows("trip", *WINDOW)
    )
    # A policy no run was started under, another type, another window: nothing.
    assert await store.insight_rows("trip", *WINDOW, flow_policy=3) == []
    assert await store.insight_policies("other", *WINDOW) == {}
    later = T0 + timedelta(hours=2)
    assert await store.insight_policies("trip", later, later + timedelta(hours=1)) == {}


async def test_sla_breaches_of_one_flow_policy(store: EventStore) -> None:
    assert isinstance(store, InsightStore)
    await _run(store, "a", _happy("a"), SagaStatus.COMPLETED)
    await _run(store, "b", _under(2, _happy("b")), SagaStatus.COMPLETED)
    await _run(store, "c", _under(2, _refused("c")), SagaStatus.COMPENSATED)
    sla = timedelta(seconds=1)
    assert sorted(await store.sla_breaches("trip", *WINDOW, sla)) == ["a", "b"]
    assert await store.sla_breaches("trip", *WINDOW, sla, flow_policy=1) == ["a"]
    assert await store.sla_breaches("trip", *WINDOW, sla, flow_policy=2) == ["b"]
    assert await store.sla_breaches("trip", *WINDOW, sla, flow_policy=3) == []


async def test_learned_costs_are_over_every_flow_policy(store: EventStore) -> None:
    assert isinstance(store, InsightStore)
    await _run(store, "a", _timed("a", 4.0), SagaStatus.COMPLETED)
    await _run(store, "b", _under(2, _timed("b", 2.0)), SagaStatus.COMPLETED)
    costs = await store.learned_costs("trip", *WINDOW)
    assert (costs["book"].samples, costs["book"].cpu_ms) == (2, 3.0)


def _kyc(saga: str, answer: str) -> list[Event]:
    """A callback wait: answered after 5 s (or by its fail URL), or timed out at 10 s."""
    wait = "callback:kyc-verdict:1"
    awaited = CallbackAwaited(
        at=_at(1000),
        wait_id=wait,
        name="kyc-verdict",
        expires_at=_at(11_000),
        key_id="k",
        base_url="https://saga.example.com",
    )
    end: Event = (
        TimerFired(at=_at(11_000), timer_id=wait)
        if answer == "timed out"
        else CallbackReceived(
            at=_at(6000),
            wait_id=wait,
            payload={"error": "unreadable"} if answer == "failed" else {"ok": True},
            failed=answer == "failed",
            digest=answer,
        )
    )
    return [
        SagaStarted(at=_at(0), saga_type="trip", input={"who": saga}),
        awaited,
        end,
        SagaCompleted(at=_at(12_000), output={"done": True}),
    ]


async def test_callback_waits_count_their_time_failures_and_timeouts(store: EventStore) -> None:
    for saga, answer in [("a", "answered"), ("b", "answered"), ("c", "failed"), ("d", "timed out")]:
        await _run(store, saga, _kyc(saga, answer), SagaStatus.COMPLETED)
    report = await _report(store)
    [node] = report["nodes"]
    assert (node["name"], node["kind"], node["runs"], node["attempts"]) == (
        "callback:kyc-verdict",
        "callback",
        4,
        4,
    )
    assert (node["successes"], node["refusal_rate"], node["timeout_rate"]) == (2, 0.25, 0.25)
    # The time waiting on the callback: 5 s from the wait to each answer (the timed-out
    # wait is a timeout, not a latency: 10 s would show in p99).
    assert node["latency_ms"] == {"p50": 5000, "p95": 5000, "p99": 5000}
