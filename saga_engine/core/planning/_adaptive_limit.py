"""An adaptive concurrency limit (``FlowLimit(concurrency="adaptive")``), fed by what flow
control observes of a participant (each reply's latency from its command's send, each
attempt that timed out), in one of two algorithms (``FlowLimit.algorithm``), both a
``LatencyLimit``: ``AdaptiveLimit``, a gradient limit in the style of Netflix's
concurrency-limits (the default, ``"gradient"``), and ``AimdLimit`` (``"aimd"``).

No I/O and no clock: ``observe`` and ``timed_out`` take ``now``, so a limit is a
function of what it was told (``tests/internal/property/test_adaptive_limit.py``,
``test_aimd_limit.py``).

The gradient limit:

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

The AIMD limit (additive increase, multiplicative decrease), simpler and slower to grow:

- **Each reply** adds ``1 / limit`` (one per round trip) while latency holds (the
  recent latency, as above, within ``AIMD_RISE`` = 2 x the baseline) and the limit is
  used (at least half of it in flight).
- **A rise**: the recent latency above 2 x the baseline cuts it by a tenth, at most once
  per round trip (a limit's worth of replies), so the replies already on their way back
  from before a cut do not cut it again.
- **Each timeout** cuts it by a tenth, as the gradient's.
- **Baseline without a probe**: the lowest latency seen, relearnt upward every
  ``AIMD_WINDOW`` (1,000) replies from the lowest of that window, but only when that
  reply had no more commands in flight than the baseline's (or the minimum): a
  latency that rose with the commands in flight is a queue, which must not become the
  baseline (the limit would then grow without end), while a participant slower for good
  is slower also once its cuts bring the commands in flight down. On a participant that
  serves *C* at once in a steady time it settles between about 1.5 and 2 x *C*.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Protocol

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


class LatencyLimit(Protocol):
    """What flow control asks of an adaptive limit, whatever its algorithm."""

    @property
    def algorithm(self) -> Literal["gradient", "aimd"]: ...

    @property
    def value(self) -> int:
        """The commands it lets be in flight now."""
        ...

    @property
    def min_limit(self) -> int: ...

    @property
    def max_limit(self) -> int: ...

    @property
    def baseline(self) -> float | None:
        """A reply's latency with no queue, in seconds (None: no reply yet)."""
        ...

    @property
    def recent(self) -> float | None:
        """The recent replies' average latency, in seconds."""
        ...

    @property
    def cause(self) -> str: ...

    @property
    def reason(self) -> str: ...

    @property
    def moved_at(self) -> float | None: ...

    @property
    def replies(self) -> int: ...

    @property
    def timeouts(self) -> int: ...

    def observe(self, latency_s: float, in_flight: int, now: float) -> None:
        """A reply came ``latency_s`` after its command was sent, with ``in_flight``
        commands out (its own included)."""
        ...

    def timed_out(self, now: float) -> None:
        """An attempt sent through the gate timed out, unanswered."""
        ...

    def bound(self, min_limit: int, max_limit: int) -> None:
        """New bounds (this engine's share changed); the limit is kept within them."""
        ...


def latency_limit(algorithm: str | None, min_limit: int, max_limit: int) -> LatencyLimit:
    """An adaptive limit of ``algorithm`` (``FlowLimit.algorithm``; None: gradient)."""
    if algorithm == "aimd":
        return AimdLimit(min_limit, max_limit)
    return AdaptiveLimit(min_limit, max_limit)


@dataclass(slots=True)
class _BoundedLimit:
    """What both algorithms keep: the limit within its bounds, the latencies, and why
    it last moved."""

    min_limit: int
    max_limit: int
    limit: float = 0.0
    baseline: float | None = None
    recent: float | None = None
    #: Why the limit last moved, in words (with the figures)...
    reason: str = "starting at the minimum"
    #: ...and as one of "start", "latency_held", "latency_rose", "timeout", "probe"
    #: (the gradient's only), "bounds".
    cause: str = "start"
    #: When it last moved (the ``now`` it was told), None: never.
    moved_at: float | None = None
    replies: int = 0
    timeouts: int = 0

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

    def bound(self, min_limit: int, max_limit: int) -> None:
        """New bounds (this engine's share changed); the limit is kept within them."""
        self.min_limit, self.max_limit = min_limit, max(min_limit, max_limit)
        self._set(self.limit, "bounds", "bounds changed (this engine's share)", self.moved_at)

    def _replied(self, latency_s: float) -> float | None:
        """Counts a reply whose latency is a number (at least a microsecond); None: not
        one to learn from (NaN, infinite, negative)."""
        if not math.isfinite(latency_s) or latency_s < 0:
            return None
        self.replies += 1
        return max(latency_s, 1e-6)

    def _recent(self, latency: float) -> float:
        """The recent latency, with this reply's."""
        recent = self.recent
        recent = self.recent = (
            latency if recent is None else recent + RECENT_WEIGHT * (latency - recent)
        )
        return recent

    def _set(self, limit: float, cause: str, why: str, now: float | None) -> None:
        before = self.value
        self.limit = min(float(self.max_limit), max(float(self.min_limit), limit))
        if self.value != before:
            self.cause, self.reason, self.moved_at = cause, why, now


@dataclass(slots=True)
class AdaptiveLimit(_BoundedLimit):
    """One gate's adaptive concurrency by the gradient; see the module docstring."""

    #: The replies at which the next probe starts.
    probe_at: int = PROBE_EVERY
    #: While probing: the limit to go back to, and the lowest latency measured so far.
    probing: float | None = None
    probe_low: float | None = None
    probe_replies: int = 0

    @property
    def algorithm(self) -> Literal["gradient"]:
        return "gradient"

    @property
    def floor(self) -> int:
        return min(self.max_limit, max(self.min_limit, _FLOOR))

    def observe(self, latency_s: float, in_flight: int, now: float) -> None:
        """A reply came ``latency_s`` after its command was sent, with ``in_flight``
        commands out (its own included)."""
        latency = self._replied(latency_s)
        if latency is None:
            return
        if self.probing is not None:  # (its latencies are not the recent ones: no queue)
            self._probe(latency, in_flight, now)
            return
        recent = self._recent(latency)
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


#: How far above the baseline the recent latency may be before an AIMD limit is cut.
AIMD_RISE = 2.0
#: The replies of an AIMD limit's baseline window.
AIMD_WINDOW = 1000


@dataclass(slots=True)
class AimdLimit(_BoundedLimit):
    """One gate's adaptive concurrency by AIMD; see the module docstring."""

    #: The commands in flight when the baseline was measured.
    baseline_in_flight: int = 0
    #: The lowest latency of the window running, and the commands in flight then.
    window_low: float | None = None
    window_in_flight: int = 0
    #: Replies since the last cut for a rise: the next waits for a limit's worth.
    since_cut: int = 1 << 30

    @property
    def algorithm(self) -> Literal["aimd"]:
        return "aimd"

    def observe(self, latency_s: float, in_flight: int, now: float) -> None:
        """A reply came ``latency_s`` after its command was sent, with ``in_flight``
        commands out (its own included)."""
        latency = self._replied(latency_s)
        if latency is None:
            return
        self.since_cut += 1
        recent = self._recent(latency)
        baseline = self._learn(latency, in_flight)
        limit = self.limit
        if recent > AIMD_RISE * baseline:
            if self.since_cut < self.value:
                return  # cut less than a round trip ago: these replies were out before it
            self.since_cut = 0
            why = (
                f"shrank: replies take {recent * 1000:.1f} ms, above {AIMD_RISE:g} x the "
                f"baseline of {baseline * 1000:.1f} ms"
            )
            self._set(limit * BACKOFF, "latency_rose", why, now)
            return
        if in_flight < limit / 2:
            return  # not using what it has: no sign it could use more
        why = f"grew: replies take {recent * 1000:.1f} ms, the baseline is {baseline * 1000:.1f} ms"
        self._set(limit + 1 / limit, "latency_held", why, now)

    def _learn(self, latency: float, in_flight: int) -> float:
        """The baseline after this reply: lower at once; higher only at a window's end, to
        its lowest, when that reply had no more in flight than the baseline's."""
        if self.baseline is None or latency < self.baseline:
            self.baseline, self.baseline_in_flight = latency, in_flight
        low = self.window_low
        if low is None or latency < low:
            low, self.window_low, self.window_in_flight = latency, latency, in_flight
        if self.replies % AIMD_WINDOW == 0:
            fewer = self.window_in_flight <= max(self.baseline_in_flight, self.min_limit)
            if low > self.baseline and fewer:
                self.baseline, self.baseline_in_flight = low, self.window_in_flight
            self.window_low = None
        return self.baseline

    def timed_out(self, now: float) -> None:
        """An attempt sent through the gate timed out, unanswered."""
        self.timeouts += 1
        self._set(self.limit * BACKOFF, "timeout", "shrank: a reply timed out", now)
