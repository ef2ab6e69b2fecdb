"""Hostile input at the engine's edges, over the real servers: a value nested past the
one limit (``MAX_DEPTH``, 254 levels), however deep, or a value Postgres cannot store, is
a 4xx from the admin API and a precise dead letter from the inbox; never a 500, never a
stopped consumer. The start sent after a hostile record is still applied."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from saga_engine import Settings
from saga_engine.protocol import Envelope, MessageType, StartBody, Topics, encode
from tests.edge.conftest import OPERATOR, dead_letters, settled_on, start, status
from tests.served_worker import ServedWorker

pytestmark = pytest.mark.integration

JSON = {**OPERATOR, "Content-Type": "application/json"}
TOO_DEEP = "is nested more than 254 levels deep"


def nested(levels: int) -> bytes:
    """A JSON array nested ``levels`` deep: past 1,024, no parser here reads it."""
    return b"[" * levels + b"]" * levels


def _start(saga_id: str, **body: Any) -> Envelope:
    return Envelope(
        message_type=MessageType.START,
        source="/careless",
        saga_id=saga_id,
        saga_type="edge-checkout",
        subject="edge-checkout",
        body=StartBody(input={"customer": "c"}).model_dump(mode="json") | body,
    )


async def produce_raw(settings: Settings, topic: str, envelope: Envelope, value: bytes) -> None:
    """``envelope``'s key and headers with ``value`` as it is: what a buggy producer sends."""
    key, _, headers = encode(envelope)
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, key=key, headers=headers)
    finally:
        await producer.stop()


async def test_a_record_nested_too_deep_is_dead_lettered_and_the_inbox_goes_on(
    settings: Settings, served: ServedWorker
) -> None:
    """Before, the 5,000-level record raised RecursionError in the inbox consumer's task:
    nothing was dead-lettered, and no later start was ever applied."""
    inbox = Topics.of(settings.kafka).inbox
    # One key: one partition, so the good start comes after both bad ones.
    saga_id = "hostile-1"
    deep = b'{"input": {"customer": ' + nested(5000) + b"}}"
    await produce_raw(settings, inbox, _start(saga_id), deep)
    # Read by the parser (under its 1,024 levels), refused by the storable check: the
    # same reason, the same words.
    await produce_raw(settings, inbox, _start(saga_id), b'{"input": {"x": ' + nested(600) + b"}}")
    await produce_raw(settings, inbox, _start(saga_id), json.dumps(_start("x").body).encode())
    await settled_on(served, saga_id, "running")  # no bank answers: it waits for the charge

    letters = await dead_letters(settings, 2)
    assert [d["dlq_reason"] for d in letters] == ["unstorable_value", "unstorable_value"]
    assert all(TOO_DEEP in d["dlq_detail"] for d in letters), letters
    health = await served.http.get("/health")
    assert health.status_code == 200


async def test_a_fairness_key_postgres_cannot_store_is_dead_lettered_naming_it(
    settings: Settings, served: ServedWorker
) -> None:
    """Before: dead-lettered ``rejected`` with Postgres's message about encodings."""
    inbox = Topics.of(settings.kafka).inbox
    await produce_raw(
        settings,
        inbox,
        _start("fair-nul"),
        json.dumps(_start("x", fairness_key="tenant\u0000").body).encode(),
    )
    [letter] = await dead_letters(settings, 1)
    assert letter["dlq_reason"] == "unstorable_value"
    assert "fairness_key: contains a NUL character" in letter["dlq_detail"]
    assert await status(served, "fair-nul") is None


async def test_a_body_nested_too_deep_is_a_422_on_every_route(
    settings: Settings, served: ServedWorker
) -> None:
    """Before: the start was a 500, the other routes FastAPI's vague 400 ("There was an
    error parsing the body")."""
    saga_id = await start(served)
    await settled_on(served, saga_id, "running")  # no bank answers: it waits for the charge
    deep = nested(5000)
    for method, url, body in (
        ("POST", "/sagas/edge-checkout", b'{"customer": %s}'),
        ("POST", f"/sagas/{saga_id}/signal", b'{"name": "go", "payload": {"a": %s}}'),
        ("POST", f"/sagas/{saga_id}/cancel", b'{"reason": %s}'),
        ("PUT", "/rollouts/edge-checkout", b'{"version": 1, "percent": 1, "reason": %s}'),
        ("POST", "/schedules", b'{"id": "s", "saga": "edge-checkout", "input": %s}'),
    ):
        response = await served.http.request(method, url, content=body % deep, headers=JSON)
        assert response.status_code == 422, (url, response.text)
        [problem] = response.json()["detail"]
        assert problem == {"loc": ["body"], "msg": TOO_DEEP, "type": "unstorable"}, url
    assert await status(served, saga_id) == "running"


async def test_text_and_times_postgres_cannot_take_are_4xx_naming_the_field(
    served: ServedWorker,
) -> None:
    """Before: each of these was a 500 (Postgres refused the NUL, croniter found no date,
    the time had no UTC equivalent)."""

    async def refused(method: str, url: str, **options: Any) -> list[Any]:
        response = await served.http.request(method, url, headers=JSON, **options)
        assert response.status_code == 422, (url, response.text)
        return [p["loc"] for p in response.json()["detail"]]

    rollout = {"version": 1, "percent": 10, "reason": "r"}
    nul_reason = json.dumps({**rollout, "reason": "a\u0000b"}).encode()
    assert await refused("PUT", "/rollouts/edge-checkout", content=nul_reason) == [
        ["body", "reason"]
    ]
    nul_predicate = json.dumps({**rollout, "predicate": "a\u0000b"}).encode()
    assert await refused("PUT", "/rollouts/edge-checkout", content=nul_predicate) == [
        ["body", "predicate"]
    ]
    for action in ("", "/pause", "/resume", "/trigger"):
        method = "GET" if not action else "POST"
        assert await refused(method, f"/schedules/a%00b{action}") == [["path", "schedule_id"]]
    assert await refused("DELETE", "/schedules/a%00b") == [["path", "schedule_id"]]
    assert await refused("GET", "/schedules?after=a%00b") == [["query", "after"]]
    never = {"id": "never", "saga": "edge-checkout", "cron": "0 0 31 2 *", "input": {}}
    assert await refused("POST", "/schedules", content=json.dumps(never).encode()) == [
        ["body", "cron"]
    ]
    for name in ("created_after", "created_before", "updated_after", "updated_before"):
        for when in ("0001-01-01T00:00:00%2B14:00", "9999-12-31T23:59:59-14:00"):
            assert await refused("GET", f"/sagas?{name}={when}") == [["query", name]]
    # Still listed: the edges of the range themselves.
    for when in ("0001-01-01T00:00:00Z", "9999-12-31T23:59:59.999999Z"):
        listed = await served.http.get(f"/sagas?created_after={when}", headers=OPERATOR)
        assert listed.status_code == 200, listed.text
    assert (await served.http.get("/schedules", headers=OPERATOR)).json() == []


async def test_a_refused_field_is_named_once_under_the_body(
    settings: Settings, served: ServedWorker
) -> None:
    """Before: ``["body", "body", "predicate"]`` and ``["body", "a"]``."""
    unknown = {"version": 1, "percent": 10, "predicate": "vip", "reason": "r"}
    response = await served.http.put("/rollouts/edge-checkout", json=unknown, headers=OPERATOR)
    assert response.status_code == 422, response.text
    [problem] = response.json()["detail"]
    assert (problem["loc"], problem["type"]) == (["body", "predicate"], "unknown_predicate")

    saga_id = await start(served)
    await settled_on(served, saga_id, "running")  # no bank answers: it waits for the charge
    wide = b'{"name": "go", "payload": {"ok": true, "a": ' + str(2**70).encode() + b"}}"
    response = await served.http.post(f"/sagas/{saga_id}/signal", content=wide, headers=JSON)
    assert response.status_code == 422, response.text
    [problem] = response.json()["detail"]
    assert problem["loc"] == ["body", "payload", "a"]
    assert "beyond 64 bits" in problem["msg"]
