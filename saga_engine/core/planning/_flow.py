"""Flow control's pure core: the gates (a concurrency limit and a token bucket per
participant or saga type) and the queue of commands waiting for them.

No I/O and no clock: every method takes ``now`` (monotonic seconds), so the order the
queue serves in is a function of what was pushed and when, and property tests check it
(``tests/internal/property/test_flow_queue.py``). ``_flow_sender.py`` drives it.

The order, when a gate is closed (docs/operations.md, "Flow control"):

1. **compensations first**: an undo is never queued behind forward work (it still takes
   a permit, so the participant is protected from it too);
2. **the highest level**, where a command's level is its saga's priority plus one for
   every ``aging_s`` seconds it has waited (aging: a low priority is never starved);
3. **fairness** among equal levels: the fairness key (a tenant) served least recently
   goes next, so keys take turns whatever their backlog (round-robin);
4. **FIFO** by arrival among the rest (within one key and priority, always).
"""

from __future__ import annotations

import enum
import math
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from saga_engine.kernel._settings import FlowLimit


class GateKind(enum.Enum):
    PARTICIPANT = "participant"
    SAGA_TYPE = "saga_type"


@dataclass(slots=True)
class Gate:
    """One participant's (or saga type's) limits as this engine enforces them: its share
    of the configured figures, what it has in flight, and its token bucket."""

    kind: GateKind
    name: str
    limit: FlowLimit
    #: This engine's share of the cluster's limits: owned inbox partitions / all of them.
    share: float = 1.0
    in_flight: int = 0
    tokens: float = 0.0
    refilled_at: float | None = None
    waiting: int = 0
    sent: int = 0

    @property
    def concurrency(self) -> int | None:
        """The concurrency this engine may use: ceil(limit x share), 0 with no share."""
        if self.limit.concurrency is None:
            return None
        if self.share <= 0:
            return 0
        return max(1, math.ceil(self.limit.concurrency * self.share))

    @property
    def rate(self) -> float | None:
        if self.limit.rate is None:
            return None
        return self.limit.rate * self.share

    def _capacity(self, rate: float) -> float:
        # A tenth of a second's worth, at least one command: a burst after a quiet spell
        # exceeds the rate by at most 10% in any one-second window.
        return max(1.0, rate / 10)

    def _refill(self, now: float) -> None:
        rate = self.rate
        if rate is None:
            return
        if self.refilled_at is None:
            self.tokens = 1.0
        else:
            elapsed = max(0.0, now - self.refilled_at)
            self.tokens = min(self._capacity(rate), self.tokens + elapsed * rate)
        self.refilled_at = now

    def admits(self, now: float) -> bool:
        """A permit is free (concurrency) and a token is there (rate)."""
        limit = self.concurrency
        if limit is not None and self.in_flight >= limit:
            return False
        if self.rate is not None:
            if self.rate <= 0:
                return False
            self._refill(now)
            return self.tokens >= 1.0
        return True

    def take(self, now: float) -> None:
        self.in_flight += 1
        self.sent += 1
        if self.rate is not None:
            self._refill(now)
            self.tokens -= 1.0

    def give_back(self) -> None:
        self.in_flight = max(0, self.in_flight - 1)

    def next_token_in(self, now: float) -> float | None:
        """Seconds until the bucket holds a token; None when concurrency is what blocks
        (a release wakes the queue then) or when nothing does."""
        rate = self.rate
        if rate is None or rate <= 0:
            return None
        limit = self.concurrency
        if limit is not None and self.in_flight >= limit:
            return None
        self._refill(now)
        return max(0.0, (1.0 - self.tokens) / rate)


@dataclass(slots=True)
class Waiting:
    """A command waiting for its gates. ``lane`` names the gates it needs."""

    seq: int
    arrived: float
    priority: int
    key: str
    lane: Hashable
    urgent: bool = False
    item: Any = None


_Deque = tuple[Hashable, str, int, bool]


@dataclass(slots=True)
class FlowQueue:
    """Waiting commands, by lane, fairness key, priority and urgency; FIFO in each."""

    aging_s: float | None = None
    _fifos: dict[_Deque, deque[Waiting]] = field(default_factory=dict)
    #: The pop count at which each fairness key was last served (round-robin's memory),
    #: kept while the key has entries waiting: a key that comes back after its backlog
    #: emptied counts as never served (it was not hogging), and memory stays bounded by
    #: the keys waiting, however many keys there are.
    _served: dict[str, int] = field(default_factory=dict)
    _waiting_per_key: dict[str, int] = field(default_factory=dict)
    _pops: int = 0
    _len: int = 0

    def __len__(self) -> int:
        return self._len

    def push(self, entry: Waiting, *, front: bool = False) -> None:
        """Queues ``entry`` last in its FIFO (``front``: first, for one put back)."""
        slot = (entry.lane, entry.key, entry.priority, entry.urgent)
        fifo = self._fifos.get(slot)
        if fifo is None:
            fifo = self._fifos[slot] = deque()
        if front:
            fifo.appendleft(entry)
        else:
            fifo.append(entry)
        self._len += 1
        self._waiting_per_key[entry.key] = self._waiting_per_key.get(entry.key, 0) + 1

    def remove(self, entry: Waiting) -> bool:
        slot = (entry.lane, entry.key, entry.priority, entry.urgent)
        fifo = self._fifos.get(slot)
        if fifo is None:
            return False
        try:
            fifo.remove(entry)
        except ValueError:
            return False
        if not fifo:
            del self._fifos[slot]
        self._len -= 1
        left = self._waiting_per_key[entry.key] - 1
        if left:
            self._waiting_per_key[entry.key] = left
        else:
            del self._waiting_per_key[entry.key]
            self._served.pop(entry.key, None)
        return True

    def level(self, entry: Waiting, now: float) -> tuple[bool, int]:
        """(urgent, priority + aging): the larger goes first."""
        aged = 0
        if self.aging_s is not None:
            aged = int(max(0.0, now - entry.arrived) // self.aging_s)
        return entry.urgent, entry.priority + aged

    def pop(self, now: float, admits: Callable[[Hashable], bool]) -> Waiting | None:
        """The entry to serve now among the lanes ``admits`` opens, removed; or None."""
        best: Waiting | None = None
        best_rank: tuple[bool, int, int, int] | None = None
        opened: dict[Hashable, bool] = {}
        for (lane, key, _, _), fifo in self._fifos.items():
            is_open = opened.get(lane)
            if is_open is None:
                is_open = opened[lane] = admits(lane)
            if not is_open:
                continue
            head = fifo[0]
            urgent, level = self.level(head, now)
            # Larger is better: urgency, then level, then the key served longest ago,
            # then the earliest arrival.
            rank = (urgent, level, -self._served.get(key, -1), -head.seq)
            if best_rank is None or rank > best_rank:
                best, best_rank = head, rank
        if best is None:
            return None
        self.remove(best)
        self._pops += 1
        if best.key in self._waiting_per_key:
            self._served[best.key] = self._pops
        return best
