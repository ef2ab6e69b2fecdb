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
