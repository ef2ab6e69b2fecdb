"""Flow control's pure core: the gates (a concurrency limit, fixed or adaptive
(``_adaptive_limit``), a token bucket and a budget of resources per participant or saga
type, in each flow policy) and the queue of commands waiting for them.

A command goes through the gates of its saga's flow policy (``LimitsSettings.policy``),
so its lane (the gates it needs) is of that policy, and fairness is per policy lane.
Where several policies limit the same participant or saga type, each gate enforces its
policy's share of the limits (``Gate.policy_share``, ``_policy_shares``).

No I/O and no clock: every method takes ``now`` (monotonic seconds), so the order the
queue serves in is a function of what was pushed and when, and property tests check it
(``tests/internal/property/test_flow_queue.py``, ``test_flow_budgets.py``).
``_flow_sender.py`` drives it.

The order, when a gate is closed (docs/operations.md, "Flow control"):

1. **compensations first**: an undo is never queued behind forward work (it still takes
   a permit, so the participant is protected from it too);
2. **the highest level**, where a command's level is its saga's priority plus one for
   every ``aging_s`` seconds it has waited (aging: a low priority is never starved);
3. **weighted fairness** among equal levels: in each lane (the gates a command needs),
   the fairness key that has been charged least for what it was sent goes next
   (start-time fair queuing). A key is charged, per command sent, the command's charge
   over the key's weight (``Waiting.weight``: its flow policy's ``fairness_weights``),
   the charge being the command's largest share of its gates (its cost over a budget,
   one over a concurrency limit; one when neither applies): by cost where costs and
   budgets are declared, by count otherwise. A key that comes back after its backlog emptied starts level with
   the lane (it neither banks credit nor pays for its past). Under backlog each key
   gets its weight's share; between two turns of a backlogged key *k* another key *j* is
   served at most ``(w_j / c_j) x (c_k / w_k) + 1`` times (the starvation bound);
4. **FIFO** by arrival among the rest (within one key and priority, always; a command
   with no cost may pass one waiting for a budget).

**Budgets**: a command with a cost is sent only while it fits every budget of its gates
(in use plus its cost within this engine's share; alone on a resource it always fits,
so a share never holds a command that fits the whole budget for ever). The order above
is kept under budgets: a command that does not fit holds what it needs of its gates'
budgets, so nothing ranked after it that costs any of those resources is sent before it
(small commands never starve a large one); commands that cost none of them go past it.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from collections.abc import Callable, Container, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from saga_engine.core.history._cost import Cost
from saga_engine.core.planning._adaptive_limit import LatencyLimit, latency_limit
from saga_engine.kernel._settings import FlowLimit

#: Sums of float costs drift: an amount this close to a budget (or to 0) is on it.
_EPSILON = 1e-9


class GateKind(enum.Enum):
    PARTICIPANT = "participant"
    SAGA_TYPE = "saga_type"


@dataclass(slots=True)
class Gate:
    """One participant's (or saga type's) limits in one flow policy as this engine
    enforces them: its share of the configured figures, what it has in flight, and its
    token bucket."""

    kind: GateKind
    name: str
    limit: FlowLimit
    #: This engine's share of the cluster's limits: owned inbox partitions / all of them,
    #: times ``policy_share``.
    share: float = 1.0
    in_flight: int = 0
    tokens: float = 0.0
    refilled_at: float | None = None
    waiting: int = 0
    sent: int = 0
    #: What the commands in flight hold of its budget: the sum of their costs, per
    #: resource of the budget (a resource at 0 is left out).
    in_use: dict[str, float] = field(default_factory=dict)
    #: Its concurrency when it adapts (``concurrency="adaptive"``, by the limit's
    #: ``algorithm``), else None.
    adaptive: LatencyLimit | None = None
    #: The flow policy (``LimitsSettings.policies``) whose limits these are.
    policy: int = 1
    #: The policy's share of the limits where several policies limit the same name (its
    #: share of their recent arrivals, ``_policy_shares``); 1 where it alone does.
    policy_share: float = 1.0
    #: Commands that came to it since ``_policy_shares`` last counted them.
    arrived: int = 0

    def __post_init__(self) -> None:
        if self.limit.concurrency == "adaptive" and self.adaptive is None:
            low, high = self._adaptive_bounds()
            self.adaptive = latency_limit(self.limit.algorithm, low, high)

    def _adaptive_bounds(self) -> tuple[int, int]:
        low, high = self.limit.adaptive_bounds
        share = max(self.share, 0.0)
        return max(1, math.ceil(low * share)), max(1, math.ceil(high * share))

    def set_share(self, share: float, policy_share: float | None = None) -> None:
        """This engine's partition share of the limits, and its policy's share of them
        (None: as it was); an adaptive limit's bounds follow."""
        if policy_share is not None:
            self.policy_share = policy_share
        self.share = share * self.policy_share
        adaptive = self.adaptive
        if adaptive is not None:
            low, high = self._adaptive_bounds()
            if (low, high) != (adaptive.min_limit, adaptive.max_limit):
                adaptive.bound(low, high)

    @property
    def concurrency(self) -> int | None:
        """The concurrency this engine may use: ceil(limit x share), 0 with no share; an
        adaptive limit's current value."""
        concurrency = self.limit.concurrency
        if concurrency is None:
            return None
        if self.share <= 0:
            return 0
        if self.adaptive is not None:
            return self.adaptive.value
        assert isinstance(concurrency, int)
        return max(1, math.ceil(concurrency * self.share))

    @property
    def rate(self) -> float | None:
        if self.limit.rate is None:
            return None
        return self.limit.rate * self.share

    @property
    def budget(self) -> dict[str, float] | None:
        """The budget this engine may use: each amount x share."""
        if self.limit.budget is None:
            return None
        return {r: amount * self.share for r, amount in self.limit.budget.items()}

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
        if self.share <= 0:
            return False
        limit = self.concurrency
        if limit is not None and self.in_flight >= limit:
            return False
        if self.rate is not None:
            if self.rate <= 0:
                return False
            self._refill(now)
            return self.tokens >= 1.0
        return True

    def fits(self, cost: Cost, held: Container[Hashable] = ()) -> bool:
        """``cost`` fits its budget now: for each resource of both, in use plus the cost
        within this engine's share (or nothing of it in use), and not ``held`` for a
        command ranked before it (``(policy, kind, name, resource)``)."""
        budget = self.limit.budget
        if budget is None:
            return True
        for resource, amount in cost.items():
            whole = budget.get(resource)
            if whole is None:
                continue
            if held and (self.policy, self.kind, self.name, resource) in held:
                return False
            used = self.in_use.get(resource)
            if used is not None and used + amount > whole * self.share + _EPSILON:
                return False
        return True

    def hold(self, cost: Cost, held: set[Hashable]) -> None:
        """Marks what ``cost`` needs of the budget as ``held`` for it."""
        budget = self.limit.budget
        if budget is not None:
            held.update((self.policy, self.kind, self.name, r) for r in cost if r in budget)

    def take(self, now: float, cost: Cost | None = None) -> None:
        self.in_flight += 1
        self.sent += 1
        if self.rate is not None:
            self._refill(now)
            self.tokens -= 1.0
        budget = self.limit.budget
        if cost is not None and budget is not None:
            in_use = self.in_use
            for resource, amount in cost.items():
                if resource in budget:
                    in_use[resource] = in_use.get(resource, 0.0) + amount

    def give_back(self, cost: Cost | None = None) -> None:
        self.in_flight = max(0, self.in_flight - 1)
        if cost is not None and self.limit.budget is not None:
            in_use = self.in_use
            for resource, amount in cost.items():
                used = in_use.get(resource)
                if used is None:
                    continue
                if used - amount > _EPSILON:
                    in_use[resource] = used - amount
                else:
                    del in_use[resource]

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


def charge_of(cost: Cost | None, gates: Iterable[Gate]) -> float:
    """What sending a command costs its fairness key (weighted fairness, by cost where
    costs and budgets are declared, by count otherwise): its largest share of its
    gates' whole limits (its cost over each budget, one over a concurrency limit); 1
    when neither applies."""
    charge = 0.0
    for gate in gates:
        limit = gate.limit
        concurrency = limit.concurrency
        if concurrency == "adaptive":
            charge = max(charge, 1 / limit.adaptive_bounds[1])
        elif concurrency is not None:
            charge = max(charge, 1 / concurrency)
        budget = limit.budget
        if cost is not None and budget is not None:
            for resource, amount in cost.items():
                whole = budget.get(resource)
                if whole is not None:
                    charge = max(charge, amount / whole)
    return charge or 1.0


class Budgets(Protocol):
    """What the queue asks of the gates of a lane about a command's cost."""

    def fits(self, lane: Hashable, cost: Cost, held: Container[Hashable]) -> bool: ...

    def hold(self, lane: Hashable, cost: Cost, held: set[Hashable]) -> None: ...


@dataclass(frozen=True, slots=True)
class GateBudgets:
    """``Budgets`` over gates by id, a lane being the tuple of its gates' ids."""

    gates: Mapping[Any, Gate]

    def fits(self, lane: Hashable, cost: Cost, held: Container[Hashable]) -> bool:
        assert isinstance(lane, tuple)
        gates = self.gates
        return all(gates[g].fits(cost, held) for g in lane)

    def hold(self, lane: Hashable, cost: Cost, held: set[Hashable]) -> None:
        assert isinstance(lane, tuple)
        for g in lane:
            self.gates[g].hold(cost, held)


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
    #: What it holds of its gates' budgets once sent (None: nothing).
    cost: Cost | None = None
    #: What sending it charges its fairness key (``charge_of``).
    charge: float = 1.0
    #: Its fairness key's weight in its flow policy (``FlowPolicy.weight_of``).
    weight: float = 1.0


@dataclass(slots=True)
class _Turns:
    """Weighted fairness in one lane (start-time fair queuing): each key's pass, the
    charges it was sent over its weight, and the lane's virtual time, the pass of the
    last key served. Kept while the lane has entries waiting."""

    vtime: float = 0.0
    passes: dict[str, float] = field(default_factory=dict)
    waiting: dict[str, int] = field(default_factory=dict)

    def lag(self, key: str) -> float:
        return self.passes[key] - self.vtime


_Fifo = tuple[Hashable, str, int, bool, bool]
_Rank = tuple[bool, int, float, int]


@dataclass(slots=True)
class FlowQueue:
    """Waiting commands, by lane, fairness key, priority, urgency and whether they cost
    anything; FIFO in each."""

    aging_s: float | None = None
    _fifos: dict[_Fifo, deque[Waiting]] = field(default_factory=dict)
    _turns: dict[Hashable, _Turns] = field(default_factory=dict)
    _len: int = 0

    def __len__(self) -> int:
        return self._len

    def push(self, entry: Waiting, *, front: bool = False) -> None:
        """Queues ``entry`` last in its FIFO (``front``: first, for one put back)."""
        slot = (entry.lane, entry.key, entry.priority, entry.urgent, entry.cost is not None)
        fifo = self._fifos.get(slot)
        if fifo is None:
            fifo = self._fifos[slot] = deque()
        if front:
            fifo.appendleft(entry)
        else:
            fifo.append(entry)
        self._len += 1
        turns = self._turns.get(entry.lane)
        if turns is None:
            turns = self._turns[entry.lane] = _Turns()
        key = entry.key
        waiting = turns.waiting.get(key, 0)
        if not waiting:  # (back) in the lane: level with it, or behind for its past
            turns.passes[key] = max(turns.passes.get(key, turns.vtime), turns.vtime)
        turns.waiting[key] = waiting + 1

    def remove(self, entry: Waiting) -> bool:
        slot = (entry.lane, entry.key, entry.priority, entry.urgent, entry.cost is not None)
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
        self._left(entry)
        return True

    def _left(self, entry: Waiting) -> None:
        turns = self._turns[entry.lane]
        key = entry.key
        left = turns.waiting[key] - 1
        if left:
            turns.waiting[key] = left
            return
        del turns.waiting[key]
        if not turns.waiting:
            del self._turns[entry.lane]  # nothing waits in the lane: nobody owes anything
            return
        if turns.passes[key] <= turns.vtime:
            del turns.passes[key]
        if len(turns.passes) > 2 * len(turns.waiting) + 16:
            # Keys gone idle that are not ahead of the lane would start level anyway.
            vtime = turns.vtime
            turns.passes = {
                k: p for k, p in turns.passes.items() if k in turns.waiting or p > vtime
            }

    def level(self, entry: Waiting, now: float) -> tuple[bool, int]:
        """(urgent, priority + aging): the larger goes first."""
        aged = 0
        if self.aging_s is not None:
            aged = int(max(0.0, now - entry.arrived) // self.aging_s)
        return entry.urgent, entry.priority + aged

    def rank(self, entry: Waiting, now: float) -> _Rank:
        """Larger is served first: urgency, level, the key least charged in its lane
        (its lag behind the lane's virtual time), the earliest arrival."""
        urgent, level = self.level(entry, now)
        return urgent, level, -self._turns[entry.lane].lag(entry.key), -entry.seq

    def pop(
        self, now: float, admits: Callable[[Hashable], bool], budgets: Budgets | None = None
    ) -> Waiting | None:
        """The entry to serve now among the lanes ``admits`` opens (and, for an entry
        with a cost, whose ``budgets`` it fits), removed; or None."""
        best: Waiting | None = None
        best_rank: _Rank | None = None
        blocked: list[_Rank] = []
        opened: dict[Hashable, bool] = {}
        for slot, fifo in self._fifos.items():
            lane = slot[0]
            is_open = opened.get(lane)
            if is_open is None:
                is_open = opened[lane] = admits(lane)
            if not is_open:
                continue
            head = fifo[0]
            rank = self.rank(head, now)
            if best_rank is not None and rank <= best_rank:
                continue
            cost = head.cost
            if budgets is not None and cost is not None and not budgets.fits(lane, cost, ()):
                blocked.append(rank)
                continue
            best, best_rank = head, rank
        if budgets is not None and any(best_rank is None or r > best_rank for r in blocked):
            # A command ranked before the best does not fit: it holds what it needs.
            best = self._in_rank_order(now, opened, budgets)
        if best is None:
            return None
        self._serve(best)
        return best

    def _in_rank_order(
        self, now: float, opened: dict[Hashable, bool], budgets: Budgets
    ) -> Waiting | None:
        """The first entry in rank order that fits, each one before it that does not
        holding what it needs of its budgets."""
        heads = [fifo[0] for slot, fifo in self._fifos.items() if opened.get(slot[0])]
        heads.sort(key=lambda head: self.rank(head, now), reverse=True)
        held: set[Hashable] = set()
        for head in heads:
            if head.cost is None or budgets.fits(head.lane, head.cost, held):
                return head
            budgets.hold(head.lane, head.cost, held)
        return None

    def _serve(self, entry: Waiting) -> None:
        turns = self._turns[entry.lane]
        start = turns.passes[entry.key]
        turns.vtime = max(turns.vtime, start)
        turns.passes[entry.key] = start + entry.charge / entry.weight
        self.remove(entry)
