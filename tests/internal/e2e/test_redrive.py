"""Redrive and pivots (issue 26 §3, §6) on the real servers, with SIGKILLed engines.

A real engine process drives two sagas over the ledger participants until both park as
step_stuck: ``pivoted`` past its pivot (gamma refused), ``parking`` by its policy (beta
refused). The engine is SIGKILLed and restarted: the parks hold, nothing is re-sent, and a
cancel of the pivoted saga is refused (409 "past its pivot" from the admin API, a dead
letter ``not_accepted`` when ``SagaClient.cancel`` sends it over Kafka). An operator's retry with an
edited command is recorded, and the engine is SIGKILLed again before the command leaves
(crash point ``before_send``); restarted, it sends it once. Each participant's own ledger
shows every effect exactly once, and the edited amount. Last, ``SagaClient.rerun`` starts a
linked saga once, which the original's detail lists.
"""

from __future__ import annotations

import signal
import socket
from collections import Counter
from typing import Any

import httpx
import pytest

from saga_engine import PastPivot, SagaStatus
from saga_engine.client import SagaClient
from saga_engine.protocol import Envelope, MessageType, Topics
from tests.edge.conftest import dead_letters, produce
from tests.internal.e2e.harness import Cluster
from tests.internal.e2e.redrive_app import Parking, Pivoted, RedriveRequest
from tests.waiting import eventually

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_engine(cluster: Cluster, port: int, crash_at: str | None = None) -> None:
    extra = {"SAGA_ADMIN__PORT": str(port), "SAGA_ADMIN__HOST": "127.0.0.1"}
    if crash_at:
        extra["SAGA_CRASH_AT"] = crash_at
    cluster._spawn(
        "engine",
        ["-m", "saga_engine", "worker", "tests.internal.e2e.redrive_app", "--log-level", "INFO"],
        cluster.env(**extra),
    )


async def _post(
    cluster: Cluster, port: int, path: str, body: dict[str, Any], *, want: int = 200
) -> httpx.Response:
    """POSTs to the engine's admin API until it answers ``want`` (it may still be starting,
    or not own the saga's partition yet), within a deadline."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:

        async def post() -> httpx.Response | str:
            try:
                return await http.post(path, json=body)
            except httpx.TransportError as exc:
                return repr(exc)

        answer = await eventually(
            post,
            until=lambda got: isinstance(got, httpx.Response) and got.status_code == want,
            timeout=60,
            interval=0.3,
            what=f"POST {path} to answer {want}",
            context=lambda: cluster.log_tail("engine"),
        )
    assert isinstance(answer, httpx.Response)
    return answer


async def _wait_status(cluster: Cluster, saga_id: str, status: SagaStatus) -> None:
    await eventually(
        lambda: cluster.statuses([saga_id]),
        until=lambda found: found.get(saga_id) == status,
        timeout=90,
        interval=0.2,
        what=f"{saga_id} to be {status.value}",
        context=lambda: cluster.log_tail("engine"),
    )


async def _applied(cluster: Cluster, participant: str, saga_id: str) -> list[tuple[str, int]]:
    rows = await cluster.ledger(participant)
    per_command = Counter(r["command_id"] for r in rows)
    assert all(n == 1 for n in per_command.values()), f"{participant}: {per_command}"
    conn_rows = [r for r in rows if r["saga_id"] == saga_id]
    amounts = await _amounts(cluster, participant, saga_id)
    return [(r["kind"], amounts[r["command_id"]]) for r in conn_rows]


async def _amounts(cluster: Cluster, participant: str, saga_id: str) -> dict[str, int]:
    import asyncpg

    conn = await asyncpg.connect(cluster.database_dsn)
    try:
        rows = await conn.fetch(
            f'SELECT command_id, amount FROM "{cluster.participant_schema(participant)}".ledger '
            "WHERE saga_id = $1",
            saga_id,
        )
    finally:
        await conn.close()
    return {r["command_id"]: r["amount"] for r in rows}


async def test_parks_hold_across_sigkill_and_an_edited_retry_applies_once(
    participants_up: Cluster,
) -> None:
    cluster = participants_up
    port = _free_port()
    _start_engine(cluster, port)
    async with SagaClient(cluster.settings) as client:
        pivoted = await client.start(
            Pivoted, RedriveRequest(amount=10, refuse="gamma"), idempotency_key="pivoted"
        )
        parking = await client.start(
            Parking, RedriveRequest(amount=20, refuse="beta"), idempotency_key="parking"
        )
    await _wait_status(cluster, pivoted, SagaStatus.STEP_STUCK)
    await _wait_status(cluster, parking, SagaStatus.STEP_STUCK)
    sent_before = sorted(await cluster.commands_in_topic("gamma"))

    cluster.kill("engine")
    _start_engine(cluster, port, crash_at="before_send:1")
    # The restarted engine keeps both parks and refuses a cancel past the pivot.
    refused = await _post(
        cluster, port, f"/sagas/{pivoted}/cancel", {"reason": "too late"}, want=409
    )
    assert "past its pivot" in refused.text
    # The client says the same before sending anything: the history says it is past its
    # pivot. A record that reaches the inbox anyway is a dead letter with its reason.
    async with SagaClient(cluster.settings) as client:
        with pytest.raises(PastPivot, match="past its pivot"):
            await client.cancel(pivoted, "too late, over Kafka")
    await produce(
        cluster.settings,
        Topics.of(cluster.settings.kafka).inbox,
        Envelope(
            message_type=MessageType.CANCEL,
            source="/late",
            saga_id=pivoted,
            body={"reason": "too late, over Kafka", "principal": "system"},
        ),
    )
    [dead] = await dead_letters(cluster.settings, 1)
    assert dead["dlq_reason"] == "not_accepted"
    assert "past its pivot" in dead["dlq_detail"]
    assert (await cluster.statuses([pivoted, parking])) == {
        pivoted: SagaStatus.STEP_STUCK,
        parking: SagaStatus.STEP_STUCK,
    }
    assert sorted(await cluster.commands_in_topic("gamma")) == sent_before  # nothing re-sent
    # A command the step's model refuses is a 422, and nothing is recorded.
    bad = await _post(
        cluster,
        port,
        f"/sagas/{pivoted}/retry",
        {"step": "apply-gamma", "reason": "typo", "command": {"amount": "ten"}},
        want=422,
    )
    assert "amount" in bad.text
    # The edited retry is recorded; the engine dies before its command leaves.
    edited = {"amount": 11, "refuse": False}
    with pytest.raises((httpx.TransportError, TimeoutError)):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            await http.post(
                f"/sagas/{pivoted}/retry",
                json={"step": "apply-gamma", "reason": "gamma reopened", "command": edited},
            )
    assert await cluster.wait_exit("engine") == -signal.SIGKILL
    assert "crash point before_send reached" in cluster.log_tail("engine")

    _start_engine(cluster, port)
    await _wait_status(cluster, pivoted, SagaStatus.COMPLETED)
    await _post(
        cluster,
        port,
        f"/sagas/{parking}/retry",
        {"step": "apply-beta", "reason": "limit raised", "command": {"amount": 21}},
    )
    await _wait_status(cluster, parking, SagaStatus.COMPLETED)

    # Each effect once, in the participants' own tables; the edited amounts applied.
    assert await _applied(cluster, "alpha", pivoted) == [("apply", 10)]
    assert await _applied(cluster, "beta", pivoted) == [("apply", 10)]
    assert await _applied(cluster, "gamma", pivoted) == [("apply", 11)]
    assert await _applied(cluster, "alpha", parking) == [("apply", 20)]
    assert await _applied(cluster, "beta", parking) == [("apply", 21)]

    # A rerun through SagaClient: a new saga of the same type, linked, started once.
    async with SagaClient(cluster.settings) as client:
        again = RedriveRequest(amount=30)
        rerun = await client.rerun(pivoted, Pivoted, reason="once more", input=again)
        assert await client.rerun(pivoted, Pivoted, reason="once more", input=again) == rerun
        assert rerun != pivoted
        await client.result(rerun, timeout=60)
    first = await _first_event(cluster, rerun)
    assert first["rerun_of"] == {"saga_id": pivoted, "principal": "system", "reason": "once more"}
    for participant in ("alpha", "beta", "gamma"):
        assert await _applied(cluster, participant, rerun) == [("apply", 30)]
    # The original's page lists it (found through the sagas' search index).
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
        original = (await http.get(f"/sagas/{pivoted}")).json()
    assert original["reruns"] == [{"saga_id": rerun, "status": "completed"}]


async def _first_event(cluster: Cluster, saga_id: str) -> dict[str, Any]:
    import asyncpg
    import orjson

    conn = await asyncpg.connect(cluster.database_dsn)
    try:
        data = await conn.fetchval(
            f'SELECT data FROM "{cluster.schema}".saga_events WHERE saga_id = $1 AND seq = 1',
            saga_id,
        )
    finally:
        await conn.close()
    value: dict[str, Any] = orjson.loads(data) if isinstance(data, str | bytes) else data
    return value
