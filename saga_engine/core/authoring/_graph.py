"""Graph sagas: the steps of a saga and what each depends on, declared as a class.

A :class:`GraphSaga` declares its nodes as class attributes (``node(step(...),
after=[...], when=...)``). The declaration is checked when the class is defined, so a
cycle, an unknown or repeated dependency, a node whose builder takes the result of a node
it does not depend on, or an unbounded fan-out is refused at import time with a
``DefinitionError`` naming it. Its ``run`` is the graph's: every node starts as soon as
the nodes it depends on are done, on the saga's one path (the same history, replay,
operators' actions and compensation as a saga written as code), and each step carries
the steps it depends on (``StepRequest.after``), so a failure undoes the graph in the
reverse of the order it allows (``core/runtime/_undo``). See docs/graphs.md.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel

from saga_engine.core.authoring._context import (
    HTTP_PREFIX,
    Duration,
    HttpRequest,
    SagaContext,
    StepRequest,
    as_timedelta,
)
from saga_engine.core.authoring._definition import Saga
from saga_engine.core.history._cost import Cost, check_cost_fits
from saga_engine.core.history._policy import RetryPolicy
from saga_engine.kernel._errors import DefinitionError, StepFailed
from saga_engine.kernel._serde import JsonDict
from saga_engine.kernel._settings import LimitsSettings

InT = TypeVar("InT", bound=BaseModel)
OutT = TypeVar("OutT", bound=BaseModel)

#: The parameter an ``each`` fan-out's builders take the item by.
ITEM = "item"
#: The most items one fan-out may declare as its bound.
MAX_FAN_OUT = 10_000
#: The most nodes one graph may declare.
MAX_NODES = 500

Builder = Callable[..., Any]

_ITEM_STEP = re.compile(r"(?P<node>.+)\[(?P<index>\d+)\]")


def item_step(node: str, index: int) -> str:
    """The step name of a fan-out's item: ``lines[3]``."""
    return f"{node}[{index}]"


def fan_out_item(step: str) -> tuple[str, int] | None:
    """A fan-out item's step name (``lines[3]``) as (node, index); None for any other."""
    found = _ITEM_STEP.fullmatch(step)
    return (found["node"], int(found["index"])) if found else None


@dataclass(frozen=True, slots=True)
class StepWork:
    """A node's work: one command to a participant (``step``), or one HTTP call made by
    the engine (``http``), each with what undoes it."""

    kind: Literal["step", "http"]
    #: The participant (``step``) or the HTTP endpoint (``http``).
    to: str
    #: Builds the command (``step``) or the JSON body (``http``) from the saga's input
    #: and the results the node takes.
    command: Builder
    compensate: Builder | None = None
    returns: type[BaseModel] | None = None
    retry: RetryPolicy | None = None
    timeout: timedelta | None = None
    compensate_retry: RetryPolicy | None = None
    pivot: bool = False
    #: ``http``: the path and method called.
    path: str = ""
    method: str = "POST"
    #: What its command costs its participant while in flight (``ctx.step``'s ``cost``).
    cost: Cost | str | None = None

    def request(
        self, name: str, input: Any, args: Mapping[str, Any], after: frozenset[str]
    ) -> StepRequest:
        """The step this work is for one run: its command built from the saga's input
        and ``args`` (the results, and a fan-out's item, its builders take)."""
        command = _call(self.command, input, args)
        compensate = None if self.compensate is None else _call(self.compensate, input, args)
        if self.kind == "http":
            return StepRequest(
                name,
                f"{HTTP_PREFIX}{self.to}",
                HttpRequest(method=self.method, path=self.path, body=command),
                compensate=compensate,
                retry=self.retry,
                timeout=self.timeout or timedelta(seconds=30),
                returns=self.returns,
                pivot=self.pivot,
                after=after,
                cost=self.cost,
            )
        return StepRequest(
            name,
            self.to,
            command,
            compensate=compensate,
            retry=self.retry,
            timeout=self.timeout,
            compensate_retry=self.compensate_retry,
            returns=self.returns,
            pivot=self.pivot,
            after=after,
            cost=self.cost,
        )

    @property
    def participant(self) -> str:
        """Where its command goes, as flow control names it."""
        return f"{HTTP_PREFIX}{self.to}" if self.kind == "http" else self.to

    def builders(self) -> list[tuple[str, Builder]]:
        found = [("command", self.command)]
        if self.compensate is not None:
            found.append(("compensate", self.compensate))
        return found


@dataclass(frozen=True, slots=True)
class FanOut:
    """A node that runs one step per item of a list (``each``), at most ``max_items``,
    at most ``concurrency`` at once; its result is the list of the items' results."""

    items: Builder
    work: StepWork
    max_items: int
    concurrency: int | None = None


Work = StepWork | FanOut


def step(
    to: str,
    command: Builder,
    *,
    compensate: Builder | None = None,
    returns: type[BaseModel] | None = None,
    retry: RetryPolicy | None = None,
    timeout: Duration | None = None,
    compensate_retry: RetryPolicy | None = None,
    pivot: bool = False,
    cost: Cost | str | None = None,
) -> StepWork:
    """A command to participant ``to``: ``command`` builds it from the saga's input (its
    first parameter) and the results of the nodes it names by the rest; ``compensate``
    builds what undoes it, the same way. The options are ``ctx.step``'s (``cost``: what
    the command holds of its participant's budget while in flight, checked against the
    budgets when an engine starts)."""
    return StepWork(
        "step",
        to,
        command,
        compensate=compensate,
        returns=returns,
        retry=retry,
        timeout=as_timedelta(timeout, "timeout"),
        compensate_retry=compensate_retry,
        pivot=pivot,
        cost=cost,
    )


def http(
    endpoint: str,
    path: str,
    body: Builder,
    *,
    method: str = "POST",
    compensate: Builder | None = None,
    returns: type[BaseModel] | None = None,
    retry: RetryPolicy | None = None,
    timeout: Duration | None = None,
    pivot: bool = False,
    cost: Cost | str | None = None,
) -> StepWork:
    """An HTTP call the engine makes (``ctx.http_step``): ``body`` builds its JSON body
    from the input and the results it names; ``compensate`` builds an ``HttpRequest``."""
    return StepWork(
        "http",
        endpoint,
        body,
        compensate=compensate,
        returns=returns,
        retry=retry,
        timeout=as_timedelta(timeout, "timeout"),
        pivot=pivot,
        path=path,
        method=method.upper(),
        cost=cost,
    )


def each(
    items: Builder,
    work: StepWork,
    *,
    max_items: int | None = None,
    concurrency: int | None = None,
) -> FanOut:
    """One step per item of ``items(input, ...)``: ``work``'s builders take the item as
    their ``item`` parameter. ``max_items`` bounds the fan-out (required: a run with more
    items fails the node, ``StepFailed``, before anything is sent); ``concurrency``
    bounds how many items are in flight at once (None: all)."""
    return FanOut(items, work, max_items, concurrency)  # type: ignore[arg-type]


class Node:
    """One declared node of a graph saga: its work, the nodes it runs after, and the
    condition it runs under. Made by :func:`node`; named by its class attribute."""

    __slots__ = ("after", "name", "takes", "when", "work")

    def __init__(self, work: Work, after: Sequence[Node | str], when: Builder | None) -> None:
        self.work = work
        self.after: tuple[Node | str, ...] = tuple(after)
        self.when = when
        self.name = ""
        #: The nodes whose results its builders take (set when its graph is checked).
        self.takes: tuple[str, ...] = ()

    def __set_name__(self, owner: type, name: str) -> None:
        if self.name and self.name != name:
            raise DefinitionError(
                f"{owner.__name__}: one node is declared twice, as {self.name!r} and "
                f"{name!r}; declare each node once"
            )
        self.name = name

    def __repr__(self) -> str:
        return f"<node {self.name or '?'}>"


def node(work: Work, *, after: Iterable[Node | str] = (), when: Builder | None = None) -> Any:
    """Declares a node of a :class:`GraphSaga`: ``work`` (``step``, ``http`` or
    ``each``) runs once every node in ``after`` is done, if ``when(input, ...)`` holds
    (a node whose condition is false is skipped: it owes nothing and counts as done)."""
    if isinstance(after, str | Node):
        after = [after]
    return Node(work, list(after), when)


@dataclass(frozen=True, slots=True)
class GraphNode:
    """A checked node, as the engine, the API and the console see it."""

    name: str
    kind: Literal["step", "http", "each"]
    #: The participant, or the HTTP endpoint.
    to: str
    after: tuple[str, ...]
    conditional: bool
    compensable: bool
    max_items: int | None = None
    pivot: bool = False
    #: Its declared cost: amounts, a cost class's name, or None.
    cost: dict[str, float] | str | None = None


@dataclass(frozen=True, slots=True)
class Graph:
    """A graph saga's checked declaration: its nodes in an order that runs each after
    the nodes it depends on (declaration order among the rest)."""

    nodes: tuple[GraphNode, ...]
    declared: Mapping[str, Node] = field(repr=False)

    def as_dict(self) -> JsonDict:
        """The graph as JSON: its nodes and its edges (dependency -> dependent)."""
        return {
            "nodes": [
                {
                    "name": n.name,
                    "kind": n.kind,
                    "to": n.to,
                    "after": list(n.after),
                    "conditional": n.conditional,
                    "compensable": n.compensable,
                    "max_items": n.max_items,
                    "pivot": n.pivot,
                    "cost": n.cost,
                }
                for n in self.nodes
            ],
            "edges": [[dep, n.name] for n in self.nodes for dep in n.after],
        }

    def cost_refusals(self, saga_type: str, limits: LimitsSettings) -> list[str]:
        """Why nodes' declared costs could never be sent under ``limits`` (an unknown
        cost class, or an amount above a whole budget): checked when an engine starts,
        so such a graph never begins a run. Empty: every declared cost can fit."""
        refusals = []
        for n in self.nodes:
            work = self.declared[n.name].work
            step_work = work.work if isinstance(work, FanOut) else work
            what = f"node {n.name!r} of saga {saga_type!r}"
            found = check_cost_fits(step_work.cost, limits, step_work.participant, saga_type, what)
            if found is not None:
                refusals.append(found)
        return refusals


@functools.lru_cache(maxsize=4096)
def _takes(builder: Builder) -> tuple[str, ...]:
    """The names a (checked) builder takes after the input."""
    return tuple(inspect.signature(builder).parameters)[1:]


def _call(builder: Builder, input: Any, args: Mapping[str, Any]) -> Any:
    """``builder(input, **the results it takes)``."""
    return builder(input, **{name: args[name] for name in _takes(builder)})


def _parameters(owner: str, where: str, builder: Any) -> tuple[str, ...]:
    """The names a builder takes after the input: the results (or the item) it uses."""
    if not callable(builder):
        raise DefinitionError(f"{owner}: {where} must be a function of the input, got {builder!r}")
    try:
        params = list(inspect.signature(builder).parameters.values())
    except (TypeError, ValueError) as exc:
        raise DefinitionError(f"{owner}: {where}'s parameters cannot be read ({exc})") from exc
    if not params or params[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        raise DefinitionError(
            f"{owner}: {where} must take the saga's input first, e.g. `lambda order: ...`"
        )
    rest = params[1:]
    for param in rest:
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise DefinitionError(
                f"{owner}: {where} takes *{param.name}; name each node whose result it "
                "takes as a parameter, e.g. `lambda order, reserve, charge: ...`"
            )
    return tuple(p.name for p in rest)


def _work_of(owner: str, name: str, work: Any) -> GraphNode:
    if isinstance(work, FanOut):
        bound = work.max_items
        if bound is None:
            raise DefinitionError(
                f"{owner}: fan-out {name!r} is unbounded; give it a bound, e.g. "
                f"each(..., max_items=100) (at most {MAX_FAN_OUT})"
            )
        if not isinstance(bound, int) or isinstance(bound, bool) or not 1 <= bound <= MAX_FAN_OUT:
            raise DefinitionError(
                f"{owner}: fan-out {name!r} has max_items={bound!r}; it must be an integer "
                f"from 1 to {MAX_FAN_OUT}"
            )
        limit = work.concurrency
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise DefinitionError(
                f"{owner}: fan-out {name!r} has concurrency={limit!r}; give a positive integer "
                "or None (every item at once)"
            )
        inner = _work_of(owner, name, work.work)
        return GraphNode(
            name, "each", inner.to, (), False, inner.compensable, bound, cost=inner.cost
        )
    if not isinstance(work, StepWork):
        raise DefinitionError(
            f"{owner}: node {name!r} must wrap step(...), http(...) or each(...), got {work!r}"
        )
    if not isinstance(work.to, str) or not work.to:
        raise DefinitionError(f"{owner}: node {name!r} needs a participant (a non-empty name)")
    cost = work.cost
    if cost is not None and not isinstance(cost, Cost | str):
        raise DefinitionError(
            f"{owner}: node {name!r} has cost={cost!r}; give a Cost(...), the name of a cost "
            "class, or None"
        )
    return GraphNode(
        name,
        work.kind,
        work.to,
        (),
        False,
        work.compensate is not None,
        pivot=work.pivot,
        cost=cost.as_dict() if isinstance(cost, Cost) else cost,
    )


def _dependencies(owner: str, declared: Mapping[str, Node]) -> dict[str, tuple[str, ...]]:
    """Each node's dependencies by name: unknown, foreign or repeated ones refused."""
    deps: dict[str, tuple[str, ...]] = {}
    for name, n in declared.items():
        names: list[str] = []
        for dep in n.after:
            dep_name = dep.name if isinstance(dep, Node) else dep
            if not isinstance(dep_name, str) or dep_name not in declared:
                known = ", ".join(declared)
                raise DefinitionError(
                    f"{owner}: node {name!r} runs after {dep!r}, which is not a node of this "
                    f"saga (its nodes: {known})"
                )
            if isinstance(dep, Node) and declared[dep_name] is not dep:
                raise DefinitionError(
                    f"{owner}: node {name!r} runs after a node of another saga named {dep_name!r}"
                )
            if dep_name in names:
                raise DefinitionError(f"{owner}: node {name!r} names {dep_name!r} twice in after=")
            if dep_name == name:
                raise DefinitionError(f"{owner}: node {name!r} runs after itself ({name} → {name})")
            names.append(dep_name)
        deps[name] = tuple(names)
    return deps


def _order(owner: str, deps: Mapping[str, tuple[str, ...]]) -> list[str]:
    """A topological order (declaration order among ready nodes); a cycle is refused,
    named as the path that closes it, e.g. ``label → charge → label``."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    order: list[str] = []

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            cycle = [*path[path.index(name) :], name]
            raise DefinitionError(
                f"{owner}: the nodes form a cycle: {' → '.join(cycle)}; a graph saga's "
                "nodes must not depend on one another in a circle"
            )
        state[name] = 1
        for dep in deps[name]:
            visit(dep, [*path, name])
        state[name] = 2
        order.append(name)

    for name in deps:
        visit(name, [])
    return order


def _ancestors(order: Sequence[str], deps: Mapping[str, tuple[str, ...]]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for name in order:
        found[name] = set(deps[name]).union(*(found[d] for d in deps[name]))
    return found


def _check_takes(owner: str, n: Node, upstream: set[str]) -> tuple[str, ...]:
    """The results a node's builders take: each must be a node it depends on."""
    work = n.work
    builders: list[tuple[str, Builder]] = []
    if n.when is not None:
        builders.append(("when", n.when))
    if isinstance(work, FanOut):
        builders.append(("items", work.items))
        item_builders = work.work.builders()
    else:
        item_builders = []
        builders += work.builders()
    takes: list[str] = []
    for allowed_item, group in ((False, builders), (True, item_builders)):
        for what, builder in group:
            for param in _parameters(owner, f"node {n.name!r}'s {what}", builder):
                if allowed_item and param == ITEM:
                    continue
                if param not in upstream:
                    hint = " (the item of a fan-out is `item`)" if allowed_item else ""
                    raise DefinitionError(
                        f"{owner}: node {n.name!r}'s {what} takes {param!r}, which is not a "
                        f"node it depends on (it runs after: {sorted(upstream) or 'nothing'})"
                        f"{hint}; add it to after= or remove the parameter"
                    )
                if param not in takes:
                    takes.append(param)
    return tuple(takes)


def check_graph(owner: str, namespace: Mapping[str, Any]) -> Graph:
    """The graph a class declares (its ``Node`` attributes, its bases' first), checked."""
    declared = {name: value for name, value in namespace.items() if isinstance(value, Node)}
    if not declared:
        raise DefinitionError(
            f"{owner}: a graph saga declares its nodes as attributes, e.g. "
            '`reserve = node(step("inventory", lambda order: Reserve(...)))`; it has none'
        )
    if len(declared) > MAX_NODES:
        raise DefinitionError(f"{owner}: {len(declared)} nodes; a graph has at most {MAX_NODES}")
    if ITEM in declared:
        raise DefinitionError(f"{owner}: a node may not be named {ITEM!r} (a fan-out's item is)")
    shapes = {name: _work_of(owner, name, n.work) for name, n in declared.items()}
    deps = _dependencies(owner, declared)
    order = _order(owner, deps)
    ancestors = _ancestors(order, deps)
    nodes = []
    for name in order:
        n = declared[name]
        n.takes = _check_takes(owner, n, ancestors[name])
        shape = shapes[name]
        nodes.append(
            GraphNode(
                name,
                shape.kind,
                shape.to,
                deps[name],
                n.when is not None,
                shape.compensable,
                shape.max_items,
                shape.pivot,
                shape.cost,
            )
        )
    return Graph(tuple(nodes), declared)


class GraphSaga(Saga[InT, OutT]):
    """A saga declared as a graph of nodes rather than written as ``run``::

        class Fulfil(GraphSaga[Order, Fulfilled]):
            name = "fulfil"
            reserve = node(step("inventory", lambda o: Reserve(sku=o.sku),
                                compensate=lambda o: Release(sku=o.sku)))
            charge = node(step("payments", lambda o: Charge(amount=o.amount),
                               compensate=lambda o: Refund(amount=o.amount)))
            label = node(step("shipping", lambda o, reserve: MakeLabel(...)),
                         after=[reserve, charge])

    Its output is built by :meth:`output` from the nodes' results (by default, the
    output model validated from ``{node name: result}``, a skipped node's being None).
    """

    #: The checked graph (set when the class is defined).
    graph: ClassVar[Graph]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        if "run" in cls.__dict__:
            raise DefinitionError(
                f"{cls.__name__}: a graph saga's run is its graph; declare nodes instead of "
                "`run` (or subclass Saga to write the saga as code)"
            )
        namespace: dict[str, Any] = {}
        for klass in reversed(cls.__mro__):
            namespace.update(vars(klass))
        if "name" in cls.__dict__:
            cls.graph = check_graph(cls.__name__, namespace)
        super().__init_subclass__(**kwargs)

    def output(self, input: InT, results: Mapping[str, Any]) -> Any:
        """The saga's output from its input and the nodes' results (by name)."""
        return type(self).output_type.model_validate(dict(results))

    async def run(self, ctx: SagaContext, input: InT) -> OutT:
        results = await GraphRun(type(self).graph, ctx, input).run()
        return self.output(input, results)  # type: ignore[no-any-return]


class GraphRun:
    """One run of a graph: every node a task on the saga's loop, started once the nodes
    it depends on are done; the first failure (in the graph's order) ends the run, and
    the lifecycle stops the rest and undoes what was applied."""

    __slots__ = ("ctx", "graph", "input", "results", "steps", "tasks")

    def __init__(self, graph: Graph, ctx: SagaContext, input: BaseModel) -> None:
        self.graph, self.ctx, self.input = graph, ctx, input
        self.results: dict[str, Any] = {}
        #: The step names each node stands for in its dependents' ``after``: its own
        #: steps, or a skipped node's dependencies' (so the undo order passes through it).
        self.steps: dict[str, frozenset[str]] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}

    async def run(self) -> dict[str, Any]:
        for n in self.graph.nodes:
            self.tasks[n.name] = asyncio.ensure_future(self._node(n))
        pending = set(self.tasks.values())
        while pending:
            _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
            for task in self.tasks.values():  # the first failure in the graph's order
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        return self.results

    async def _node(self, shape: GraphNode) -> None:
        for dep in shape.after:
            await self.tasks[dep]
        declared = self.graph.declared[shape.name]
        args = {name: self.results[name] for name in declared.takes}
        after = frozenset().union(*(self.steps[d] for d in shape.after))
        if declared.when is not None and not _call(declared.when, self.input, args):
            self.ctx.graph_skip(shape.name)
            self.results[shape.name], self.steps[shape.name] = None, after
            return
        work = declared.work
        if isinstance(work, FanOut):
            await self._fan_out(shape.name, work, args, after)
            return
        request = work.request(shape.name, self.input, args, after)
        self.results[shape.name] = await self.ctx.graph_step(request)
        self.steps[shape.name] = frozenset({shape.name})

    async def _fan_out(
        self, name: str, work: FanOut, args: dict[str, Any], after: frozenset[str]
    ) -> None:
        items = list(_call(work.items, self.input, args))
        if len(items) > work.max_items:
            raise StepFailed(
                name,
                f"fan-out {name!r} has {len(items)} items, more than its bound of "
                f"{work.max_items} (each(..., max_items=))",
            )
        names = [item_step(name, i) for i in range(len(items))]
        gate = asyncio.Semaphore(work.concurrency or max(1, len(items)))

        async def one(step_name: str, item: Any) -> Any:
            async with gate:
                request = work.work.request(step_name, self.input, {**args, ITEM: item}, after)
                return await self.ctx.graph_step(request)

        self.results[name] = list(
            await asyncio.gather(*(one(n, item) for n, item in zip(names, items, strict=True)))
        )
        # An empty fan-out passes its dependencies on, as a skipped node does.
        self.steps[name] = frozenset(names) or after
