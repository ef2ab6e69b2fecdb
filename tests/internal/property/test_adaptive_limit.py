"""The adaptive concurrency limit (``_adaptive_limit.AdaptiveLimit``) under generated
replies and timeouts, and against a model participant: one that serves *C* commands at
once in a steady time *b* and queues the rest, so a reply with *L* in flight takes
``b x max(1, L / C)`` (give or take a tenth).

- it stays within its bounds, whatever it is told;
- a timeout never raises it, and timeouts in a row bring it to its minimum;
- kept busy (as many in flight as it allows), it converges: it uses the participant's
  capacity without queueing it without end (``C <= limit <= 1.7 x C + 10``), also after
  the capacity changes mid-run (back within the band within 500 replies);
- it shrinks when latency rises, and a probe learns a participant slower for good.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from saga_engine.core.planning._adaptive_limit import AdaptiveLimit, AimdLimit


def model_latency(rng: random.Random, in_flight: int, capacity: int, base_s: float) -> float:
    return base_s * max(1.0, in_flight / capacity) * (1 + rng.uniform(-0.1, 0.1))


def drive(
    limit: AdaptiveLimit | AimdLimit,
    rng: random.Random,
    capacity: int,
    base_s: float,
    replies: int,
) -> list[int | None]:
    """Replies from the model participant with as many in flight as the limit allows
    (while a probe drains, what was in flight answers first); the limit after each, None
    while it probes (the gradient's)."""
    seen: list[int | None] = []
    in_flight = limit.value
    for i in range(replies):
        limit.observe(model_latency(rng, in_flight, capacity, base_s), in_flight, float(i))
        in_flight = max(limit.value, in_flight - 1)
        probing = isinstance(limit, AdaptiveLimit) and limit.probing is not None
        seen.append(None if probing else limit.value)
    return seen


def in_band(value: int | None, capacity: int, low: float = 1.0) -> bool:
    """Uses the capacity, without a queue of more than 70 % of it (10 for a small one);
    a probe is left out."""
    return value is None or low * capacity <= value <= 1.7 * capacity + 10


bounds = st.tuples(st.integers(1, 50), st.integers(0, 500)).map(lambda t: (t[0], t[0] + t[1]))


@settings(max_examples=300, deadline=None)
@given(
    bounds=bounds,
    signals=st.lists(
        st.one_of(
            st.tuples(st.one_of(st.floats(-1, 100), st.just(float("nan"))), st.integers(0, 600)),
            st.just("timeout"),
        ),
        max_size=200,
    ),
)
@pytest.mark.parametrize("algorithm", [AdaptiveLimit, AimdLimit])
def test_it_stays_within_its_bounds(
    algorithm: type[AdaptiveLimit | AimdLimit],
    bounds: tuple[int, int],
    signals: list[tuple[float, int] | str],
) -> None:
    """Either algorithm (the AIMD limit's own properties: ``test_aimd_limit.py``)."""
    low, high = bounds
    limit = algorithm(low, high)
    for now, signal in enumerate(signals):
        before = limit.value
        if signal == "timeout":
            limit.timed_out(float(now))
            assert limit.value <= before  # a timeout never raises it
        else:
            assert isinstance(signal, tuple)
            limit.observe(signal[0], signal[1], float(now))
        assert low <= limit.value <= high
        assert low <= limit.limit <= high


@settings(max_examples=100, deadline=None)
@given(capacity=st.integers(1, 300), start=st.integers(0, 2000), seed=st.integers(0, 2**16))
def test_timeouts_in_a_row_bring_it_to_its_minimum(capacity: int, start: int, seed: int) -> None:
    limit = AdaptiveLimit(2, 1000)
    drive(limit, random.Random(seed), capacity, 0.01, start)
    for n in range(200):
        before = limit.value
        limit.timed_out(float(n))
        assert limit.value <= max(2, before)
        assert limit.cause == "timeout" or limit.value == before
    assert limit.value == 2


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(1, 400),
    base_ms=st.integers(1, 500),
    seed=st.integers(0, 2**16),
)
def test_kept_busy_it_converges_on_the_participants_capacity(
    capacity: int, base_ms: int, seed: int
) -> None:
    limit = AdaptiveLimit(1, 2000)
    seen = drive(limit, random.Random(seed), capacity, base_ms / 1000, 5000)
    assert all(in_band(v, capacity) for v in seen[3000:]), (capacity, seen[3000:])


@settings(max_examples=60, deadline=None)
@given(
    before=st.integers(1, 300),
    after=st.integers(1, 300),
    seed=st.integers(0, 2**16),
)
def test_it_converges_again_when_the_capacity_changes(before: int, after: int, seed: int) -> None:
    rng = random.Random(seed)
    limit = AdaptiveLimit(1, 2000)
    drive(limit, rng, before, 0.01, 3000)
    seen = drive(limit, rng, after, 0.01, 4000)
    assert all(in_band(v, after) for v in seen[2500:]), (after, seen[2500:])


@settings(max_examples=25, deadline=None)
@given(capacity=st.integers(4, 200), slower=st.integers(2, 5), seed=st.integers(0, 2**16))
def test_a_participant_slower_for_good_is_learnt_again(
    capacity: int, slower: int, seed: int
) -> None:
    """Its handler takes ``slower`` times as long from now on: the limit drops while that
    looks like a queue, a probe measures the new baseline, and it grows back."""
    rng = random.Random(seed)
    limit = AdaptiveLimit(1, 2000)
    drive(limit, rng, capacity, 0.01, 4000)
    before = limit.value
    seen = drive(limit, rng, capacity, 0.01 * slower, 5000)
    assert min(v for v in seen[:1500] if v is not None) < before  # taken for a queue first
    assert all(in_band(v, capacity) for v in seen[3500:]), seen[3500:]


def test_its_reason_names_the_figures() -> None:
    limit = AdaptiveLimit(1, 100)
    assert (limit.value, limit.cause, limit.reason) == (1, "start", "starting at the minimum")
    assert limit.floor == 4
    for n in range(40):
        limit.observe(0.010, limit.value, float(n))
    assert limit.cause == "latency_held"
    assert limit.reason.startswith("grew: replies take 10.0 ms, the baseline is 10.0 ms")
    grown = limit.value
    for n in range(40, 60):
        limit.observe(0.050, limit.value, float(n))
    assert limit.value < grown
    assert limit.cause == "latency_rose"
    assert "the baseline is 10.0 ms (gradient 0.50)" in limit.reason
    before = limit.value
    at = 61.0
    limit.timed_out(at)
    while limit.value == before:  # a tenth off may not move a small limit's whole number
        at += 1
        limit.timed_out(at)
    assert (limit.cause, limit.reason, limit.moved_at) == (
        "timeout",
        "shrank: a reply timed out",
        at,
    )
