"""The crash tests' graph sagas (``saga worker tests.internal.e2e.graph_app:SAGAS``) on the
ledger participants of ``app.py``, whose tables count the effects. ``GraphTransfer``'s five
nodes::

    root (alpha) ─┬─> left (beta) ──> deep (gamma) ─┬─> last (beta, refused if asked)
                  └─> right (gamma) ────────────────┘

A refused ``last`` undoes the graph in its reverse order: ``deep`` and ``right`` at once
(nothing that depends on them is applied), then ``left`` once ``deep`` is undone, then
``root`` once ``left`` and ``right`` are.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from saga_engine import RetryPolicy, Saga, Settings, run
from saga_engine.graph import GraphSaga, each, node, step
from saga_engine.participant import Participant, Rejected, Transaction
from tests.internal.e2e.app import Applied, Apply, Revert, build_participant
from tests.internal.e2e.participant_main import serve_participant


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


class FanOrder(BaseModel):
    amount: int
    items: list[str]


class GraphFanOut(GraphSaga[FanOrder, GraphDone]):
    """``root`` (alpha), then one command to beta per item (``items[0]``, ...), all at
    once."""

    name = "graph-fan-out"

    root = _node("root", [])
    items = node(
        each(
            lambda order: order.items,
            step("beta", lambda order, item: Apply(amount=order.amount), timeout=TIMEOUT_S),
            max_items=10,
        ),
        after=[root],
    )

    def output(self, input: FanOrder, results: Any) -> GraphDone:
        return GraphDone(nodes=sorted(results))


class GuardedRevert(BaseModel):
    """A revert its participant refuses while its ``undo_closed`` table has a row."""

    amount: int


#: Created by the tests in the schemas of the participants this module's main serves.
UNDO_CLOSED_DDL = "CREATE TABLE IF NOT EXISTS undo_closed (why text NOT NULL)"
#: ``GraphStuckUndo``'s nodes and their participants.
STUCK_NODES = {"left": "alpha", "right": "beta", "last": "gamma"}


def _guarded(name: str, after: list[str]) -> Any:
    # One attempt: a refused compensation is stuck at once, for an operator.
    return node(
        step(
            STUCK_NODES[name],
            lambda order: Apply(amount=order.amount, refuse=name == "last"),
            compensate=lambda order: GuardedRevert(amount=order.amount),
            compensate_retry=RetryPolicy(max_attempts=1),
            timeout=TIMEOUT_S,
        ),
        after=after,
    )


class GraphStuckUndo(GraphSaga[GraphOrder, GraphDone]):
    """``left`` (alpha) and ``right`` (beta), independent; ``last`` (gamma) after both,
    always refused: the two are undone at once, each by a ``GuardedRevert``."""

    name = "graph-stuck-undo"

    left = _guarded("left", [])
    right = _guarded("right", [])
    last = _guarded("last", ["left", "right"])

    def output(self, input: GraphOrder, results: Any) -> GraphDone:
        return GraphDone(nodes=sorted(results))


SAGAS: list[type[Saga[Any, Any]]] = [GraphTransfer, GraphFanOut, GraphStuckUndo]


def build_guarded_participant(name: str, settings: Settings) -> Participant:
    """``app.py``'s ledger participant ``name`` that also answers ``GuardedRevert``."""
    participant = build_participant(name, settings)

    @participant.handles(GuardedRevert)
    async def guarded_revert(cmd: GuardedRevert, tx: Transaction) -> Applied:
        closed = await tx.fetchval("SELECT why FROM undo_closed LIMIT 1")
        if closed is not None:
            raise Rejected(f"{name} refuses reverts: {closed}")
        await tx.execute(
            "INSERT INTO ledger (command_id, saga_id, kind, amount) VALUES ($1, $2, 'revert', $3)",
            tx.command_id,
            tx.saga_id,
            cmd.amount,
        )
        return Applied(receipt=f"{name}:revert")

    return participant


if __name__ == "__main__":
    import sys

    # python -m tests.internal.e2e.graph_app participant NAME
    if len(sys.argv) != 3 or sys.argv[1] != "participant":
        sys.exit("usage: python -m tests.internal.e2e.graph_app participant NAME")
    run(serve_participant(lambda settings: build_guarded_participant(sys.argv[2], settings)))
