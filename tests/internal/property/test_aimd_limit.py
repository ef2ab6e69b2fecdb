"""The AIMD adaptive limit (``_adaptive_limit.AimdLimit``, ``FlowLimit(algorithm="aimd")``)
under generated replies and timeouts, and against the model participant of
``test_adaptive_limit.py`` (it serves *C* at once in a steady time and queues the rest):

- it stays within its bounds, whatever it is told, and a timeout never raises it
  (``test_adaptive_limit.py``, for either algorithm);
- under steady low latency and use it grows, by about one per round trip, and not
  while it is not used;
- timeouts shrink it, a tenth each, down to its minimum;
- kept busy, it uses the participant's capacity without queueing it without end
  (``C <= limit <= 2 x C + 10``): the baseline does not learn a queue;
- the baseline is relearnt (without a probe) after the participant got slower for good,
  and the limit is back within the band.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from saga_engine.core.planning._adaptive_limit import AIMD_WINDOW, AimdLimit, latency_limit
from saga_engine.core.planning._flow import Gate, GateKind
from saga_engine.kernel._settings import FlowLimit
from tests.internal.property.test_adaptive_limit import drive


def in_band(value: int | None, capacity: int) -> bool:
    return value is None or capacity <= value <= 2 * capacity + 10


@settings(max_examples=100, deadline=None)
@given(replies=st.integers(50, 3000), latency_ms=st.integers(1, 500))
def test_under_steady_low_latency_and_use_it_grows_by_one_per_round_trip(
    replies: int, latency_ms: int
) -> None:
    limit = AimdLimit(1, 10_000)
    seen = []
    for n in range(replies):
        limit.observe(latency_ms / 1000, limit.value, float(n))
        seen.append(limit.limit)
    assert seen == sorted(seen)  # never down
    # One per round trip (a limit's worth of replies): about sqrt(2 x replies) after them.
    assert 0.9 * (2 * replies) ** 0.5 <= limit.limit <= 1.1 * (2 * replies) ** 0.5 + 1
    assert limit.cause == "latency_held"
    idle = AimdLimit(1, 10_000, limit=50.0)
    for n in range(replies):  # latency holds, but it is not used: no sign it could use more
        idle.observe(latency_ms / 1000, 10, float(n))
    assert idle.value == 50


@settings(max_examples=100, deadline=None)
@given(capacity=st.integers(1, 60), start=st.integers(0, 3000), seed=st.integers(0, 2**16))
def test_timeouts_shrink_it_to_its_minimum(capacity: int, start: int, seed: int) -> None:
    limit = AimdLimit(2, 1000)
    drive(limit, random.Random(seed), capacity, 0.01, start)
    for n in range(200):
        before = limit.limit
        limit.timed_out(float(n))
        assert limit.limit == max(2.0, before * 0.9)
    assert (limit.value, limit.timeouts) == (2, 200)


@settings(max_examples=40, deadline=None)
@given(capacity=st.integers(1, 40), base_ms=st.integers(1, 500), seed=st.integers(0, 2**16))
def test_kept_busy_it_uses_the_capacity_without_an_endless_queue(
    capacity: int, base_ms: int, seed: int
) -> None:
    limit = AimdLimit(1, 2000)
    seen = drive(limit, random.Random(seed), capacity, base_ms / 1000, 8000)
    assert all(in_band(v, capacity) for v in seen[5000:]), (capacity, seen[5000:])
    assert limit.baseline is not None
    assert limit.baseline <= base_ms / 1000 * 1.1  # a queue's latency is not the baseline


@settings(max_examples=25, deadline=None)
@given(capacity=st.integers(2, 40), slower=st.integers(2, 5), seed=st.integers(0, 2**16))
def test_it_relearns_the_baseline_after_the_participant_got_slower_for_good(
    capacity: int, slower: int, seed: int
) -> None:
    rng = random.Random(seed)
    limit = AimdLimit(1, 2000)
    drive(limit, rng, capacity, 0.01, 6000)
    assert limit.baseline is not None
    assert limit.baseline < 0.011
    seen = drive(limit, rng, capacity, 0.01 * slower, 4 * AIMD_WINDOW + 6000)
    assert limit.baseline >= 0.01 * slower * 0.9  # the lowest of the new service time
    assert all(in_band(v, capacity) for v in seen[-1000:]), seen[-1000:]


def test_its_reasons_name_the_figures_and_a_gate_picks_it() -> None:
    limit = AimdLimit(1, 100)
    assert (limit.value, limit.cause, limit.algorithm) == (1, "start", "aimd")
    for n in range(40):
        limit.observe(0.010, limit.value, float(n))
    assert limit.cause == "latency_held"
    assert limit.reason == "grew: replies take 10.0 ms, the baseline is 10.0 ms"
    grown = limit.value
    for n in range(40, 80):
        limit.observe(0.030, limit.value, float(n))
    assert limit.value < grown
    assert limit.cause == "latency_rose"
    assert limit.reason.startswith("shrank: replies take ")
    assert limit.reason.endswith("above 2 x the baseline of 10.0 ms")
    aimd = Gate(
        GateKind.PARTICIPANT,
        "p",
        FlowLimit(concurrency="adaptive", algorithm="aimd", min_concurrency=2),
    )
    assert isinstance(aimd.adaptive, AimdLimit)
    assert (aimd.adaptive.min_limit, aimd.adaptive.max_limit) == (2, 1000)
    gradient = Gate(GateKind.PARTICIPANT, "p", FlowLimit(concurrency="adaptive"))
    assert gradient.adaptive is not None
    assert gradient.adaptive.algorithm == "gradient"
    assert latency_limit(None, 1, 5).algorithm == "gradient"
