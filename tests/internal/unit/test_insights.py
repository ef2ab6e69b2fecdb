"""The insights' pure parts: the graph's layout (gather branches share a column) and the
aggregation of a run (``core/views/_insights``) without a store."""

from __future__ import annotations

from datetime import UTC, datetime

from saga_engine.admin._graph_svg import columns, graph_svg
from saga_engine.core.views._insight_report import build_report, count_within_limit, percentiles
from saga_engine.core.views._insights import BUCKETS, Counters, Mark, aggregate, epoch_ms, summarize

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def test_gather_branches_share_a_column() -> None:
    def node(rank: int) -> Counters:
        return Counters(runs=2, attempts=2, successes=2, rank_sum=2 * rank)

    rows = [
        ("type", "completed", "", Counters(runs=2)),
        ("node", "reserve", "step", node(0)),
        ("node", "pay", "step", node(1)),
        ("node", "ship", "step", node(2)),
        ("node", "notify", "step", node(3)),
        ("overlap", "pay", "ship", Counters(runs=2)),
    ]
    now = NOW
    report = build_report("trip", "1h", now, now, rows)
    assert [[n["name"] for n in c] for c in columns(report)] == [
        ["reserve"],
        ["pay", "ship"],
        ["notify"],
    ]
    svg = graph_svg(report)
    assert svg.count('class="edge"') == 4  # reserve to both branches, both to notify
    assert graph_svg(build_report("trip", "1h", now, now, [])) == ""


def test_a_run_not_ended_is_not_summarised() -> None:
    started = Mark("saga_started", epoch_ms(NOW), saga_type="t")
    assert summarize([started]) is None
    assert summarize([]) is None


def test_a_timed_out_attempt_then_a_success() -> None:
    at = epoch_ms(NOW)
    marks = [
        Mark("saga_started", at, saga_type="t"),
        Mark("command_issued", at, step="pay", command_id="c1"),
        Mark("attempt_timed_out", at + 5000, step="pay", command_id="c1"),
        Mark("command_issued", at + 5000, step="pay", command_id="c2"),
        Mark("reply_received", at + 6000, step="pay", command_id="c2", outcome="success"),
        Mark("saga_completed", at + 6000),
    ]
    summary = summarize(marks)
    assert summary is not None
    pay = summary.nodes["pay"]
    assert (pay.attempts, pay.timeouts, pay.successes, pay.latencies_ms) == (2, 1, 1, [1000.0])
    rows = aggregate([summary])
    [node] = [c for k, c in rows.items() if k[2] == "node"]
    assert node.hist[BUCKETS - 1] == 0
    assert percentiles(node.hist) == {"p50": 1000, "p95": 1000, "p99": 1000}


def test_percentiles_and_the_sla_share_from_a_histogram() -> None:
    hist = [0] * BUCKETS
    hist[9] = 90  # up to 1 s
    hist[12] = 10  # 5-10 s
    assert percentiles(hist) == {"p50": 1000, "p95": 10000, "p99": 10000}
    assert count_within_limit(hist, 1000) == 90
    assert count_within_limit(hist, 7500) == 95  # half of the 5-10 s bucket, pro rata
    assert percentiles([0] * BUCKETS) == {"p50": None, "p95": None, "p99": None}


def _timed_run(reply: Mark) -> list[Mark]:
    return [
        Mark("saga_started", 0.0, saga_type="t"),
        Mark("command_issued", 10.0, step="a", command_id="c"),
        reply,
        Mark("saga_completed", 200.0),
    ]


def test_a_replys_timings_fold_into_phases_each_between_two_known_marks() -> None:
    reply = Mark(
        "reply_received",
        100.0,
        step="a",
        command_id="c",
        outcome="success",
        sent=15.0,
        received=12.0,  # the participant's clock is behind: counted as 0, not negative
        handler_start=20.0,
        handler_end=50.0,
        committed=55.0,
        cpu_ms=7.25,
        recorded=104.0,
    )
    summary = summarize(_timed_run(reply))
    assert summary is not None
    assert summary.nodes["a"].phases == {
        "held": [5.0],
        "to_participant": [0.0],
        "waiting": [8.0],
        "handler": [30.0],
        "commit": [5.0],
        "back": [45.0],
        "apply": [4.0],
        "cpu": [7.25],
    }
    rows = aggregate([summary])
    phase = {k[4]: c for k, c in rows.items() if k[2] == "phase"}
    assert (phase["handler"].runs, phase["handler"].total_us) == (1, 30_000)
    assert phase["cpu"].total_us == 7_250


def test_a_duplicates_reply_and_a_reply_without_headers_measure_what_they_can() -> None:
    duplicate = Mark(
        "reply_received",
        100.0,
        step="a",
        command_id="c",
        outcome="success",
        sent=15.0,
        received=20.0,
        committed=30.0,
    )
    summary = summarize(_timed_run(duplicate))
    assert summary is not None
    phases = summary.nodes["a"].phases
    assert phases is not None
    # No handler ran: neither waiting, handler nor commit (their ends are unknown).
    assert set(phases) == {"held", "to_participant", "back"}
    bare = Mark("reply_received", 100.0, step="a", command_id="c", outcome="success")
    summary = summarize(_timed_run(bare))
    assert summary is not None
    assert summary.nodes["a"].phases is None
    assert not [k for k in aggregate([summary]) if k[2] == "phase"]
