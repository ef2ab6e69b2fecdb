"""The flow-control queue (``_flow.FlowQueue``) under generated pushes and pops: the
order it serves in is the documented one (docs/operations.md, "Flow control").

After every pop, against the entries still waiting:
- urgent (compensations) first;
- the highest level (priority + one per ``aging_s`` waited) first;
- among equal levels, the fairness key charged least for what it was sent, over its
  weight (each entry's, given at its push: ``Waiting.weight``; start-time fair queuing: a key coming back after its backlog emptied starts
  level with the lane, and nothing is owed once the lane is empty), kept by an oracle;
- FIFO within one key and priority;
- the aging bound: nothing that arrived more than ``(p_x - p_y + 1) * aging_s`` after
  a waiting entry y is served before it (so a low priority is never starved by a
  stream of higher ones).
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from saga_engine.core.planning._flow import FlowQueue, Waiting

AGING_S = 2.0


@dataclass(frozen=True)
class Push:
    dt: float
    priority: int
    key: str
    urgent: bool


@dataclass(frozen=True)
class Pop:
    dt: float


ops = st.lists(
    st.one_of(
        st.builds(
            Push,
            st.floats(0, 3),
            st.integers(0, 4),
            st.sampled_from(["a", "b", "c"]),
            st.sampled_from([False, False, False, True]),  # a compensation, now and then
        ),
        st.builds(Pop, st.floats(0, 3)),
    ),
    max_size=60,
)


WEIGHTS = {"a": 1.0, "b": 2.0, "c": 3.0}


class Turns:
    """The oracle of weighted fairness: each key's pass and the lane's virtual time."""

    def __init__(self) -> None:
        self.vtime = 0.0
        self.passes: dict[str, float] = {}

    def joined(self, key: str) -> None:
        self.passes[key] = max(self.passes.get(key, self.vtime), self.vtime)

    def served(self, key: str, waiting_keys: set[str]) -> None:
        start = self.passes[key]
        self.vtime = max(self.vtime, start)
        self.passes[key] = start + 1 / WEIGHTS[key]
        if not waiting_keys:
            self.vtime, self.passes = 0.0, {}
        elif key not in waiting_keys and self.passes[key] <= self.vtime:
            del self.passes[key]


def run(steps: list[Push | Pop], aging_s: float | None) -> None:
    queue = FlowQueue(aging_s=aging_s)
    waiting: list[Waiting] = []
    now = 0.0
    seq = 0
    turns = Turns()
    for step in [*steps, *[Pop(0.0)] * 70]:
        now += step.dt
        if isinstance(step, Push):
            seq += 1
            entry = Waiting(
                seq, now, step.priority, step.key, "lane", step.urgent, weight=WEIGHTS[step.key]
            )
            if not any(w.key == step.key for w in waiting):
                turns.joined(step.key)
            queue.push(entry)
            waiting.append(entry)
            continue
        got = queue.pop(now, lambda lane: True)
        if not waiting:
            assert got is None
            continue
        assert got is not None
        waiting.remove(got)
        mine = queue.level(got, now)
        for other in waiting:
            theirs = queue.level(other, now)
            assert theirs <= mine, (got, other)
            if theirs == mine:
                # Fairness: the key charged least went; then FIFO.
                assert turns.passes[other.key] >= turns.passes[got.key]
                if turns.passes[other.key] == turns.passes[got.key]:
                    assert other.seq > got.seq
            same_class = (other.key, other.priority, other.urgent) == (
                got.key,
                got.priority,
                got.urgent,
            )
            if same_class:
                assert other.seq > got.seq  # FIFO within a key and priority
            if aging_s is not None and not got.urgent and not other.urgent:
                # The aging bound.
                window = (got.priority - other.priority + 1) * aging_s
                assert not got.arrived - other.arrived > window, (got, other)
        turns.served(got.key, {w.key for w in waiting})
    assert len(queue) == 0


@settings(max_examples=300, deadline=None)
@given(ops)
def test_the_queue_serves_in_the_documented_order_with_aging(steps: list[Push | Pop]) -> None:
    run(steps, AGING_S)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_the_queue_serves_in_the_documented_order_without_aging(
    steps: list[Push | Pop],
) -> None:
    run(steps, None)


def test_a_low_priority_is_served_under_a_constant_stream_of_higher_ones() -> None:
    """One pop per second, two high-priority arrivals per second: the backlog of highs
    grows for ever, and the low one is still served, within the bound."""
    queue = FlowQueue(aging_s=1.0)
    low = Waiting(0, 0.0, 0, "", "lane")
    queue.push(low)
    seq = 0
    for tick in range(1, 100):
        for half in (0.0, 0.5):
            seq += 1
            queue.push(Waiting(seq, tick + half - 1, 3, "", "lane"))
        got = queue.pop(float(tick), lambda lane: True)
        assert got is not None
        if got is low:
            # Served before any high that came more than (3 - 0 + 1) x 1 s after it.
            assert tick <= 10
            return
    raise AssertionError("the low priority was starved")
