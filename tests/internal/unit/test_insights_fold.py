"""The roll-up's fold of a batch (``aggregate``), pinned: a batch adds up to what its
runs add one by one, and each count, sum and histogram bucket is the one a value by value
fold gives (``histogram_index``: a value on a bound counts in the bound's bucket)."""

from __future__ import annotations

import random
from datetime import UTC, datetime

from saga_engine.core.views._insights import (
    BOUNDS_MS,
    BUCKETS,
    CPU,
    PHASES,
    Counters,
    Mark,
    RowKey,
    RunSummary,
    aggregate,
    bucket_of,
    epoch_ms,
    histogram_index,
    summarize,
)

T0 = epoch_ms(datetime(2026, 12, 6, 12, 0, tzinfo=UTC))


def _run(
    took: list[float],
    *,
    start: float = T0,
    outcome: str = "saga_completed",
    policy: int | None = None,
    error: str | None = None,
    timed: bool = True,
) -> RunSummary:
    """A run of one step per latency in ``took`` (ms), one after another, each reply
    with timings (its phases: held 1, to_participant 2, waiting 0 (the participant's
    clock behind), handler ``took - 3``, apply 0.5, cpu ``took``; no commit nor back:
    no commit time)
    unless ``timed`` is False; the last step refused with ``error`` when given."""
    marks = [Mark("saga_started", start, saga_type="t", flow_policy=policy)]
    at = start
    for i, ms in enumerate(took):
        step, cid = f"s{i}", f"c{i}"
        marks.append(Mark("command_issued", at, step=step, command_id=cid))
        refused = error is not None and i == len(took) - 1
        timings: dict[str, float] = (
            {
                "sent": at + 1,
                "received": at + 3,
                "handler_start": at + 2,
                "handler_end": at + ms - 1,
                "cpu_ms": ms,
                "recorded": at + ms + 0.5,
            }
            if timed
            else {}
        )
        marks.append(
            Mark(
                "reply_received",
                at + ms,
                step=step,
                command_id=cid,
                outcome="failure" if refused else "success",
                error=error if refused else None,
                **timings,  # type: ignore[arg-type]
            )
        )
        at += ms
    marks.append(Mark(outcome, at + 7))
    summary = summarize(marks)
    assert summary is not None
    return summary


def _dump(rows: dict[RowKey, Counters]) -> list[tuple[RowKey, tuple[object, ...]]]:
    return [
        (
            k,
            (
                c.runs,
                c.attempts,
                c.successes,
                c.refusals,
                c.timeouts,
                c.compensations,
                c.offset_ms,
                c.rank_sum,
                c.hist,
                c.total_us,
            ),
        )
        for k, c in sorted(rows.items())
    ]


def _one_by_one(summaries: list[RunSummary]) -> dict[RowKey, Counters]:
    """The batch's rows as each run's own rows added up (as the stores add a roll-up's
    rows into theirs)."""
    rows: dict[RowKey, Counters] = {}
    for s in summaries:
        for k, c in aggregate([s]).items():
            rows.setdefault(k, Counters()).add(c)
    return rows


def test_a_value_on_a_bound_counts_in_that_bounds_bucket_and_each_count_adds_up() -> None:
    # Latencies on, just above and far past the bounds, in one group (one bucket, type
    # and policy): s0 takes each, s1 its double. (Each a sum of powers of 2 no finer
    # than 1/4: exact in epoch milliseconds.)
    took = [1.0, 1.5, 2.0, 5.0, 5.25, 10.0, 999.0, 1000.0, 86_400_000.0, 90_000_000.0]
    runs = [_run([ms, 2 * ms], start=T0 - 3 * ms) for ms in took]
    rows = aggregate(runs)
    assert len({k[1] for k in rows}) == 1  # every run ended in one bucket

    def row(facet: str, key: str, detail: str) -> Counters:
        return rows["t", bucket_of(runs[0].ended_at), facet, key, detail, 1]

    s0 = row("node", "s0", "step")
    expected = [0] * BUCKETS
    for ms in took:
        expected[histogram_index(ms)] += 1
    assert s0.hist == expected
    # Each pinned by hand: [1] 1 ms; (1, 2] 1.5 and 2 ms; (2, 5] 5 ms; (5, 10] 5.25 and
    # 10 ms; (500, 1000] 999 and 1000 ms; (1 h, 1 d] 1 d; the last: past a day.
    assert [(i, n) for i, n in enumerate(s0.hist) if n] == [
        (0, 1),
        (1, 2),
        (2, 1),
        (3, 2),
        (9, 2),
        (BUCKETS - 2, 1),
        (BUCKETS - 1, 1),
    ]
    assert (s0.runs, s0.attempts, s0.successes, s0.refusals, s0.rank_sum) == (10, 10, 10, 0, 0)
    s1 = row("node", "s1", "step")
    assert (s1.runs, s1.rank_sum, sum(s1.hist)) == (10, 10, 10)
    assert s1.offset_ms == sum(int(ms) for ms in took)  # s1 starts where s0 ended
    handler = row("phase", "s0", "handler")
    assert handler.runs == 10
    assert handler.total_us == sum(round(max(ms - 3, 0.0) * 1000) for ms in took)
    cpu = row("phase", "s0", CPU)
    assert (cpu.hist, cpu.total_us) == (expected, sum(round(ms * 1000) for ms in took))
    waiting = row("phase", "s0", "waiting")
    assert (waiting.hist[0], waiting.total_us) == (10, 0)  # the clock behind: 0, not below
    assert not [k for k in rows if k[2] == "phase" and k[4] in ("commit", "back")]
    [run] = [c for k, c in rows.items() if k[2] == "type"]
    assert (run.runs, sum(run.hist)) == (10, 10)


def test_a_batch_adds_up_to_its_runs_one_by_one() -> None:
    rng = random.Random(7)
    summaries = [
        _run(
            [rng.choice([0.5, 1.0, 3.0, 20.0, 2_000.0, rng.uniform(0, 5_000)]) for _ in range(3)],
            start=T0 + rng.choice([0, 60_000, 600_000]),
            outcome=rng.choice(["saga_completed", "saga_failed"]),
            policy=rng.choice([None, 2]),
            error=rng.choice([None, None, "refused", "x" * 300]),
            timed=rng.random() < 0.7,
        )
        for _ in range(60)
    ]
    batch = aggregate(summaries)
    assert _dump(batch) == _dump(_one_by_one(summaries))
    assert {k[5] for k in batch} == {1, 2}  # both policies
    assert len({k[1] for k in batch}) > 1  # more than one bucket
    errors = {k[4]: c.runs for k, c in batch.items() if k[2] == "error"}
    assert set(errors) == {"refused", "x" * 200}
    # Every phase's observations are the replies that measured it: all but "commit" and
    # "back" (no reply says when it committed).
    phase_runs = dict.fromkeys((*PHASES, CPU), 0)
    for k, c in batch.items():
        if k[2] == "phase":
            phase_runs[k[4]] += c.runs
            assert sum(c.hist) == c.runs
    timed_replies = sum(
        len((n.phases or {}).get("held", [])) for s in summaries for n in s.nodes.values()
    )
    assert timed_replies > 0
    unmeasured = {"commit", "back"}
    assert phase_runs == {p: 0 if p in unmeasured else timed_replies for p in phase_runs}


def test_histogram_index_is_the_bucket_a_fold_counts_in() -> None:
    # The bounds themselves, either side of each (by 1/4 ms: exact), and the ends.
    values = [0.0, -1.0, *BOUNDS_MS, *(b + 0.25 for b in BOUNDS_MS), *(b - 0.25 for b in BOUNDS_MS)]
    runs = [_run([v], start=T0 - max(v, 0.0)) for v in values]
    [node] = [c for k, c in aggregate(runs).items() if k[2] == "node"]
    expected = [0] * BUCKETS
    for v in values:
        # A negative latency (clocks) counts as 0 ms.
        expected[histogram_index(max(v, 0.0))] += 1
    assert node.hist == expected
