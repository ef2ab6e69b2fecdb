"""More crash tests of graph sagas (``graph_app.py``), with real engine and participant
processes and the effects counted in the participants' own tables.

- A fan-out in flight: ``root``'s reply and the commands of every item of ``items`` are
  recorded, none is sent, when the engine is SIGKILLed. The engine that recovers sends
  them; each item is applied once, the saga completes, its history replays.
- Two compensations stuck at once: ``last`` is refused, so ``left`` (alpha) and ``right``
  (beta), independent, are undone in parallel; both participants refuse the revert, so
  both compensations are stuck. An operator fixes alpha and retries ``left`` through the
  admin API: it is undone while ``right`` stays stuck. The engine is SIGKILLed and
  restarted; ``right`` is still stuck; fixed and retried, it is undone and the saga ends
  compensated. Each step is reverted once; the history replays.
"""

from __future__ import annotations

import signal
import socket
from collections import Counter
from typing import Any

import asyncpg
import httpx
import pytest

from saga_engine import SagaStatus
from saga_engine.client import SagaClient
from saga_engine.events import CommandIssued, CompensationStuck, ReplyReceived
from saga_engine.protocol import command_id_for
from saga_engine.replay import HistoryExport, replay
from tests.internal.e2e.graph_app import (
    STUCK_NODES,
    UNDO_CLOSED_DDL,
    FanOrder,
    GraphFanOut,
    GraphOrder,
    GraphStuckUndo,
)
from tests.internal.e2e.harness import Cluster
from tests.internal.e2e.test_graph_crash import _history
from tests.waiting import eventually

pytestmark = pytest.mark.integration

APP = "tests.internal.e2e.graph_app:SAGAS"
ITEMS = ["a", "b", "c", "d"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_engine(cluster: Cluster, port: int = 0, crash_at: str | None = None) -> None:
    extra = {"SAGA_CRASH_AT": crash_at} if crash_at else {}
    if port:
        extra |= {"SAGA_ADMIN__PORT": str(port), "SAGA_ADMIN__HOST": "127.0.0.1"}
    cluster._spawn(
        "engine", ["-m", "saga_engine", "worker", APP, "--log-level", "INFO"], cluster.env(**extra)
    )


async def _replays(cluster: Cluster, saga: Any, saga_id: str, status: SagaStatus) -> None:
    history = await _history(cluster, saga_id)
    result = replay([saga], HistoryExport(saga_id, saga.name, history))
    assert result.deterministic, result.error
    assert result.status == status


async def _effects(cluster: Cluster, saga_id: str, participant: str) -> dict[str, str]:
    """The saga's rows in ``participant``'s ledger, by command id (none twice)."""
    mine = [r for r in await cluster.ledger(participant) if r["saga_id"] == saga_id]
    doubled = {c: n for c, n in Counter(r["command_id"] for r in mine).items() if n > 1}
    assert not doubled, f"{participant}: effects applied twice: {doubled}"
    return {r["command_id"]: r["kind"] for r in mine}


async def test_engine_killed_with_a_fan_outs_items_recorded_not_sent(
    participants_up: Cluster,
) -> None:
    cluster = participants_up
    # The 1st send: root's command; the 2nd: every item's, once root's reply is in.
    _start_engine(cluster, crash_at="before_send:2")
    async with SagaClient(cluster.settings) as client:
        saga_id = await client.start(GraphFanOut, FanOrder(amount=5, items=ITEMS))
    assert await cluster.wait_exit("engine") == -signal.SIGKILL, cluster.log_tail("engine")
    assert "crash point before_send reached" in cluster.log_tail("engine")

    names = [f"items[{i}]" for i in range(len(ITEMS))]
    history = await _history(cluster, saga_id)
    assert [e.step for e in history if isinstance(e, ReplyReceived)] == ["root"]
    issued = sorted(e.step for e in history if isinstance(e, CommandIssued))
    assert issued == sorted(["root", *names])
    assert await cluster.commands_in_topic("beta") == []

    _start_engine(cluster)
    assert await cluster.wait_settled([saga_id]) == {saga_id: SagaStatus.COMPLETED}, (
        cluster.log_tail("engine")
    )
    assert await _effects(cluster, saga_id, "alpha") == {
        command_id_for(saga_id, "root", 0, compensation=False): "apply"
    }
    assert await _effects(cluster, saga_id, "beta") == {
        command_id_for(saga_id, name, 0, compensation=False): "apply" for name in names
    }
    await _replays(cluster, GraphFanOut, saga_id, SagaStatus.COMPLETED)


@pytest.fixture
async def guarded(cluster: Cluster) -> Cluster:
    """The ledger participants, run by ``graph_app``'s main (they answer
    ``GuardedRevert``), alpha and beta refusing reverts until a test opens them."""
    conn = await asyncpg.connect(cluster.database_dsn)
    try:
        for name in ("alpha", "beta", "gamma"):
            await conn.execute(f'SET search_path TO "{cluster.participant_schema(name)}"')
            await conn.execute(UNDO_CLOSED_DDL)
            if name != "gamma":
                await conn.execute("INSERT INTO undo_closed VALUES ('closed by the test')")
    finally:
        await conn.close()
    for name in ("alpha", "beta", "gamma"):
        cluster._spawn(
            f"participant-{name}",
            ["-m", "tests.internal.e2e.graph_app", "participant", name],
            cluster.env(SAGA_PARTICIPANT__DB_SCHEMA=cluster.participant_schema(name)),
        )
    return cluster


async def _open_undo(cluster: Cluster, participant: str) -> None:
    conn = await asyncpg.connect(cluster.database_dsn)
    try:
        schema = cluster.participant_schema(participant)
        await conn.execute(f'DELETE FROM "{schema}".undo_closed')
    finally:
        await conn.close()


async def _detail(cluster: Cluster, port: int, saga_id: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:

        async def get() -> dict[str, Any] | str:
            try:
                answer = await http.get(f"/sagas/{saga_id}")
            except httpx.TransportError as exc:
                return repr(exc)
            return answer.json() if answer.status_code == 200 else answer.text

        found = await eventually(
            get,
            until=lambda got: isinstance(got, dict),
            timeout=60,
            interval=0.3,
            what=f"GET /sagas/{saga_id}",
            context=lambda: cluster.log_tail("engine"),
        )
    assert isinstance(found, dict)
    return found


async def _compensations(cluster: Cluster, port: int, saga_id: str) -> tuple[str, dict[str, str]]:
    """The saga's status and its pending compensations' states, by step (admin API)."""
    detail = await _detail(cluster, port, saga_id)
    return detail["status"], {p["step"]: p["state"] for p in detail["pending_compensations"]}


async def _wait_compensations(
    cluster: Cluster, port: int, saga_id: str, want: tuple[str, dict[str, str]]
) -> None:
    await eventually(
        lambda: _compensations(cluster, port, saga_id),
        until=lambda got: got == want,
        timeout=90,
        interval=0.3,
        what=f"{saga_id}'s status and compensations to be {want}",
        context=cluster.logs_tail,
    )


async def _retry(cluster: Cluster, port: int, saga_id: str, step: str) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:

        async def post() -> httpx.Response | str:
            try:
                return await http.post(
                    f"/sagas/{saga_id}/retry", json={"step": step, "reason": "participant fixed"}
                )
            except httpx.TransportError as exc:
                return repr(exc)

        answer = await eventually(
            post,
            until=lambda got: isinstance(got, httpx.Response) and got.status_code == 200,
            timeout=60,
            interval=0.3,
            what=f"POST retry {step} to answer 200",
            context=lambda: cluster.log_tail("engine"),
        )
    assert isinstance(answer, httpx.Response)


async def _both_stuck(cluster: Cluster, amount: int) -> tuple[int, str]:
    """Starts an engine serving its admin API on a free port and a ``GraphStuckUndo``;
    returns the port and the saga's id once left's and right's reverts, undone at once,
    were both refused: both stuck."""
    port = _free_port()
    _start_engine(cluster, port)
    async with SagaClient(cluster.settings) as client:
        saga_id = await client.start(GraphStuckUndo, GraphOrder(amount=amount))
    both = ("compensation_stuck", {"left": "stuck", "right": "stuck"})
    await _wait_compensations(cluster, port, saga_id, both)
    return port, saga_id


async def test_two_stuck_compensations_are_retried_one_at_a_time(guarded: Cluster) -> None:
    cluster = guarded
    port, saga_id = await _both_stuck(cluster, 3)

    # alpha is fixed and left retried: left is undone, right stays stuck.
    await _open_undo(cluster, "alpha")
    await _retry(cluster, port, saga_id, "left")
    right_only = ("compensation_stuck", {"right": "stuck"})
    await _wait_compensations(cluster, port, saga_id, right_only)

    # A new engine finds right still stuck, and left undone.
    cluster.kill("engine")
    _start_engine(cluster, port)
    await _wait_compensations(cluster, port, saga_id, right_only)

    await _open_undo(cluster, "beta")
    await _retry(cluster, port, saga_id, "right")
    assert await cluster.wait_settled([saga_id]) == {saga_id: SagaStatus.COMPENSATED}, (
        cluster.log_tail("engine")
    )

    # Each step applied once and reverted once (the refused reverts left no row), under
    # the id of the generation after the refused one; last refused, so not applied.
    for name, participant in STUCK_NODES.items():
        want = {}
        if name != "last":
            want = {
                command_id_for(saga_id, name, 0, compensation=False): "apply",
                command_id_for(saga_id, name, 1, compensation=True): "revert",
            }
        assert await _effects(cluster, saga_id, participant) == want, name
    history = await _history(cluster, saga_id)
    assert sorted(e.step for e in history if isinstance(e, CompensationStuck)) == [
        "left",
        "right",
    ]
    await _replays(cluster, GraphStuckUndo, saga_id, SagaStatus.COMPENSATED)


async def test_the_second_of_two_stuck_compensations_is_skipped(guarded: Cluster) -> None:
    cluster = guarded
    port, saga_id = await _both_stuck(cluster, 4)
    history = await _history(cluster, saga_id)
    first, second = [e.step for e in history if isinstance(e, CompensationStuck)]

    # The operator reverted the second by hand and skips it: it is no longer owed.
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
        answer = await http.post(
            f"/sagas/{saga_id}/skip", json={"step": second, "reason": "reverted by hand"}
        )
    assert answer.status_code == 200, answer.text
    await _wait_compensations(cluster, port, saga_id, ("compensation_stuck", {first: "stuck"}))
    await _open_undo(cluster, STUCK_NODES[first])
    await _retry(cluster, port, saga_id, first)
    assert await cluster.wait_settled([saga_id]) == {saga_id: SagaStatus.COMPENSATED}
    skipped = {command_id_for(saga_id, second, 0, compensation=False): "apply"}
    assert await _effects(cluster, saga_id, STUCK_NODES[second]) == skipped
    await _replays(cluster, GraphStuckUndo, saga_id, SagaStatus.COMPENSATED)
