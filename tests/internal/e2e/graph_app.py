"""The crash tests' graph saga (``saga worker tests.internal.e2e.graph_app:SAGAS``): five
nodes on the ledger participants of ``app.py``, whose tables count the effects::

    root (alpha) ─┬─> left (beta) ──> deep (gamma) ─┬─> last (beta, refused if asked)
                  └─> right (gamma) ────────────────┘

A refused ``last`` undoes the graph in its reverse order: ``deep`` and ``right`` at once
(nothing that depends on them is applied), then ``left`` once ``deep`` is undone, then
``root`` once ``left`` and ``right`` are.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from saga_engine import Saga
from saga_engine.graph import GraphSaga, node, step
from tests.internal.e2e.app import Apply, Revert


class GraphOrder(BaseModel):
    amount: int
    #: ``last``'s participant refuses it, so the saga compensates.
    refuse_last: bool = False


class GraphDone(BaseModel):
    nodes: list[str]


#: Each node's participant.
NODES = {"root": "alpha", "left": "beta", "right": "gamma", "deep": "gamma", "last": "beta"}
#: So long that nothing but a recovering engine sends a command again (and a timed-out last
#: attempt would be compensated in doubt, another outcome than the test's).
TIMEOUT_S = 3600


def _node(name: str, after: list[str], refuse: bool = False) -> Any:
    def command(order: GraphOrder) -> Apply:
        return Apply(amount=order.amount, refuse=refuse and order.refuse_last)

    return node(
        step(
            NODES[name],
            command,
            compensate=lambda order: Revert(amount=order.amount),
            timeout=TIMEOUT_S,
        ),
        after=after,
    )


class GraphTransfer(GraphSaga[GraphOrder, GraphDone]):
    name = "graph-transfer"

    root = _node("root", [])
    left = _node("left", ["root"])
    right = _node("right", ["root"])
    deep = _node("deep", ["left"])
    last = _node("last", ["deep", "right"], refuse=True)

    def output(self, input: GraphOrder, results: Any) -> GraphDone:
        return GraphDone(nodes=sorted(results))


SAGAS: list[type[Saga[Any, Any]]] = [GraphTransfer]
