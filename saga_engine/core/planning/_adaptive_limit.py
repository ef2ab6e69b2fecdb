"""An adaptive concurrency limit (``FlowLimit(concurrency="adaptive")``): a gradient limit
in the style of Netflix's concurrency-limits, fed by what flow control observes of a
participant (each reply's latency from its command's send, each attempt that timed out).

No I/O and no clock: ``observe`` and ``timed_out`` take ``now``, so the limit is a
function of what it was told (``tests/internal/property/test_adaptive_limit.py``).

- **Baseline**: the latency of a reply with no queue at the participant, the lowest seen
  since the last **probe**: every 1,000 replies the limit drops to its floor (4, or its
  minimum) until as few are in flight, and the lowest of the next 8 replies is the
  baseline; then the limit is what it was. So a participant whose handler became slower
  for good (which looks like a queue at first: the limit shrinks) is learnt again.
- **Recent**: an exponential average of the last replies' latencies.
- **Gradient**: ``TOLERANCE x baseline / recent``, within [0.5, 1]: 1 while latency
  holds (within 1.5 x the baseline, which absorbs jitter), smaller as a queue builds.
- **Each reply** moves the limit ``1 / (5 x limit)`` of the way to ``limit x gradient +
  sqrt(limit)``: a whole limit's worth of replies (about one round trip) moves it a
  fifth of the way, so it reacts to the latency of what it sent, not to the replies
  already on their way back (moved a fifth per reply, it overshot by a round trip's
  replies and swung between a few and many times the participant's capacity:
  ``bench/scheduler.py``). It grows (by about the square root of itself per round trip)
  while latency holds and the limit is used (at least half of it in flight), and
  shrinks in proportion to the latency's rise. On a participant that serves *C* at once with a steady service time,
  it settles near ``1.5 x C + sqrt(1.5 x C)``.
- **Each timeout** cuts it by a tenth (multiplicative decrease): an unanswered attempt is
  the strongest sign of overload.
- Always within ``[min_limit, max_limit]``; ``value`` is the whole number of commands it
  lets be in flight, and ``reason`` says why it last moved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: How far above the baseline latency may be and still count as holding.
TOLERANCE = 1.5
#: The share of the way to its target a round trip's replies (the limit's worth) move it.
SMOOTHING = 0.2
#: The weight of a reply in the recent latency (about the last ten replies).
RECENT_WEIGHT = 0.1
#: What a timeout leaves of the limit.
BACKOFF = 0.9
#: Replies between two probes of the baseline, and the replies a probe measures.
PROBE_EVERY = 1000
PROBE_REPLIES = 8
#: Where a probe takes the limit: 4 (where the smallest gradient holds it, 0.5 x 4 +
#: sqrt(4) = 4), or the minimum.
_FLOOR = 4


@dataclass(slots=True)
class AdaptiveLimit:
    """One gate's adaptive concurrency; see the module docstring."""

    min_limit: int
    max_limit: int
    limit: float = 0.0
    baseline: float | None = None
    recent: float | None = None
    #: Why the limit last moved, in words (with the figures)...
    reason: str = "starting at the minimum"
    #: ...and as one of "start", "latency_held", "latency_rose", "timeout", "probe",
    #: "bounds".
    cause: str = "start"
    #: When it last moved (the ``now`` it was told), None: never.
    moved_at: float | None = None
    replies: int = 0
    timeouts: int = 0
    #: The replies at which the next probe starts.
    probe_at: int = PROBE_EVERY
    #: While probing: the limit to go back to, and the lowest latency measured so far.
    probing: float | None = None
    probe_low: float | None = None
    probe_replies: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.min_limit <= self.max_limit:
            raise ValueError(
                f"adaptive limit bounds must satisfy 1 <= min ({self.min_limit}) <= max "
                f"({self.max_limit})"
            )
        self.limit = float(min(max(self.limit, self.min_limit), self.max_limit))

    @property
    def value(self) -> int:
        """The commands it lets be in flight now."""
        return min(self.max_limit, max(self.min_limit, int(self.limit)))

    @property
    def floor(self) -> int:
        return min(self.max_limit, max(self.min_limit, _FLOOR))

    def bound(self, min_limit: int, max_limit: int) -> None:
        """New bounds (this engine's share changed); the limit is kept within them."""
        self.min_limit, self.max_limit = min_limit, max(min_limit, max_limit)
        self._set(self.limit, "bounds", "bounds changed (this engine's share)", self.moved_at)

    def observe(self, latency_s: float, in_flight: int, now: float) -> None:
        """A reply came ``latency_s`` after its command was sent, with ``in_flight``
        commands out (its own included)."""
        if not math.isfinite(latency_s) or latency_s < 0:
            return
        latency = max(latency_s, 1e-6)
        self.replies += 1
        if self.probing is not None:  # (its latencies are not the recent ones: no queue)
            self._probe(latency, in_flight, now)
            return
        recent = self.recent = (
            latency
            if self.recent is None
            else self.recent + RECENT_WEIGHT * (latency - self.recent)
        )
        if self.replies >= self.probe_at:
            self.probing, self.probe_low, self.probe_replies = self.limit, None, 0
            self._set(self.floor, "probe", "probing: the baseline is measured again", now)
            return
        baseline = self.baseline = latency if self.baseline is None else min(self.baseline, latency)
        gradient = min(1.0, max(0.5, TOLERANCE * baseline / recent))
        limit = self.limit
        if gradient >= 1.0 and in_flight < limit / 2:
            return  # not using what it has: no sign it could use more
        target = limit * gradient + math.sqrt(limit)
        moved = limit + SMOOTHING / math.sqrt(max(1.0, limit)) * (target - limit)
        grew = moved > limit
        why = (
            f"{'grew' if grew else 'shrank'}: replies take {recent * 1000:.1f} ms, "
            f"the baseline is {baseline * 1000:.1f} ms (gradient {gradient:.2f})"
        )
        self._set(moved, "latency_held" if grew else "latency_rose", why, now)

    def _probe(self, latency: float, in_flight: int, now: float) -> None:
        if in_flight > self.floor:
            return  # still draining to the floor: a queue may be in this latency
        low = self.probe_low = latency if self.probe_low is None else min(self.probe_low, latency)
        self.probe_replies += 1
        if self.probe_replies < PROBE_REPLIES:
            return
        back = self.probing
        assert back is not None
        self.baseline, self.probing, self.probe_at = low, None, self.replies + PROBE_EVERY
        self._set(back, "probe", f"probed: the baseline is {low * 1000:.1f} ms", now)

    def timed_out(self, now: float) -> None:
        """An attempt sent through the gate timed out, unanswered."""
        self.timeouts += 1
        if self.probing is not None:  # no probe under timeouts: it stays down, and lower
            self.probing, self.probe_at = None, self.replies + PROBE_EVERY
        self._set(self.limit * BACKOFF, "timeout", "shrank: a reply timed out", now)

    def _set(self, limit: float, cause: str, why: str, now: float | None) -> None:
        before = self.value
        self.limit = min(float(self.max_limit), max(float(self.min_limit), limit))
        if self.value != before:
            self.cause, self.reason, self.moved_at = cause, why, now
