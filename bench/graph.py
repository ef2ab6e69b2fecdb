"""What a graph saga's decisions cost per node, beside the same work written as code.

A graph of ``--layers`` by ``--width`` nodes (5 by 10: 50 nodes), each node after two or
three nodes of the layer before, is declared as a ``GraphSaga``; the same steps are
written code-first, a ``Saga`` whose ``run`` awaits one ``asyncio.gather`` per layer.
Both are started and driven to completion through ``SagaRuntime`` in this process (no
I/O, no store, no broker): every command answered with a success reply, first sent
first answered, one reply per decision. That is the decision core: the saga's code on
its deterministic loop, its pydantic models, its events, the graph's bookkeeping.

The two are measured in the same run, interleaved round by round (``--rounds``, each of
``--runs`` / ``--rounds`` sagas of each kind, the order alternating) so that the drift of
a shared machine hits both. Figures are CPU µs (``time.process_time``) per node; bench/
has no instruction counter, so none is reported::

    python -m bench.graph [--runs 10000] [--rounds 10] [--layers 5] [--width 10]

Prints one JSON object on stdout (progress on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import time
import types
import uuid
from collections import deque
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from saga_engine import Saga, SagaContext
from saga_engine.core.authoring._definition import SagaDefinition
from saga_engine.core.history._decision import Reply, StartSaga
from saga_engine.core.runtime._runtime import SagaRuntime
from saga_engine.graph import GraphSaga, node, step
from saga_engine.kernel._mainloop import GC_THRESHOLDS


class GraphBenchIn(BaseModel):
    amount: int = 5


class GraphBenchOut(BaseModel):
    nodes: int


class Work(BaseModel):
    node: str
    amount: int


class Undo(BaseModel):
    node: str
    amount: int


def layout(layers: int, width: int) -> list[list[tuple[str, list[str]]]]:
    """Per layer, each node's name and the nodes of the layer before it runs after: two
    neighbours, and a third for every other node."""
    out: list[list[tuple[str, list[str]]]] = []
    for layer in range(layers):
        row = []
        for i in range(width):
            name = f"n{layer}_{i}"
            if layer == 0:
                after: list[str] = []
            else:
                picks = [i, (i + 1) % width] + ([(i + 3) % width] if i % 2 == 0 else [])
                after = [f"n{layer - 1}_{j}" for j in dict.fromkeys(picks)]
            row.append((name, after))
        out.append(row)
    return out


def _participant(name: str) -> str:
    return f"svc-{name.split('_')[1]}"


def _node(name: str, after: list[str]) -> Any:
    def work(order: GraphBenchIn) -> Work:
        return Work(node=name, amount=order.amount)

    def undo(order: GraphBenchIn) -> Undo:
        return Undo(node=name, amount=order.amount)

    return node(step(_participant(name), work, compensate=undo), after=after)


def graph_saga(layers: int, width: int) -> type[Saga[Any, Any]]:
    """The graph declared as a ``GraphSaga``."""
    namespace: dict[str, Any] = {"name": "bench-graph"}
    for row in layout(layers, width):
        for name, after in row:
            namespace[name] = _node(name, after)

    def output(self: Any, input: GraphBenchIn, results: Any) -> GraphBenchOut:
        return GraphBenchOut(nodes=len(results))

    namespace["output"] = output
    return types.new_class(
        "BenchGraph", (GraphSaga[GraphBenchIn, GraphBenchOut],), {}, lambda ns: ns.update(namespace)
    )


def code_first_saga(layers: int, width: int) -> type[Saga[Any, Any]]:
    """The same steps written as code: one ``gather`` per layer."""
    rows = layout(layers, width)

    class BenchLayered(Saga[GraphBenchIn, GraphBenchOut]):
        name = "bench-layered"

        async def run(self, ctx: SagaContext, req: GraphBenchIn) -> GraphBenchOut:
            done = 0
            for row in rows:
                results = await asyncio.gather(
                    *(
                        ctx.step(
                            name,
                            to=_participant(name),
                            command=Work(node=name, amount=req.amount),
                            compensate=Undo(node=name, amount=req.amount),
                        )
                        for name, _ in row
                    )
                )
                done += len(results)
            return GraphBenchOut(nodes=done)

    return BenchLayered


def run_one(definition: SagaDefinition, now: datetime, nodes: int) -> int:
    """One saga started and driven to completion; the events it recorded."""
    runtime, decision = SagaRuntime.start(
        definition,
        StartSaga(saga_id=str(uuid.uuid4()), saga_type=definition.name, input={}, at=now),
    )
    waiting = deque(decision.commands)
    replies = 0
    while waiting:
        command = waiting.popleft()
        decision = runtime.handle(Reply(command.command_id, "success", now, payload={}))
        waiting.extend(decision.commands)
        replies += 1
    if replies != nodes or decision.status.value != "completed":
        raise RuntimeError(
            f"{definition.name} ended {decision.status.value} after {replies} of {nodes} replies"
        )
    events = len(runtime.history)
    runtime.close()
    return events


def _round(definition: SagaDefinition, runs: int, nodes: int, now: datetime) -> float:
    """CPU µs per node over ``runs`` sagas."""
    t0 = time.process_time()
    for _ in range(runs):
        run_one(definition, now, nodes)
    return (time.process_time() - t0) / (runs * nodes) * 1e6


def _summary(per_node: list[float], runs: int) -> dict[str, Any]:
    return {
        "runs": runs,
        "us_per_node_median": round(statistics.median(per_node), 2),
        "us_per_node_min": round(min(per_node), 2),
        "us_per_node_rounds": [round(x, 2) for x in per_node],
    }


def measure(runs: int, rounds: int, layers: int, width: int) -> dict[str, Any]:
    nodes = layers * width
    kinds = {
        "graph": SagaDefinition.of(graph_saga(layers, width)),
        "code_first": SagaDefinition.of(code_first_saga(layers, width)),
    }
    now = datetime.now(UTC)
    events = {kind: run_one(d, now, nodes) for kind, d in kinds.items()}  # and a warm-up
    for d in kinds.values():
        for _ in range(min(50, runs)):
            run_one(d, now, nodes)
    per_round = max(1, runs // rounds)
    figures: dict[str, list[float]] = {kind: [] for kind in kinds}
    for r in range(rounds):
        order = list(kinds) if r % 2 == 0 else list(reversed(kinds))
        for kind in order:
            figures[kind].append(_round(kinds[kind], per_round, nodes, now))
        print(
            f"round {r + 1}/{rounds}: "
            + ", ".join(f"{k} {figures[k][-1]:.1f} us/node" for k in kinds),
            file=sys.stderr,
        )
    graph, code = (_summary(figures[k], per_round * rounds) for k in kinds)
    return {
        "bench": "graph",
        "nodes": nodes,
        "layers": layers,
        "width": width,
        "edges": sum(len(after) for row in layout(layers, width) for _, after in row),
        "rounds": rounds,
        "events_per_saga": events,
        "graph": graph,
        "code_first": code,
        "graph_over_code_first": round(graph["us_per_node_median"] / code["us_per_node_median"], 3),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000, help="sagas of each kind")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds")
    parser.add_argument("--layers", type=int, default=5)
    parser.add_argument("--width", type=int, default=10)
    args = parser.parse_args(argv)
    if min(args.runs, args.rounds, args.layers, args.width) < 1:
        parser.error("--runs, --rounds, --layers and --width must be at least 1")
    if args.width < 4:
        parser.error("--width must be at least 4 (a node runs after up to three neighbours)")
    gc.set_threshold(*GC_THRESHOLDS)  # as saga_engine.run sets them for an engine
    result = measure(args.runs, min(args.rounds, args.runs), args.layers, args.width)
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
