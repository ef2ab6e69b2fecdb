"""Random graph sagas for the property tests, with the shape the oracles read.

:func:`graph_shapes` draws a DAG of up to 30 nodes: each node depends on up to three
earlier ones, some carry no compensation, some run under a condition (false for some
runs), some are bounded fan-outs (``each``, a few items, sometimes more than the bound,
sometimes one at a time), and each has its own attempts and timeout. :func:`graph_saga`
turns a shape into a ``GraphSaga`` class (its name per shape, as a deploy's would be);
the saga's input says which conditions hold and how many items each fan-out gets, so
the same class runs the same way on replay.

The oracles never ask the runtime: they read the shape (:class:`NodeShape`) and the
history.
"""

from __future__ import annotations

import dataclasses
import types
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from hypothesis import strategies as st
from pydantic import BaseModel, Field

from saga_engine import RetryPolicy
from saga_engine.core.authoring._definition import SagaDefinition
from saga_engine.graph import GraphSaga, each, node, step


class GraphIn(BaseModel):
    #: The conditional nodes whose condition is false for this run.
    skip: list[str] = Field(default_factory=list)
    #: How many items each fan-out gets.
    items: dict[str, int] = Field(default_factory=dict)


class GraphOut(BaseModel):
    ran: list[str] = Field(default_factory=list)


class GraphCmd(BaseModel):
    node: str
    item: int = -1


class GraphUndo(BaseModel):
    node: str
    item: int = -1


@dataclass(frozen=True)
class NodeShape:
    name: str
    after: tuple[str, ...]
    compensable: bool
    #: None: unconditional; else whether its condition holds in this run.
    runs: bool | None
    #: A fan-out: its bound, its items in this run, and how many run at once (None: all).
    fan_out: int | None = None
    items: int = 0
    concurrency: int | None = None
    attempts: int = 1
    timeout_s: float | None = None

    @property
    def participant(self) -> str:
        return f"svc-{self.name}"

    def steps(self) -> list[str]:
        """The step names the node runs as (a fan-out over its bound runs none)."""
        if self.fan_out is None:
            return [self.name]
        if self.items > self.fan_out:
            return []
        return [f"{self.name}[{i}]" for i in range(self.items)]


@dataclass(frozen=True)
class GraphShape:
    nodes: tuple[NodeShape, ...]
    by_name: dict[str, NodeShape] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_name", {n.name: n for n in self.nodes})

    def input(self) -> GraphIn:
        return GraphIn(
            skip=[n.name for n in self.nodes if n.runs is False],
            items={n.name: n.items for n in self.nodes if n.fan_out is not None},
        )

    def descendants(self) -> dict[str, set[str]]:
        """Every node that depends on each node, directly or through others."""
        found: dict[str, set[str]] = {n.name: set() for n in self.nodes}
        for n in reversed(self.nodes):  # dependents come later in declaration order
            for dep in n.after:
                found[dep] |= {n.name} | found[n.name]
        return found


def node_of(step_name: str) -> str:
    """The node a step belongs to (a fan-out's items are ``node[i]``)."""
    return step_name.split("[", 1)[0]


def _policy(attempts: int) -> RetryPolicy:
    return RetryPolicy(
        max_attempts=attempts,
        initial_backoff=timedelta(seconds=1),
        max_backoff=timedelta(seconds=2),
    )


@st.composite
def graph_shapes(
    draw: st.DrawFn, max_nodes: int = 30, *, empty_fan_outs: bool = True
) -> GraphShape:
    """A random graph; ``empty_fan_outs``: fan-outs may get no items."""
    count = draw(st.integers(1, max_nodes), label="nodes")
    nodes: list[NodeShape] = []
    for i in range(count):
        name = f"n{i}"
        # Mostly recent dependencies: long chains and wide layers both occur.
        earlier = st.integers(max(0, i - 6), i - 1) if i else st.nothing()
        deps = draw(st.lists(earlier, max_size=min(3, i), unique=True), label=f"{name} after")
        kind = draw(st.sampled_from(["step"] * 4 + ["each"]), label=f"{name} kind")
        conditional = draw(st.sampled_from([None, None, None, None, True, False]))
        fan_out = items = None
        concurrency = None
        if kind == "each":
            fan_out = draw(st.integers(1, 3), label=f"{name} bound")
            fewest = 0 if empty_fan_outs else 1
            items = draw(st.sampled_from([fan_out, *range(fewest, fan_out)]), label=f"{name} items")
            concurrency = draw(st.sampled_from([None, None, 1]))
        nodes.append(
            NodeShape(
                name,
                tuple(f"n{d}" for d in sorted(deps)),
                compensable=draw(st.sampled_from([True, True, True, False])),
                runs=conditional,
                fan_out=fan_out,
                items=items or 0,
                concurrency=concurrency,
                attempts=draw(st.integers(1, 3), label=f"{name} attempts"),
                timeout_s=draw(st.sampled_from([30.0, 30.0, None]), label=f"{name} timeout"),
            )
        )
    fan_outs = [i for i, n in enumerate(nodes) if n.fan_out is not None]
    if fan_outs and draw(st.sampled_from([False] * 4 + [True]), label="a fan-out overflows"):
        i = draw(st.sampled_from(fan_outs), label="which fan-out overflows")
        nodes[i] = dataclasses.replace(nodes[i], items=(nodes[i].fan_out or 0) + 1)
    return GraphShape(tuple(nodes))


def _work(shape: NodeShape) -> Any:
    name = shape.name
    policy = _policy(shape.attempts)
    if shape.fan_out is None:
        return step(
            shape.participant,
            lambda o: GraphCmd(node=name),
            compensate=(lambda o: GraphUndo(node=name)) if shape.compensable else None,
            retry=policy,
            timeout=shape.timeout_s,
            compensate_retry=_policy(2),
        )
    return each(
        lambda o: list(range(o.items[name])),
        step(
            shape.participant,
            lambda o, item: GraphCmd(node=name, item=item),
            compensate=(lambda o, item: GraphUndo(node=name, item=item))
            if shape.compensable
            else None,
            retry=policy,
            timeout=shape.timeout_s,
            compensate_retry=_policy(2),
        ),
        max_items=shape.fan_out,
        concurrency=shape.concurrency,
    )


def _condition(name: str) -> Any:
    return lambda o: name not in o.skip


def _output(self: Any, input: GraphIn, results: dict[str, Any]) -> GraphOut:
    return GraphOut(ran=sorted(name for name, result in results.items() if result is not None))


def graph_saga(shape: GraphShape, name: str = "prop-graph") -> type[GraphSaga[Any, Any]]:
    """The ``GraphSaga`` a shape declares."""
    namespace: dict[str, Any] = {"name": name, "output": _output}
    for n in shape.nodes:
        namespace[n.name] = node(
            _work(n), after=list(n.after), when=None if n.runs is None else _condition(n.name)
        )
    return types.new_class(
        "PropertyGraph", (GraphSaga[GraphIn, GraphOut],), {}, lambda ns: ns.update(namespace)
    )


def graph_definition(shape: GraphShape) -> SagaDefinition:
    return SagaDefinition.of(graph_saga(shape))
