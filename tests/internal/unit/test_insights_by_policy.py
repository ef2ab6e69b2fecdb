"""Insights split by flow policy, without a store: a run's rows are keyed by the policy
its start recorded (none recorded: 1), a policy's runs never change another's figures,
and the comparison puts each policy's figures side by side."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from saga_engine.core.history._events import (
    CommandIssued,
    Event,
    ReplyReceived,
    ReplyTimings,
    SagaCompleted,
    SagaStarted,
    event_from_dict,
    event_to_dict,
)
from saga_engine.core.views._insight_report import (
    build_report,
    compare_policies,
    nodes_by_policy,
    policy_runs,
)
from saga_engine.core.views._insights import (
    Counters,
    InsightRow,
    RowKey,
    RunSummary,
    aggregate,
    mark_of,
    summarize,
)

T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def _at(ms: int) -> datetime:
    return T0 + timedelta(milliseconds=ms)


def _history(step: str, took_ms: int, held_ms: int, flow_policy: int | None) -> list[Event]:
    """One step whose command flow control held ``held_ms`` before it was sent."""
    started = SagaStarted(at=_at(0), saga_type="trip", input={}, flow_policy=flow_policy)
    reply = ReplyReceived(
        at=_at(1 + took_ms),
        step=step,
        command_id="c",
        outcome="success",
        timings=ReplyTimings(sent_at=_at(1 + held_ms)),
    )
    return [
        # Through the stored shape, as the store reads it back.
        event_from_dict(event_to_dict(started)),
        CommandIssued(
            at=_at(1),
            step=step,
            participant="svc",
            command_type=step,
            payload={},
            payload_hash="h",
            command_id="c",
            attempt=1,
        ),
        reply,
        SagaCompleted(at=_at(2 + took_ms), output={}),
    ]


def _summary(
    step: str = "book", took_ms: int = 40, held_ms: int = 0, flow_policy: int | None = None
) -> RunSummary:
    summary = summarize([mark_of(e) for e in _history(step, took_ms, held_ms, flow_policy)])
    assert summary is not None
    return summary


def _rows(rows: dict[RowKey, Counters], flow_policy: int | None = None) -> list[InsightRow]:
    """A window's rows as a store reads them: summed per (facet, key, detail)."""
    summed: dict[tuple[str, str, str], Counters] = {}
    for (_, _, facet, key, detail, policy), c in rows.items():
        if flow_policy is None or policy == flow_policy:
            summed.setdefault((facet, key, detail), Counters()).add(c)
    return [(f, k, d, c) for (f, k, d), c in summed.items()]


def test_a_start_that_recorded_no_flow_policy_counts_as_policy_1() -> None:
    started = SagaStarted(at=T0, saga_type="trip", input={})
    assert "flow_policy" not in event_to_dict(started)  # the stored shape leaves it out
    assert _summary().flow_policy == 1
    assert {k[5] for k in aggregate([_summary()])} == {1}
    assert _summary(flow_policy=1).flow_policy == 1
    assert _summary(flow_policy=2).flow_policy == 2
    assert {k[5] for k in aggregate([_summary(flow_policy=2)])} == {2}


def test_aggregate_keys_rows_by_flow_policy() -> None:
    rows = aggregate([_summary(), _summary(flow_policy=2), _summary(flow_policy=2)])
    types = {k[5]: c.runs for k, c in rows.items() if k[2] == "type"}
    assert types == {1: 1, 2: 2}
    nodes = {k[5]: c.attempts for k, c in rows.items() if k[2] == "node"}
    assert nodes == {1: 1, 2: 2}
    # One bucket, one type: the rows differ by their policy only.
    assert len({k[:2] for k in rows}) == 1


def test_a_policy_2_run_does_not_change_policy_1s_figures() -> None:
    alone = aggregate([_summary(took_ms=40)])
    slow = _summary(took_ms=4000, held_ms=3000, flow_policy=2)
    both = aggregate([_summary(took_ms=40), slow])
    assert {k: c for k, c in both.items() if k[5] == 1} == alone
    one = build_report("trip", "1h", T0, T0 + timedelta(hours=1), _rows(both, 1))
    every = build_report("trip", "1h", T0, T0 + timedelta(hours=1), _rows(both))
    assert (one["runs"], one["nodes"][0]["latency_ms"]["p99"]) == (1, 50)
    assert (every["runs"], every["nodes"][0]["latency_ms"]["p99"]) == (2, 5000)


def test_the_policies_that_ran_and_their_figures_side_by_side() -> None:
    assert policy_runs({2: 1, 1: 3}) == [
        {"version": 1, "runs": 3, "share": 0.75},
        {"version": 2, "runs": 1, "share": 0.25},
    ]
    assert policy_runs({}) == []
    rows = aggregate(
        [
            _summary(took_ms=40, held_ms=0),
            _summary(took_ms=40, held_ms=0),
            _summary(took_ms=400, held_ms=300, flow_policy=2),
            _summary("extra", flow_policy=2),
        ]
    )
    since, until = T0, T0 + timedelta(hours=1)
    reports = {
        v: build_report("trip", "1h", since, until, _rows(rows, v), timedelta(seconds=1))
        for v in (2, 1)
    }
    comparison = compare_policies("trip", "1h", since, until, reports)
    assert comparison["runs"] == 4
    [first, second] = comparison["policies"]
    assert (first["version"], first["runs"], first["share"]) == (1, 2, 0.5)
    assert (second["version"], second["runs"], second["share"]) == (2, 2, 0.5)
    assert first["outcomes"] == {"completed": 2}
    assert first["sla_share_within"] == 1.0
    book = {p["version"]: p["nodes"][0] for p in comparison["policies"]}
    assert book[1]["name"] == book[2]["name"] == "book"
    assert (book[1]["latency_ms"]["p99"], book[2]["latency_ms"]["p99"]) == (50, 500)
    assert (book[1]["held_ms"]["p99"], book[2]["held_ms"]["p99"]) == (1, 500)
    assert book[2]["held_ms"]["samples"] == 1
    # Each node with its line per policy; "extra" only policy 2's runs took.
    by_node = nodes_by_policy(comparison)
    assert [name for name, _ in by_node] == ["book", "extra"]
    assert by_node[1][1][0] is None
    assert by_node[1][1][1] is not None
    assert compare_policies("trip", "1h", since, until, {})["policies"] == []
