"""Budgets and weighted fairness (``_flow.py``) under generated work: the queue and real
gates driven as the flow sender drives them (pop what the gates admit, take, give back
when an attempt is over), commands answered in a generated order.

- never over budget: the costs in flight stay within this engine's share of every
  budget (a command alone on a resource excepted: it fits the whole budget);
- weighted shares: under backlog each fairness key is sent its weight's share of the
  gate, by cost where there are budgets and by count otherwise, within 10 %;
- no starvation: between two turns of a backlogged key another key is served at most
  ``(w_j / c_j) x (c_k / w_k) + 1`` times; nothing ranked after a command waiting for a
  budget takes what it waits for; a large command is sent under a stream of small ones.
"""

from __future__ import annotations

import random
from collections.abc import Hashable
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from saga_engine.core.history._cost import Cost
from saga_engine.core.planning._flow import (
    FlowQueue,
    Gate,
    GateBudgets,
    GateKind,
    Waiting,
    charge_of,
)
from saga_engine.kernel._settings import FlowLimit

GATE = (GateKind.PARTICIPANT, "p")
LANE = (GATE,)
EPSILON = 1e-6


@dataclass
class World:
    """One gate, its queue, and the commands in flight."""

    limit: FlowLimit
    weights: dict[str, float] = field(default_factory=dict)
    aging_s: float | None = None
    share: float = 1.0
    now: float = 0.0
    seq: int = 0
    in_flight: list[Waiting] = field(default_factory=list)
    served: list[Waiting] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.gate = Gate(GateKind.PARTICIPANT, "p", self.limit, share=self.share)
        self.gates = {GATE: self.gate}
        self.budgets = GateBudgets(self.gates) if self.limit.budget else None
        self.queue = FlowQueue(aging_s=self.aging_s)

    def weight(self, key: str) -> float:
        return self.weights.get(key, 1.0)

    def push(self, key: str, cost: Cost | None, priority: int = 0) -> Waiting:
        self.seq += 1
        counted = cost if self.budgets is not None else None
        entry = Waiting(
            self.seq,
            self.now,
            priority,
            key,
            LANE,
            cost=counted,
            charge=charge_of(counted, [self.gate]),
            weight=self.weight(key),
        )
        self.queue.push(entry)
        return entry

    def dispatch(self) -> list[Waiting]:
        sent: list[Waiting] = []
        while True:
            entry = self.queue.pop(self.now, lambda lane: self.gate.admits(self.now), self.budgets)
            if entry is None:
                return sent
            self.gate.take(self.now, entry.cost)
            self.in_flight.append(entry)
            self.served.append(entry)
            sent.append(entry)
            self.check_budget()

    def answer(self, index: int) -> None:
        entry = self.in_flight.pop(index % len(self.in_flight))
        self.gate.give_back(entry.cost)

    def check_budget(self) -> None:
        budget = self.gate.budget or {}
        for resource, whole in budget.items():
            holders = [e for e in self.in_flight if e.cost and e.cost.get(resource)]
            used = sum(e.cost[resource] for e in holders if e.cost is not None)
            assert abs(self.gate.in_use.get(resource, 0.0) - used) < EPSILON
            if len(holders) > 1:
                assert used <= whole + EPSILON, (resource, used, whole)
        limit = self.gate.concurrency
        if limit is not None:
            assert len(self.in_flight) <= limit


costs = st.one_of(
    st.none(),
    st.builds(
        lambda cpu, mem: Cost(cpu=cpu, memory_mb=mem),
        st.integers(0, 16),
        st.sampled_from([0, 128, 512, 1024]),
    ),
)


@dataclass(frozen=True)
class Push:
    key: str
    cost: Cost | None
    priority: int


@dataclass(frozen=True)
class Answer:
    index: int


ops = st.lists(
    st.one_of(
        st.builds(Push, st.sampled_from(["a", "b", "c"]), costs, st.integers(0, 3)),
        st.builds(Answer, st.integers(0, 50)),
    ),
    max_size=80,
)


def apply(world: World, op: Push | Answer) -> Waiting | None:
    """One generated step, half a second after the last: a push (the entry), or the
    answer of a command in flight."""
    world.now += 0.5
    if isinstance(op, Push):
        return world.push(op.key, op.cost, op.priority)
    if world.in_flight:
        world.answer(op.index)
    return None


@settings(max_examples=200, deadline=None)
@given(
    steps=ops,
    share=st.sampled_from([1.0, 0.5, 0.25]),
    concurrency=st.one_of(st.none(), st.integers(1, 6)),
)
def test_the_costs_in_flight_never_exceed_a_budget(
    steps: list[Push | Answer], share: float, concurrency: int | None
) -> None:
    world = World(
        FlowLimit(budget={"cpu": 16, "memory_mb": 2048}, concurrency=concurrency),
        weights={"a": 3.0},
        aging_s=2.0,
        share=share,
    )
    for op in steps:
        apply(world, op)
        world.dispatch()
    while len(world.queue) or world.in_flight:  # everything is sent in the end
        if world.in_flight:
            world.answer(0)
        world.dispatch()
    assert len(world.served) == sum(1 for op in steps if isinstance(op, Push))


# --------------------------------------------------------------------------- shares


backlogs = st.lists(
    st.tuples(st.integers(1, 5), st.sampled_from([None, 1, 2, 4, 8])),  # (weight, cpu)
    min_size=2,
    max_size=4,
)


def backlogged(
    keys: list[tuple[int, int | None]], by_cost: bool, seed: int, services: int
) -> tuple[World, dict[str, float]]:
    """Every key with far more waiting than is served; commands answered in a random
    order. Returns the world and each key's expected share."""
    limit = FlowLimit(budget={"cpu": 16}) if by_cost else FlowLimit(concurrency=3)
    names = [f"k{i}" for i in range(len(keys))]
    world = World(limit, weights={n: float(w) for n, (w, _) in zip(names, keys, strict=True)})
    for _ in range(services + 20):
        for name, (_, cpu) in zip(names, keys, strict=True):
            world.push(name, Cost(cpu=cpu or 1) if by_cost else None)
    rng = random.Random(seed)
    world.dispatch()
    while len(world.served) < services:
        world.answer(rng.randrange(len(world.in_flight)))
        world.dispatch()
    total = sum(w for w, _ in keys)
    return world, {n: w / total for n, (w, _) in zip(names, keys, strict=True)}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(keys=backlogs, by_cost=st.booleans(), seed=st.integers(0, 2**16))
def test_under_backlog_each_key_gets_its_weighted_share(
    keys: list[tuple[int, int | None]], by_cost: bool, seed: int
) -> None:
    services = 1000
    world, expected = backlogged(keys, by_cost, seed, services)
    sent = world.served[:services]
    # By cost where there are budgets (a command's charge is its share of the budget),
    # by count otherwise.
    got: dict[str, float] = {}
    for entry in sent:
        got[entry.key] = got.get(entry.key, 0.0) + entry.charge
    total = sum(got.values())
    for name, share in expected.items():
        assert abs(got.get(name, 0.0) / total - share) <= 0.1 * share, (name, got, expected)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(keys=backlogs, by_cost=st.booleans(), seed=st.integers(0, 2**16))
def test_a_backlogged_key_waits_a_bounded_number_of_turns(
    keys: list[tuple[int, int | None]], by_cost: bool, seed: int
) -> None:
    world, _ = backlogged(keys, by_cost, seed, 300)
    charge = {e.key: e.charge for e in world.served}
    weight = world.weight
    last: dict[str, int] = {}
    since: dict[str, dict[str, int]] = {k: {} for k in charge}
    for i, entry in enumerate(world.served):
        k = entry.key
        if k in last:
            for j, count in since[k].items():
                bound = (weight(j) / charge[j]) * (charge[k] / weight(k)) + 1
                assert count <= bound + EPSILON, (k, j, count, bound)
        last[k] = i
        since[k] = {}
        for other in since:
            if other != k:
                since[other][k] = since[other].get(k, 0) + 1


# --------------------------------------------------------------------------- holds


def shares_a_resource(a: Cost, b: Cost, budget: dict[str, float]) -> bool:
    return any(r in budget and r in b for r in a)


@settings(max_examples=200, deadline=None)
@given(steps=ops)
def test_nothing_ranked_after_a_command_waiting_for_a_budget_takes_what_it_waits_for(
    steps: list[Push | Answer],
) -> None:
    world = World(FlowLimit(budget={"cpu": 16, "memory_mb": 2048}), aging_s=3.0)
    budget = world.limit.budget or {}
    waiting: list[Waiting] = []
    for op in steps:
        pushed = apply(world, op)
        if pushed is not None:
            waiting.append(pushed)
        while True:
            ranks = {e.seq: world.queue.rank(e, world.now) for e in waiting}
            sent = world.queue.pop(world.now, lambda lane: True, world.budgets)
            if sent is None:
                break
            waiting.remove(sent)
            if sent.cost:
                for other in waiting:
                    if other.cost and shares_a_resource(other.cost, sent.cost, budget):
                        assert ranks[other.seq] < ranks[sent.seq], (sent, other)
            world.gate.take(world.now, sent.cost)
            world.in_flight.append(sent)


@settings(max_examples=100, deadline=None)
@given(
    small=st.integers(1, 4),
    large=st.integers(8, 16),
    same_key=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_a_large_command_is_sent_under_a_stream_of_small_ones(
    small: int, large: int, same_key: bool, seed: int
) -> None:
    """A budget of 16 kept busy by small commands, two arriving per answer: a large
    one arriving among them is sent after a bounded number of them."""
    world = World(FlowLimit(budget={"cpu": 16}))
    rng = random.Random(seed)
    for _ in range(20):
        world.push("small", Cost(cpu=small))
    world.dispatch()
    big = world.push("small" if same_key else "large", Cost(cpu=large))
    before = len(world.served)
    for _ in range(200):
        world.push("small", Cost(cpu=small))
        world.push("small", Cost(cpu=small))
        world.answer(rng.randrange(len(world.in_flight)))
        world.dispatch()
        if big in world.served:
            break
    assert big in world.served
    # What was waiting before it (same key, FIFO) or its fair turns, plus what fits.
    overtook = world.served.index(big) - before
    assert overtook <= 20 + 16 // small + 1, overtook


def test_a_charge_is_the_largest_share_and_a_hold_names_the_budgeted_resources() -> None:
    """A command is charged its largest share of its gates (by count without a budget or
    a concurrency limit); a hold keeps only what a budget has, from what costs any."""
    gate = Gate(GateKind.PARTICIPANT, "p", FlowLimit(rate=5))
    assert charge_of(Cost(cpu=4), [gate]) == 1.0
    budgeted = Gate(GateKind.PARTICIPANT, "q", FlowLimit(budget={"cpu": 8}, concurrency=4))
    assert charge_of(Cost(cpu=4), [budgeted]) == 0.5
    assert charge_of(None, [budgeted]) == 0.25
    held: set[Hashable] = set()
    budgeted.hold(Cost(cpu=1, gpu=1), held)
    assert held == {(1, GateKind.PARTICIPANT, "q", "cpu")}  # (policy, kind, name, resource)
    assert not budgeted.fits(Cost(cpu=1), held)
    assert budgeted.fits(Cost(gpu=1), held)
