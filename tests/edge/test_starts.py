"""Starts: a value Postgres cannot store is refused before anything is sent (422 from the
API, an exception from the client, a precise dead letter from the inbox); an
Idempotency-Key reused with another body is a 409 naming the saga it started; a client
that goes away mid-body costs one WARNING line. Over the real servers."""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid
from typing import Any
from urllib.parse import urlsplit

import pytest

from saga_engine import InvalidPayload, Settings, UnstorableValue, saga_id_for
from saga_engine.client import SagaClient
from saga_engine.protocol import Envelope, MessageType, StartBody, Topics
from tests.edge.conftest import (
    OPERATOR,
    Checkout,
    dead_letters,
    events,
    produce,
    status,
    topic_size,
)
from tests.served_worker import OPERATOR_TOKEN, ServedWorker
from tests.waiting import eventually

pytestmark = pytest.mark.integration


async def test_a_start_postgres_cannot_store_is_refused_everywhere(
    settings: Settings, served: ServedWorker
) -> None:
    inbox = Topics.of(settings.kafka).inbox
    for body, loc, error in (
        ({"customer": "a\u0000b"}, ["body", "customer"], "UnstorableValue"),
        ({"customer": "\ud800"}, ["body", "customer"], "UnstorableValue"),
        # Too big for the model's int (and for JSON in Postgres): named all the same.
        ({"customer": "a", "amount": 2**70}, ["body", "amount"], "InvalidPayload"),
    ):
        response = await served.http.post(
            "/sagas/edge-checkout",
            content=_json(body),
            headers={**OPERATOR, "Content-Type": "application/json"},
        )
        assert response.status_code == 422, response.text
        assert response.json()["error"] == error
        assert response.json()["detail"][0]["loc"] == loc
    nan = await served.http.post(
        "/sagas/edge-checkout",
        content=b'{"customer": "a", "amount": NaN}',
        headers={**OPERATOR, "Content-Type": "application/json"},
    )
    assert nan.status_code == 400  # NaN is not JSON
    assert "malformed JSON" in nan.json()["detail"]
    model = await served.http.post("/sagas/edge-checkout", json={"customer": ""}, headers=OPERATOR)
    assert model.status_code == 422
    assert model.json()["detail"][0]["loc"] == ["body", "customer"]
    assert await topic_size(settings, inbox) == 0  # nothing was sent to the engines

    async with SagaClient(settings) as client:
        with pytest.raises(UnstorableValue, match="customer"):
            await client.start(Checkout, {"customer": "a\u0000b"})
        with pytest.raises(InvalidPayload, match="customer"):
            await client.start(Checkout, {"customer": ""})
        with pytest.raises(UnstorableValue, match="customer"):
            await client.start("edge-checkout", {"customer": "a\u0000b"})
    assert await topic_size(settings, inbox) == 0

    # A producer that checks nothing: the engine dead-letters it, saying why.
    saga_id = "from-a-careless-producer"
    await produce(
        settings,
        inbox,
        Envelope(
            message_type=MessageType.START,
            source="/careless",
            saga_id=saga_id,
            saga_type="edge-checkout",
            subject="edge-checkout",
            body=StartBody(input={"customer": "a\u0000b"}).model_dump(mode="json"),
        ),
    )
    # A deadline no date can hold (it used to fail in the engine, as engine_error).
    far = StartBody(input={"customer": "c"}).model_dump(mode="json") | {"deadline_s": 1e12}
    await produce(
        settings,
        inbox,
        Envelope(
            message_type=MessageType.START,
            source="/careless",
            saga_id="far-future",
            saga_type="edge-checkout",
            subject="edge-checkout",
            body=far,
        ),
    )
    # Keyed by different sagas, they may sit in different partitions: in any order.
    by_reason = {d["dlq_reason"]: d for d in await dead_letters(settings, 2)}
    letter, late = by_reason["unstorable_value"], by_reason["invalid_body"]
    assert "customer: contains a NUL character" in letter["dlq_detail"]
    assert "deadline_s" in late["dlq_detail"]
    assert await status(served, "far-future") is None
    assert await status(served, saga_id) is None
    listing = (await served.http.get("/sagas", headers=OPERATOR)).json()
    assert listing["items"] == []


def _json(value: Any) -> bytes:
    """JSON the way a client may send it: with escapes orjson would refuse to write."""
    import json

    return json.dumps(value).encode()


async def test_an_idempotency_key_names_one_request(
    settings: Settings, served: ServedWorker
) -> None:
    key = {"Idempotency-Key": f"order-{uuid.uuid4()}"}
    first = await served.http.post(
        "/sagas/edge-checkout", json={"customer": "c-1"}, headers={**OPERATOR, **key}
    )
    assert first.status_code == 202, first.text
    saga_id = first.json()["saga_id"]
    assert "Idempotent-Replayed" not in first.headers

    again = await served.http.post(
        "/sagas/edge-checkout",
        json={"customer": "c-1", "amount": 1},  # the same request, with the default spelt out
        headers={**OPERATOR, **key},
    )
    assert again.status_code == 202, again.text
    assert again.json()["saga_id"] == saga_id
    assert again.headers["Idempotent-Replayed"] == "true"
    history = await events(served, saga_id)

    other = await served.http.post(
        "/sagas/edge-checkout", json={"customer": "c-2"}, headers={**OPERATOR, **key}
    )
    assert other.status_code == 409, other.text
    assert other.json()["error"] == "IdempotencyConflict"
    assert other.json()["saga_id"] == saga_id
    assert saga_id in other.json()["detail"]
    assert await events(served, saga_id) == history
    # Recorded with its defaults filled in once (the reference the saga will always see).
    recorded = history[0]["input"]
    assert (recorded["customer"], recorded["amount"]) == ("c-1", 1)
    assert len(recorded["reference"]) == 32


async def test_two_requests_racing_with_one_key_get_one_saga_and_one_conflict(
    settings: Settings, served: ServedWorker
) -> None:
    key = {"Idempotency-Key": f"race-{uuid.uuid4()}"}
    answers = await asyncio.gather(
        *(
            served.http.post(
                "/sagas/edge-checkout", json={"customer": who}, headers={**OPERATOR, **key}
            )
            for who in ("c-a", "c-b")
        )
    )
    assert sorted(a.status_code for a in answers) == [202, 409], [a.text for a in answers]
    [won] = [a for a in answers if a.status_code == 202]
    [lost] = [a for a in answers if a.status_code == 409]
    assert lost.json()["saga_id"] == won.json()["saga_id"]
    history = await events(served, won.json()["saga_id"])
    winner = history[0]["input"]["customer"]
    assert winner in ("c-a", "c-b")
    # The loser's start reached the inbox and was dead-lettered there, naming why.
    [letter] = await dead_letters(settings, 1)
    assert letter["dlq_reason"] == "idempotency_conflict"
    assert won.json()["saga_id"] in letter["dlq_detail"]


async def test_a_start_reusing_a_key_on_the_inbox_is_dead_lettered(
    settings: Settings, served: ServedWorker
) -> None:
    inbox = Topics.of(settings.kafka).inbox
    async with SagaClient(settings) as client:
        saga_id = await client.start(Checkout, {"customer": "c-1"}, idempotency_key="k-1")
        await eventually(lambda: status(served, saga_id))
        assert await client.start(Checkout, {"customer": "c-1"}, idempotency_key="k-1") == saga_id
        assert await client.start(Checkout, {"customer": "c-9"}, idempotency_key="k-1") == saga_id
    [letter] = await dead_letters(settings, 1)
    assert letter["dlq_reason"] == "idempotency_conflict"
    assert saga_id_for("edge-checkout", "k-1") == saga_id
    assert (await events(served, saga_id))[0]["input"]["customer"] == "c-1"
    assert await topic_size(settings, inbox) >= 3


async def test_a_client_gone_mid_body_is_one_warning_line(
    served: ServedWorker, caplog: pytest.LogCaptureFixture
) -> None:
    url = urlsplit(served.url)
    request = (
        "POST /sagas/edge-checkout HTTP/1.1\r\n"
        f"Host: {url.netloc}\r\n"
        f"Authorization: Bearer {OPERATOR_TOKEN}\r\n"
        "Content-Type: application/json\r\n"
        "Content-Length: 1000\r\n\r\n"
        '{"customer": "c-'
    ).encode()
    caplog.set_level(logging.DEBUG)
    loop = asyncio.get_running_loop()
    sock = socket.create_connection((url.hostname, url.port))
    try:
        await loop.sock_sendall(sock, request)
    finally:
        sock.close()

    def warned() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "went away" in r.getMessage()]

    [warning] = await eventually(warned)
    assert warning.levelno == logging.WARNING
    assert warning.exc_info is None
    assert "POST /sagas/edge-checkout" in warning.getMessage()
    # Nothing louder, and no traceback anywhere.
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert not any(r.exc_info for r in caplog.records if r.name.startswith(("saga", "uvicorn")))
    # The server is fine: the next request is answered.
    health = await served.http.get("/health")
    assert health.status_code == 200
