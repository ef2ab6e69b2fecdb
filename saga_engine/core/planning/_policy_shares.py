"""Flow policies sharing a limit: where several flow policies (``LimitsSettings.policies``)
each limit the same participant (or saga type), that participant is still one, so each
policy's gate enforces a share of its own figures: this engine's partition share times
the policy's share of the commands that recently came to those gates.

- **Recent arrivals** are counted per policy and decayed exponentially (half-life
  ``HALF_LIFE_S``): a policy rolled out to 10 % of new sagas soon sends about 10 % of
  the commands, and gets about 10 % of each limit.
- **Shares** sum to 1 over the policies of the name, and are proportional to the
  decayed arrivals; a policy that stops getting commands decays toward 0.
- **Never stuck**: a policy with commands waiting or in flight at a gate keeps at least
  ``MIN_SHARE`` (taken from the others in proportion), so its gate stays open (a
  concurrency of at least one: ``Gate.concurrency``). Before any arrival the policies
  with commands share equally.
- A policy with no gate for the name is unlimited there, and a name only one policy
  limits is not shared: its gate has the partition share, as without policies.

No I/O and no clock: ``arrived`` takes ``now`` (monotonic seconds), given by the flow
sender at most every ``SHARES_EVERY_S`` (``tests/internal/property/test_policy_shares.py``).
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field

#: The half-life of an arrival in the counts, in seconds.
HALF_LIFE_S = 30.0
#: How often the flow sender recomputes the shares (at most), in seconds.
SHARES_EVERY_S = 1.0
#: The least share of a policy with commands waiting or in flight at its gate.
MIN_SHARE = 0.05
#: Decayed arrivals (or a share) below this are none: no float sinks into denormals.
_GONE = 1e-12


@dataclass(slots=True)
class PolicyShares:
    """The policies that limit one participant (or saga type): their decayed arrivals,
    and each one's share of the limits."""

    policies: Sequence[int]
    half_life_s: float = HALF_LIFE_S
    floor: float = MIN_SHARE
    #: Per policy, the commands that came, each weighed ``0.5 ** (age / half_life_s)``.
    arrivals: dict[int, float] = field(default_factory=dict)
    #: When they were last decayed (None: never).
    at: float | None = None

    def arrived(self, counts: Mapping[int, int], now: float) -> None:
        """Decays the counts to ``now`` and adds ``counts`` (per policy: the commands
        that came since the last call), as if they came at ``now``."""
        at = self.at
        if at is None or now > at:
            if at is not None:
                factor = 0.5 ** ((now - at) / self.half_life_s)
                arrivals = self.arrivals
                for policy, weight in arrivals.items():
                    decayed = weight * factor
                    arrivals[policy] = decayed if decayed >= _GONE else 0.0
            self.at = now
        for policy, count in counts.items():
            if count > 0:
                self.arrivals[policy] = self.arrivals.get(policy, 0.0) + count

    def shares(self, active: Container[int] = ()) -> dict[int, float]:
        """Each policy's share (summing to 1); ``active``: the policies with commands
        waiting or in flight, which keep at least the floor."""
        return split_by_arrivals(self.policies, self.arrivals, active, self.floor)


def split_by_arrivals(
    policies: Sequence[int],
    arrivals: Mapping[int, float],
    active: Container[int] = (),
    floor: float = MIN_SHARE,
) -> dict[int, float]:
    """Shares of 1 among ``policies`` in proportion to ``arrivals``, the ``active`` ones
    lifted to ``floor`` at least (at most an equal share), the others scaled down to
    make room."""
    if not policies:
        return {}
    floor = min(floor, 1.0 / len(policies))
    raw = {p: max(0.0, arrivals.get(p, 0.0)) for p in policies}
    total = sum(raw.values())
    if total <= 0:
        holders = [p for p in policies if p in active] or list(policies)
        return {p: 1.0 / len(holders) if p in holders else 0.0 for p in policies}
    share = {p: amount / total for p, amount in raw.items()}
    lifted: set[int] = set()
    while True:
        free = [p for p in policies if p not in lifted]
        rest = sum(share[p] for p in free)
        left = 1.0 - floor * len(lifted)
        if rest > _GONE:
            scaled = {p: share[p] * left / rest for p in free}
        else:  # what is free had (next to) nothing: it splits what is left evenly
            scaled = {p: left / len(free) for p in free}
        below = {p for p in free if p in active and scaled[p] < floor}
        if not below:
            return {p: floor if p in lifted else scaled[p] for p in policies}
        lifted |= below
