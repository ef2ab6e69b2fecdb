"""The back-off of the in-process retry loops (saga_engine/kernel/_retry.py)."""

from __future__ import annotations

import random

import pytest

from saga_engine.kernel._retry import Backoff, jittered


def test_delays_double_from_initial_up_to_maximum_at_the_lowest_jitter() -> None:
    backoff = Backoff(0.1, 1.0, rng=lambda: 0.0)  # the fixed half of each delay
    delays = [backoff.next_delay() for _ in range(6)]
    assert delays == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.5, 0.5])
    assert backoff.failures == 6


def test_the_highest_jitter_reaches_the_ceiling_and_never_passes_it() -> None:
    backoff = Backoff(0.1, 1.0, rng=lambda: 1.0)
    assert [backoff.next_delay() for _ in range(6)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1, 1])


def test_every_delay_lies_in_the_upper_half_of_its_ceiling() -> None:
    rng = random.Random(7)
    backoff = Backoff(0.05, 5.0, rng=rng.random)
    seen = set()
    for n in range(1, 200):
        delay = backoff.next_delay()
        ceiling = min(5.0, 0.05 * 2 ** (n - 1))
        assert ceiling / 2 <= delay <= ceiling
        seen.add(round(delay / ceiling, 3))
    assert len(seen) > 100, "the random half spreads loops that fail together"


def test_reset_starts_again_from_initial() -> None:
    backoff = Backoff(0.5, 10.0, rng=lambda: 0.0)
    for _ in range(5):
        backoff.next_delay()
    backoff.reset()
    assert backoff.failures == 0
    assert backoff.next_delay() == pytest.approx(0.25)


def test_a_long_outage_stays_at_the_maximum() -> None:
    backoff = Backoff(0.1, 5.0, rng=lambda: 0.5)
    for _ in range(10_000):  # 2**10_000 would overflow a float: the ceiling is capped first
        delay = backoff.next_delay()
    assert delay == pytest.approx(3.75)


def test_a_fixed_delay_is_jittered_below_it() -> None:
    backoff = Backoff(0.5, 0.5, rng=lambda: 0.0)
    assert {backoff.next_delay() for _ in range(3)} == {0.25}


def test_the_stateless_form_is_the_same_formula() -> None:
    rng = iter([0.3, 0.3, 0.3]).__next__
    backoff = Backoff(0.05, 2.0, rng=lambda: 0.3)
    assert [jittered(n, 0.05, 2.0, rng) for n in (1, 2, 3)] == [
        backoff.next_delay() for _ in range(3)
    ]


@pytest.mark.parametrize(("initial", "maximum"), [(0, 1), (-1, 1), (2, 1)])
def test_bounds_must_make_sense(initial: float, maximum: float) -> None:
    with pytest.raises(ValueError, match="initial <= maximum"):
        Backoff(initial, maximum)


async def test_sleep_waits_the_next_delay_and_returns_it() -> None:
    backoff = Backoff(0.001, 0.002, rng=lambda: 0.0)
    assert await backoff.sleep() == pytest.approx(0.0005)
    assert await backoff.sleep() == pytest.approx(0.001)
    assert backoff.failures == 2
