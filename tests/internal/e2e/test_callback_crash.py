"""A callback across an engine crash (issue 41 section 2): real engine and participant
processes, a fake KYC vendor (a tiny HTTP server in the test) that answers 202 at once
and posts its verdict later to the URL the step sent it, and a SIGKILL of the engine
between the 202 and that call.

The step's request and its wait are recorded before the request leaves; the 202 is
recorded as the step's reply. The vendor's call reaches the restarted engine (the URL
was derived from the history, so the new process takes it), is recorded once, and the
saga goes on: the vendor was asked once, beta applied its step once, a repeat of the
call gets the same answer and another body a 409."""

from __future__ import annotations

import asyncio
import json
import socket
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from saga_engine import CallbackSettings, SagaStatus
from saga_engine.client import SagaClient
from saga_engine.events import CallbackReceived, ReplyReceived
from saga_engine.replay import HistoryExport, replay
from tests.internal.e2e.callback_app import KycCheck, KycOrder
from tests.internal.e2e.harness import Cluster
from tests.internal.e2e.test_graph_crash import _history
from tests.waiting import eventually

pytestmark = pytest.mark.integration

APP = "tests.internal.e2e.callback_app:SAGAS"
KEYS = {"e2e": "e2e-callback-key-" + "7" * 32}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class FakeVendor:
    """Answers every request 202 and keeps what it was asked (its effects)."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    port: int = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {
            k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:] if h)
        }
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        self.requests.append(
            {"line": lines[0], "headers": headers, "body": json.loads(body or b"{}")}
        )
        writer.write(
            b"HTTP/1.1 202 Accepted\r\ncontent-type: application/json\r\n"
            b"content-length: 17\r\nconnection: close\r\n\r\n" + b'{"queued": true} '
        )
        await writer.drain()
        writer.close()

    async def start(self) -> asyncio.Server:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        return server


def _start_engine(cluster: Cluster, admin_port: int, vendor_port: int) -> None:
    extra = {
        "SAGA_ADMIN__PORT": str(admin_port),
        "SAGA_ADMIN__HOST": "127.0.0.1",
        "SAGA_HTTP__ENDPOINTS": json.dumps({"vendor": f"http://127.0.0.1:{vendor_port}"}),
        "SAGA_CALLBACKS__KEYS": json.dumps(KEYS),
        "SAGA_CALLBACKS__BASE_URL": f"http://127.0.0.1:{admin_port}",
    }
    cluster._spawn(
        "engine", ["-m", "saga_engine", "worker", APP, "--log-level", "INFO"], cluster.env(**extra)
    )


async def _post_until_taken(url: str, body: dict[str, Any]) -> httpx.Response:
    """The vendor's call, retried as a webhook sender retries: until an answer that is
    not a refused connection or a 5xx (the engine restarting)."""
    async with httpx.AsyncClient(timeout=10) as http:

        async def attempt() -> httpx.Response | None:
            try:
                response = await http.post(url, json=body)
            except httpx.TransportError:
                return None
            return response if response.status_code < 500 else None

        return await eventually(attempt, timeout=90, interval=0.5, what="the callback taken")


async def test_engine_killed_between_the_202_and_the_callback(cluster: Cluster) -> None:
    vendor = FakeVendor()
    server = await vendor.start()
    admin_port = _free_port()
    try:
        _start_engine(cluster, admin_port, vendor.port)
        async with SagaClient(cluster.settings) as client:
            saga_id = await client.start(KycCheck, KycOrder(order="o-17"))
        # The vendor answered 202 and its answer is recorded as the step's reply.
        await eventually(
            lambda: len(vendor.requests),
            until=lambda n: n == 1,
            timeout=60,
            what="the vendor's request",
        )

        async def replied() -> bool:
            return any(isinstance(e, ReplyReceived) for e in await _history(cluster, saga_id))

        await eventually(replied, until=bool, timeout=60, what="the 202 recorded")
        cluster.kill("engine")  # SIGKILL: between the 202 and the callback

        [request] = vendor.requests
        url = request["headers"]["saga-callback-url"]
        assert url.startswith(f"http://127.0.0.1:{admin_port}/callbacks/")
        assert request["line"] == "POST /checks HTTP/1.1"
        assert request["body"] == {"order": "o-17"}
        kinds = [e.kind for e in await _history(cluster, saga_id)]
        assert kinds.index("callback_awaited") < kinds.index("command_issued")

        _start_engine(cluster, admin_port, vendor.port)
        cluster.start_participant("beta")
        taken = await _post_until_taken(url, {"approved": True, "score": 42})
        assert taken.status_code == 200, taken.text
        repeat = await _post_until_taken(url, {"approved": True, "score": 42})
        assert (repeat.status_code, repeat.json()) == (200, taken.json())
        other = await _post_until_taken(url, {"approved": False, "score": 0})
        assert other.status_code == 409
        assert await cluster.wait_settled([saga_id]) == {saga_id: SagaStatus.COMPLETED}, (
            cluster.logs_tail()
        )
    finally:
        server.close()

    # Effects, counted: the vendor asked once, the callback recorded once, beta once.
    assert len(vendor.requests) == 1
    history = await _history(cluster, saga_id)
    assert [e.payload for e in history if isinstance(e, CallbackReceived)] == [
        {"approved": True, "score": 42}
    ]
    beta = [r for r in await cluster.ledger("beta") if r["saga_id"] == saga_id]
    assert [r["kind"] for r in beta] == ["apply"]
    assert history[-1].output == {"approved": True, "score": 42}
    keys = CallbackSettings.model_validate({"keys": KEYS})
    result = replay([KycCheck], HistoryExport(saga_id, KycCheck.name, history), callbacks=keys)
    assert result.deterministic, result.error
