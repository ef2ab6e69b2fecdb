"""Flow policies sharing a limit (``_policy_shares``) under generated arrivals:

- the shares sum to 1 over the policies, each within [0, 1];
- a policy with commands waiting or in flight keeps at least the floor (so its gate is
  never stuck), and one with neither and no arrivals has none;
- under steady arrivals the shares are proportional to them;
- a policy that stops getting commands decays toward 0 (and never grows meanwhile),
  unless it has commands waiting or in flight;
- before any arrival the policies with commands share equally.
"""

from __future__ import annotations

import itertools
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from saga_engine.core.planning._policy_shares import (
    HALF_LIFE_S,
    MIN_SHARE,
    PolicyShares,
    split_by_arrivals,
)

policies = st.lists(st.integers(1, 10), min_size=1, max_size=6, unique=True)


@settings(max_examples=300, deadline=None)
@given(
    versions=policies,
    arrivals=st.lists(st.floats(0, 1e6), min_size=6, max_size=6),
    active=st.sets(st.integers(1, 10)),
)
def test_shares_sum_to_one_and_an_active_policy_keeps_the_floor(
    versions: list[int], arrivals: list[float], active: set[int]
) -> None:
    counts = dict(zip(versions, arrivals, strict=False))
    shares = split_by_arrivals(versions, counts, active)
    assert set(shares) == set(versions)
    assert math.isclose(sum(shares.values()), 1.0, rel_tol=1e-9)
    floor = min(MIN_SHARE, 1 / len(versions))
    for version, share in shares.items():
        assert 0.0 <= share <= 1.0 + 1e-12
        if version in active:
            assert share >= floor - 1e-12, (version, shares)
        elif counts[version] == 0 and sum(counts.values()) > 0:
            assert share == 0.0  # nothing came, nothing waits: no share


@settings(max_examples=200, deadline=None)
@given(
    rates=st.lists(st.integers(1, 50), min_size=1, max_size=5),
    seconds=st.integers(30, 600),
    every=st.sampled_from([1.0, 1.5, 3.0]),
)
def test_under_steady_arrivals_the_shares_are_proportional(
    rates: list[int], seconds: int, every: float
) -> None:
    versions = list(range(1, len(rates) + 1))
    split = PolicyShares(versions)
    now = 0.0
    while now < seconds:
        split.arrived({v: int(r * every) for v, r in zip(versions, rates, strict=True)}, now)
        now += every
    shares = split.shares()
    total = sum(int(r * every) for r in rates)
    for version, rate in zip(versions, rates, strict=True):
        assert math.isclose(shares[version], int(rate * every) / total, rel_tol=1e-9)


@settings(max_examples=200, deadline=None)
@given(
    first=st.integers(1, 100),
    second=st.integers(1, 100),
    idle=st.integers(1, 40),
    active=st.booleans(),
)
def test_a_policy_that_stops_arriving_decays_toward_zero_unless_it_has_commands(
    first: int, second: int, idle: int, active: bool
) -> None:
    split = PolicyShares([1, 2])
    now = 0.0
    for _ in range(60):  # a minute of both
        split.arrived({1: first, 2: second}, now)
        now += 1.0
    keeps = {2} if active else set()
    before = split.shares(keeps)[2]
    seen = [before]
    for _ in range(idle * 30):  # policy 2 stops: only policy 1 keeps coming
        split.arrived({1: first}, now)
        now += 1.0
        seen.append(split.shares(keeps)[2])
    assert all(b <= a + 1e-12 or b == MIN_SHARE for a, b in itertools.pairwise(seen))
    if active:
        assert min(seen) >= MIN_SHARE - 1e-12  # never stuck while it has commands
    else:
        # Each half-life halves what it had against the other, which keeps coming: its
        # odds (its share over the rest) halve at least as fast.
        odds = seen[-1] / (1 - seen[-1])
        bound = before / (1 - before) * 2 ** (-(idle * 30) / HALF_LIFE_S) * (1 + 1e-9)
        assert odds <= bound, (odds, bound)
        if idle >= 20:  # ten minutes: toward 0
            assert seen[-1] < 0.001


def test_before_any_arrival_the_policies_with_commands_share_equally() -> None:
    assert split_by_arrivals([1, 2, 3], {}) == {1: 1 / 3, 2: 1 / 3, 3: 1 / 3}
    assert split_by_arrivals([1, 2, 3], {}, {2}) == {1: 0.0, 2: 1.0, 3: 0.0}
    assert split_by_arrivals([4], {4: 10.0}) == {4: 1.0}
    assert split_by_arrivals([], {}) == {}


def test_an_old_arrival_counts_half_after_a_half_life() -> None:
    split = PolicyShares([1, 2])
    split.arrived({1: 1}, 0.0)
    split.arrived({2: 1}, HALF_LIFE_S)
    assert split.arrivals == {1: 0.5, 2: 1.0}
    split.arrived({1: 1}, HALF_LIFE_S - 5)  # a clock read out of order: not decayed back
    assert split.arrivals == {1: 1.5, 2: 1.0}
    assert split.shares() == {1: 0.6, 2: 0.4}
