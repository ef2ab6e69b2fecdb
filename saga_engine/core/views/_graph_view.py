"""A graph saga's declared graph as operators see it: each node's state in one saga, and
each node's latency over a window of runs.

One saga (:func:`graph_state`): from its view (``_view.saga_view_of``: the timeline's
segments and the compensations still owed, the one fold of history) and its history's
``node_skipped`` events, each declared node is pending, running, done, skipped, failed,
stopped, stuck (an operator is needed), undoing or undone (:class:`NodeState`), with
when its work began and ended and its latency (from its first command to the reply that
ended it, retries and back-offs included). A fan-out (``each``) is its item steps
(``name[i]``) taken together: its state is the one that matters most among them, with
how many items are in each state.

A window of runs (:func:`graph_insight`): each declared node's latency percentiles from
the insights' aggregates (``_insights``); a fan-out's from its items'.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Final

from saga_engine.core.authoring._definition import SagaDefinition
from saga_engine.core.authoring._graph import Graph, GraphNode, fan_out_item
from saga_engine.core.history._events import Event, NodeSkipped
from saga_engine.core.history._status import SagaStatus
from saga_engine.core.views._insight_report import percentiles
from saga_engine.core.views._insights import Counters
from saga_engine.core.views._segments import Lane, Segment
from saga_engine.core.views._view_model import OwedState, SagaView
from saga_engine.kernel._serde import JsonDict


class NodeState(StrEnum):
    """Where one node of a graph saga stands."""

    PENDING = "pending"  #: not started: what it runs after is not done (or never was)
    RUNNING = "running"  #: its command is in flight, or it waits out a back-off
    DONE = "done"  #: it succeeded (or an operator skipped it with a result)
    SKIPPED = "skipped"  #: its condition (``when``) was false: it owes nothing
    FAILED = "failed"  #: refused, or out of attempts
    STOPPED = "stopped"  #: the saga stopped while it was under way (outcome maybe unknown)
    STUCK = "stuck"  #: waits for an operator: a held reply, a parked step, a stuck undo
    UNDOING = "undoing"  #: its compensation is under way
    UNDONE = "undone"  #: its compensation is done


#: A fan-out's state from its items': the first of these any item is in...
_FIRST: Final = (
    NodeState.STUCK,
    NodeState.UNDOING,
    NodeState.RUNNING,
    NodeState.FAILED,
    NodeState.STOPPED,
)
#: ...else undone (undoing while some item is still done), else done.

#: How the last stretch of a step's forward work ended, as a state.
_ENDED: Final[Mapping[str, NodeState]] = {
    "success": NodeState.DONE,
    "skipped": NodeState.DONE,  # by an operator, with a result
    "invalid": NodeState.DONE,  # a held reply, accepted since (still held: stuck)
    "refused": NodeState.FAILED,
    "failed": NodeState.FAILED,
    "timed_out": NodeState.FAILED,
    "retryable": NodeState.FAILED,
    "backoff": NodeState.FAILED,
    "in_doubt": NodeState.STOPPED,
    "cancelled": NodeState.STOPPED,
    "retried": NodeState.RUNNING,  # a parked step retried: its next attempt follows
}


def declared_graph(definition: SagaDefinition) -> Graph | None:
    """The graph a saga type declares; None for a saga written as code."""
    graph = definition.graph
    return graph if isinstance(graph, Graph) else None


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """One declared node in one saga."""

    node: GraphNode
    state: NodeState
    #: A fan-out: how many of its items are in each state (empty for a step).
    items: Mapping[str, int] = field(default_factory=dict)
    #: Its work's first command, and the end of its last reply (None while under way).
    started_at: datetime | None = None
    ended_at: datetime | None = None
    #: From ``started_at`` to ``ended_at`` in ms, once its forward work succeeded or failed.
    latency_ms: float | None = None
    #: The commands its work sent (every attempt, every item).
    attempts: int = 0

    def figures(self) -> JsonDict:
        """What it adds to its node's JSON (``Graph.as_dict``'s)."""
        return {
            "state": self.state.value,
            "items": dict(self.items),
            "started_at": self.started_at.isoformat() if self.started_at else None,
            "ended_at": self.ended_at.isoformat() if self.ended_at else None,
            "latency_ms": self.latency_ms,
            "attempts": self.attempts,
        }


@dataclass(frozen=True, slots=True)
class GraphState:
    """A graph saga's declared graph with each node's state, in the graph's order."""

    graph: Graph
    nodes: tuple[NodeStatus, ...]

    def as_dict(self) -> JsonDict:
        """``Graph.as_dict`` with each node's state, items, times and latency."""
        return _with(self.graph, {n.node.name: n.figures() for n in self.nodes})


def _with(graph: Graph, figures: Mapping[str, JsonDict]) -> JsonDict:
    """The graph's JSON, each node's figures added to it."""
    out = graph.as_dict()
    out["nodes"] = [{**n, **figures[n["name"]]} for n in out["nodes"]]
    return out


@dataclass(slots=True)
class _Work:
    """What the segments say of one step: its forward stretches and whether it was undone."""

    forward: list[Segment] = field(default_factory=list)
    undo: bool = False


def graph_state(graph: Graph, view: SagaView, events: Iterable[Event]) -> GraphState:
    """Each node of ``graph`` as the saga of ``view`` (and of its history ``events``)
    stands."""
    work: dict[str, _Work] = {}
    for segment in view.segments:
        if segment.lane is Lane.STEP and segment.outcome != "pivot":
            work.setdefault(segment.row, _Work()).forward.append(segment)
        elif segment.lane is Lane.COMPENSATION:
            work.setdefault(segment.row, _Work()).undo = True
    items: dict[str, list[str]] = {}
    for step in work:
        item = fan_out_item(step)
        if item is not None:
            items.setdefault(item[0], []).append(step)
    skipped = {e.node for e in events if isinstance(e, NodeSkipped)}
    owed = {o.step: o.state for o in view.owed}
    stuck = {f.step for f in view.in_flight if f.held is not None} | set(view.parked_steps)
    found: dict[str, NodeStatus] = {}
    for node in graph.nodes:
        if node.name in skipped:
            found[node.name] = NodeStatus(node, NodeState.SKIPPED)
            continue
        steps = items.get(node.name, []) if node.kind == "each" else [node.name]
        states = [_step_state(s, work.get(s, _Work()), owed.get(s), s in stuck) for s in steps]
        found[node.name] = _node_status(node, steps, states, work)
    # A fan-out of no items sends nothing: done once a node after it has begun, or the
    # saga completed.
    for node in graph.nodes:
        if node.kind == "each" and found[node.name].state is NodeState.PENDING:
            begun = any(
                node.name in other.after and found[other.name].state is not NodeState.PENDING
                for other in graph.nodes
            )
            if begun or view.status is SagaStatus.COMPLETED:
                found[node.name] = NodeStatus(node, NodeState.DONE)
    return GraphState(graph, tuple(found[n.name] for n in graph.nodes))


def _step_state(name: str, work: _Work, owed: OwedState | None, stuck: bool) -> NodeState:
    """One step's state: its undo's if it has one, else how its forward work stands."""
    if work.undo:
        if owed is OwedState.STUCK:
            return NodeState.STUCK
        return NodeState.UNDOING if owed is not None else NodeState.UNDONE
    if not work.forward:
        return NodeState.PENDING
    if stuck:
        return NodeState.STUCK
    last = work.forward[-1]
    if any(s.end is None for s in work.forward):
        return NodeState.RUNNING
    return _ENDED.get(last.outcome, NodeState.FAILED)


def _forward_state(work: _Work) -> NodeState | None:
    """How the forward work of a step ended (None while under way)."""
    if not work.forward or any(s.end is None for s in work.forward):
        return None
    return _ENDED.get(work.forward[-1].outcome, NodeState.FAILED)


def _node_status(
    node: GraphNode, steps: Sequence[str], states: Sequence[NodeState], work: Mapping[str, _Work]
) -> NodeStatus:
    counts: dict[str, int] = {}
    for state in states:
        counts[state.value] = counts.get(state.value, 0) + 1
    state = _combined(states)
    forward = [s for step in steps for s in work.get(step, _Work()).forward]
    starts = [s.start for s in forward]
    ends = [s.end for s in forward if s.end is not None]
    ended = bool(forward) and len(ends) == len(forward)
    measured = ended and all(
        _forward_state(work.get(step, _Work())) in (NodeState.DONE, NodeState.FAILED)
        for step in steps
    )
    started_at = min(starts) if starts else None
    ended_at = max(ends) if ended else None
    latency = None
    if measured and started_at is not None and ended_at is not None:
        latency = max((ended_at - started_at).total_seconds() * 1000, 0.0)
    return NodeStatus(
        node,
        state,
        items=counts if node.kind == "each" else {},
        started_at=started_at,
        ended_at=ended_at,
        latency_ms=latency,
        attempts=sum(1 for s in forward if _is_attempt(s)),
    )


def _combined(states: Sequence[NodeState]) -> NodeState:
    """A node's state from its steps' (one for a step, its items' for a fan-out)."""
    present = set(states)
    for state in _FIRST:
        if state in present:
            return state
    if NodeState.UNDONE in present:
        return NodeState.UNDOING if NodeState.DONE in present else NodeState.UNDONE
    return NodeState.DONE if present - {NodeState.PENDING} else NodeState.PENDING


def _is_attempt(segment: Segment) -> bool:
    """A command's attempt (``name #n``), not a back-off or a parked period."""
    return segment.label.startswith(f"{segment.row} #")


# --------------------------------------------------------------------------- insights


def graph_insight(graph: Graph, rows: Iterable[tuple[str, str, str, Counters]]) -> JsonDict:
    """The declared graph with each node's figures over the rows' window (the insights'
    aggregate rows of its type): the attempts and successes of its commands and the
    percentiles of their latency, command to reply (a fan-out: its items')."""
    fan_outs = {n.name for n in graph.nodes if n.kind == "each"}
    per_node = {n.name: Counters() for n in graph.nodes}
    for facet, key, _, counters in rows:
        item = fan_out_item(key) if facet == "node" else None
        name = item[0] if item is not None and item[0] in fan_outs else key
        if facet == "node" and name in per_node:
            per_node[name].add(counters)
    return _with(
        graph,
        {
            name: {
                "attempts": c.attempts,
                "successes": c.successes,
                "latency_ms": percentiles(c.hist),
            }
            for name, c in per_node.items()
        },
    )
