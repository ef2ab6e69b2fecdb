"""Crash tests of a graph saga: real engine and participant processes, the engine
SIGKILLed where a graph saga differs from a sequence of steps, and the effects counted in
the participants' own tables (``graph_app.py``).

- Between a node's reply and its dependents' commands: ``root``'s reply and the
  commands of ``left`` and ``right`` are recorded, neither is sent. The engine that
  recovers sends them; each node is applied once.
- During a parallel undo: ``last`` was refused; the compensations of ``deep`` and
  ``right`` (undone at once) were sent, ``left``'s is recorded and not sent, ``root``'s
  not yet begun. The engine that recovers sends the rest, in the graph's order; each
  compensation is applied once.

Each checks that the saga ends as it should, that every command id has exactly one row
in its participant's table (one apply per node, one revert per node owed), that the
reverts happened in the graph's reverse order (by the participants' own clocks), and that
the recorded history replays under the same code.
"""

from __future__ import annotations

import signal
from collections import Counter
from typing import Any

import pytest

from saga_engine import SagaStatus
from saga_engine.client import SagaClient
from saga_engine.events import CommandIssued, CompensationIssued, ReplyReceived
from saga_engine.protocol import command_id_for
from saga_engine.replay import HistoryExport, replay
from saga_engine.store import PostgresEventStore
from tests.internal.e2e.graph_app import NODES, GraphOrder, GraphTransfer
from tests.internal.e2e.harness import Cluster

pytestmark = pytest.mark.integration

APP = "tests.internal.e2e.graph_app:SAGAS"
#: Each owed node's compensation waits for those of the nodes that depend on it.
UNDONE_AFTER = {"root": ["left", "right"], "left": ["deep"], "right": [], "deep": []}


def _start_engine(cluster: Cluster, crash_at: str | None = None) -> None:
    extra = {"SAGA_CRASH_AT": crash_at} if crash_at else {}
    cluster._spawn(
        "engine", ["-m", "saga_engine", "worker", APP, "--log-level", "INFO"], cluster.env(**extra)
    )


async def _start_and_kill(cluster: Cluster, point: str, hit: int, order: GraphOrder) -> str:
    """Starts an engine that kills itself at the ``hit``-th pass of ``point`` and one saga;
    returns the saga's id once the engine died there."""
    _start_engine(cluster, crash_at=f"{point}:{hit}")
    async with SagaClient(cluster.settings) as client:
        saga_id = await client.start(GraphTransfer, order)
    code = await cluster.wait_exit("engine")
    log = cluster.log_tail("engine")
    assert code == -signal.SIGKILL, log
    assert f"crash point {point} reached" in log
    return saga_id


async def _recover(cluster: Cluster, saga_id: str, refused: bool) -> list[Any]:
    """Starts an engine again; once the saga ended as it should, checks its effects and
    that its history replays, and returns the history."""
    _start_engine(cluster)
    status = SagaStatus.COMPENSATED if refused else SagaStatus.COMPLETED
    assert await cluster.wait_settled([saga_id]) == {saga_id: status}, cluster.log_tail("engine")
    await _check_effects(cluster, saga_id, refused=refused)
    history = await _history(cluster, saga_id)
    result = replay([GraphTransfer], HistoryExport(saga_id, GraphTransfer.name, history))
    assert result.deterministic, result.error
    assert result.status == status
    return history


async def _history(cluster: Cluster, saga_id: str) -> list[Any]:
    store = await PostgresEventStore.connect(cluster.settings.pg)
    try:
        loaded = await store.load(saga_id)
    finally:
        await store.close()
    return [stored.event for stored in loaded.events]


async def _check_effects(cluster: Cluster, saga_id: str, refused: bool) -> None:
    """Each node applied once at its participant (``last`` not at all when refused), and
    when the saga compensated, each applied node reverted once, in the graph's reverse
    order."""
    rows: list[dict[str, Any]] = []
    for participant in sorted(set(NODES.values())):
        mine = [r for r in await cluster.ledger(participant) if r["saga_id"] == saga_id]
        doubled = {c: n for c, n in Counter(r["command_id"] for r in mine).items() if n > 1}
        assert not doubled, f"{participant}: effects applied twice: {doubled}"
        rows += [{**r, "participant": participant} for r in mine]
    by_id = {r["command_id"]: r for r in rows}
    applied = [n for n in NODES if not (refused and n == "last")]
    expected: dict[str, tuple[str, str]] = {}
    for name in applied:
        expected[command_id_for(saga_id, name, 0, compensation=False)] = ("apply", NODES[name])
        if refused:
            expected[command_id_for(saga_id, name, 0, compensation=True)] = ("revert", NODES[name])
    assert {c: (r["kind"], r["participant"]) for c, r in by_id.items()} == expected
    if refused:
        reverted = {
            name: by_id[command_id_for(saga_id, name, 0, compensation=True)]["at"]
            for name in applied
        }
        for name, later in UNDONE_AFTER.items():
            for dependent in later:
                assert reverted[dependent] < reverted[name], (
                    f"{name} reverted before {dependent}, which depends on it: {reverted}"
                )


@pytest.mark.parametrize("refuse_last", [False, True], ids=["completes", "compensates"])
async def test_engine_killed_between_a_nodes_reply_and_its_dependents_sends(
    participants_up: Cluster, refuse_last: bool
) -> None:
    cluster = participants_up
    # The 1st send: root's command; the 2nd: left's and right's, once root's reply is in.
    order = GraphOrder(amount=7, refuse_last=refuse_last)
    saga_id = await _start_and_kill(cluster, "before_send", 2, order)

    # root's reply and its dependents' commands are durable; neither command was sent.
    history = await _history(cluster, saga_id)
    replies = [e.step for e in history if isinstance(e, ReplyReceived)]
    issued = [e.step for e in history if isinstance(e, CommandIssued)]
    assert replies == ["root"]
    assert sorted(issued) == ["left", "right", "root"]
    assert await cluster.commands_in_topic("beta") == []
    assert await cluster.commands_in_topic("gamma") == []

    await _recover(cluster, saga_id, refused=refuse_last)


async def test_engine_killed_during_a_parallel_undo(participants_up: Cluster) -> None:
    cluster = participants_up
    # The 1st compensations sent: deep's and right's, together; the 2nd: left's, once
    # deep's is undone (right's undo, done or not, lets nothing else begin).
    order = GraphOrder(amount=9, refuse_last=True)
    saga_id = await _start_and_kill(cluster, "before_send_compensation", 2, order)

    history = await _history(cluster, saga_id)
    undos = [e.step for e in history if isinstance(e, CompensationIssued)]
    assert sorted(undos[:2]) == ["deep", "right"]
    assert undos[2:] == ["left"]
    # deep's and right's compensations went out (gamma: two commands, two undos);
    # left's did not (beta: left's and last's commands only).
    assert len(await cluster.commands_in_topic("gamma")) == 4
    assert len(await cluster.commands_in_topic("beta")) == 2

    history = await _recover(cluster, saga_id, refused=True)
    # left's compensation, recorded before the kill, was sent by the engine that
    # recovered without being recorded again; root's was recorded once, after it.
    undos = [e.step for e in history if isinstance(e, CompensationIssued)]
    assert sorted(undos) == ["deep", "left", "right", "root"]
