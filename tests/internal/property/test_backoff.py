"""The one exponential back-off curve is finite and capped at every attempt (issue 39,
8.3: ``RetryPolicy.backoff`` overflowed at attempt 1,025 though ``max_attempts`` allows
10,000, which failed the parent of any child running longer than about 3.56 days)."""

from __future__ import annotations

import math
from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st

from saga_engine.core.history._policy import RetryPolicy
from saga_engine.core.runtime._operations import CHILD_RETRY
from saga_engine.kernel._retry import Backoff, capped_exponential

attempts = st.integers(min_value=1, max_value=10**6)
seconds = st.floats(min_value=1e-6, max_value=86_400.0, allow_nan=False)
multipliers = st.floats(min_value=1.0, max_value=1e6, allow_nan=False, allow_infinity=False)


@given(attempts, seconds, seconds, multipliers)
def test_the_curve_is_finite_capped_and_never_below_the_first_delay(
    attempt: int, a: float, b: float, multiplier: float
) -> None:
    initial, maximum = min(a, b), max(a, b)
    delay = capped_exponential(attempt, initial, maximum, multiplier)
    assert math.isfinite(delay)
    assert initial <= delay <= maximum


@given(attempts, multipliers)
def test_the_curve_grows_until_the_cap(attempt: int, multiplier: float) -> None:
    now = capped_exponential(attempt, 0.2, 30.0, multiplier)
    assert capped_exponential(attempt + 1, 0.2, 30.0, multiplier) >= now


def test_the_curve_is_the_exact_power_below_the_cap() -> None:
    # Replays compare recorded delays: below the cap the value is the plain power.
    assert [capped_exponential(n, 0.2, 30.0) for n in range(1, 10)] == [
        min(30.0, 0.2 * 2.0 ** (n - 1)) for n in range(1, 10)
    ]


@given(attempts, multipliers, st.floats(min_value=0.0, max_value=1.0))
def test_a_retry_policy_has_a_delay_for_every_attempt_it_allows(
    attempt: int, multiplier: float, jitter: float
) -> None:
    policy = RetryPolicy(
        max_attempts=10_000,
        initial_backoff=timedelta(milliseconds=200),
        max_backoff=timedelta(minutes=5),
        multiplier=multiplier,
        jitter=jitter,
    )
    delay = policy.backoff(attempt, seed="saga:step")
    assert timedelta(0) <= delay <= timedelta(minutes=5)


def test_a_child_step_retries_past_attempt_1025() -> None:
    # A child is asked again 10,000 times; each ask must have its (one second) delay.
    assert CHILD_RETRY.backoff(1_025, seed="s") == timedelta(seconds=1)
    assert CHILD_RETRY.backoff(CHILD_RETRY.max_attempts, seed="s") == timedelta(seconds=1)


@given(st.integers(min_value=1, max_value=10**6))
def test_a_loop_s_back_off_stays_within_its_maximum_however_long_it_fails(n: int) -> None:
    backoff = Backoff(0.1, 5.0, rng=lambda: 1.0)
    backoff.failures = n - 1
    assert backoff.next_delay() <= 5.0
