"""The drill's timings (``ProgressWatch.timings``) as the broker-restart test reads them:
a fault after every saga settled has no progress after it, so its timing is absent; a
saga still open at the last fault makes progress after every fault, which is timed."""

from __future__ import annotations

from saga_engine.cli._drill_checks import ProgressWatch


def _watch(progress_at: list[float], faults_at: list[float], settled_at: float) -> ProgressWatch:
    watch = ProgressWatch("postgresql://unused", "unused", saga_ids=["s"])
    watch.progress_at = progress_at
    watch.faults = [("broker-restart", t, 1000.0 + t) for t in faults_at]
    watch.settled_at = settled_at
    return watch


def test_faults_after_every_saga_settled_have_no_progress_to_time() -> None:
    # The run the issue quotes: a slow start-up, the load done before the first restart.
    timings = _watch([1.0, 1.3, 1.82, 2.0], faults_at=[10.0, 18.0], settled_at=2.0).timings([])
    assert timings == {
        "takeover_s": None,
        "first_progress_after_fault_s": None,
        "longest_stall_s": 0.52,
        "drain_after_last_fault_s": 0.0,
    }


def test_a_saga_open_at_the_last_fault_times_the_progress_after_every_fault() -> None:
    watch = _watch([1.0, 10.5, 12.0, 18.75, 19.0], faults_at=[10.0, 18.0], settled_at=19.0)
    timings = watch.timings([])
    assert timings["drain_after_last_fault_s"] == 1.0
    assert timings["first_progress_after_fault_s"] == 0.75  # the slower of 0.5 and 0.75
