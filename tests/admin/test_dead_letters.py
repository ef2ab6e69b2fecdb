"""The admin API's dead letters over the real servers: a worker (Postgres, Kafka, its
admin API on uvicorn) dead-letters malformed records of its inbox; the API lists them,
shows one whole, and replays it to its origin topic or to another saga, as operators
only, audited."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from saga_engine import Settings
from saga_engine.protocol import Envelope, MessageType, StartBody, Topics, encode
from tests.conftest import PgTarget
from tests.edge.conftest import Checkout
from tests.served_worker import (
    OPERATOR_TOKEN,
    READER_TOKEN,
    ServedWorker,
    real_settings,
    served_worker,
)
from tests.waiting import eventually

pytestmark = pytest.mark.integration

OPERATOR = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
READER = {"Authorization": f"Bearer {READER_TOKEN}"}
#: Longer than the list's preview: the detail has it whole.
BROKEN = b'{"input": {"customer": "' + b"x" * 500 + b'"'


@pytest.fixture
def settings(pg: PgTarget, kafka_bootstrap: str, unique_id: str) -> Settings:
    return real_settings(pg, kafka_bootstrap, unique_id)


@pytest.fixture
async def served(settings: Settings) -> AsyncIterator[ServedWorker]:
    async with served_worker(settings, [Checkout]) as running:
        yield running


def _start(saga_id: str, saga_type: str = "edge-checkout") -> Envelope:
    return Envelope(
        message_type=MessageType.START,
        source="/careless",
        saga_id=saga_id,
        saga_type=saga_type,
        subject=saga_type,
        body=StartBody(input={"customer": "c"}).model_dump(mode="json"),
    )


async def produce(
    settings: Settings, topic: str, value: bytes, key: bytes, headers: list[tuple[str, bytes]]
) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, key=key, headers=headers)
    finally:
        await producer.stop()


async def produce_bad_starts(settings: Settings) -> None:
    """A start whose body is not JSON, then one of a saga type nobody deploys: both are
    dead-lettered by the worker's inbox."""
    inbox = Topics.of(settings.kafka).inbox
    key, _, headers = encode(_start("dl-broken"))
    await produce(settings, inbox, BROKEN, key or b"", headers)
    key, value, headers = encode(_start("dl-unknown", saga_type="nobody-runs-this"))
    await produce(settings, inbox, value, key or b"", headers)


async def listed(served: ServedWorker, count: int, query: str = "") -> list[dict[str, Any]]:
    async def enough() -> list[dict[str, Any]] | None:
        response = await served.http.get(f"/dead-letters{query}", headers=READER)
        assert response.status_code == 200, response.text
        rows: list[dict[str, Any]] = response.json()
        return rows if len(rows) >= count else None

    rows: list[dict[str, Any]] = await eventually(enough)
    return rows


async def record_at(settings: Settings, topic: str, partition: int, offset: int) -> Any:
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka.bootstrap_servers, group_id=None)
    await consumer.start()
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, offset)
        return await consumer.getone(tp)
    finally:
        await consumer.stop()


async def test_the_dead_letters_are_listed_newest_first_and_shown_whole(
    settings: Settings, served: ServedWorker
) -> None:
    await produce_bad_starts(settings)
    rows = await listed(served, 2)
    assert [r["reason"] for r in rows] == ["unknown_saga_type", "malformed_json"]
    broken = rows[1]
    inbox = Topics.of(settings.kafka).inbox
    assert broken["saga_id"] == "dl-broken"
    assert broken["origin_topic"] == inbox
    assert broken["saga_url"] == "/sagas/dl-broken"
    assert broken["size"] == len(BROKEN)
    assert broken["payload_preview"].endswith("…")
    assert len(broken["payload_preview"]) == 201
    assert "nobody-runs-this" in rows[0]["detail"]

    assert [r["saga_id"] for r in await listed(served, 1, "?limit=1")] == ["dl-unknown"]
    only = await listed(served, 1, "?reason=malformed_json")
    assert [r["saga_id"] for r in only] == ["dl-broken"]
    assert [r["reason"] for r in await listed(served, 1, "?saga_id=dl-unknown")] == [
        "unknown_saga_type"
    ]
    none = await served.http.get("/dead-letters?reason=oversized", headers=READER)
    assert none.json() == []

    one = await served.http.get(
        f"/dead-letters/{broken['partition']}/{broken['offset']}", headers=READER
    )
    assert one.status_code == 200, one.text
    whole = one.json()
    assert whole["payload"] == BROKEN.decode()
    assert whole["key"] == "dl-broken"
    headers = {h["name"]: h["value"] for h in whole["headers"]}
    assert headers["dlq_reason"] == "malformed_json"
    assert headers["ce_type"] == "saga.start"


async def test_a_replay_goes_back_to_its_origin_or_to_another_saga_audited(
    settings: Settings, served: ServedWorker, caplog: pytest.LogCaptureFixture
) -> None:
    await produce_bad_starts(settings)
    broken = (await listed(served, 1, "?reason=malformed_json"))[0]
    where = f"/dead-letters/{broken['partition']}/{broken['offset']}/replay"
    inbox = Topics.of(settings.kafka).inbox

    caplog.set_level(logging.INFO, logger="saga_engine.admin.audit")
    back = await served.http.post(where, json={"reason": "fixed the producer"}, headers=OPERATOR)
    assert back.status_code == 200, back.text
    sent = back.json()
    assert (sent["topic"], sent["saga_id"], sent["principal"]) == (inbox, "dl-broken", "olivia")
    record = await record_at(settings, inbox, sent["partition"], sent["offset"])
    assert (record.key, record.value) == (b"dl-broken", BROKEN)
    assert not [k for k, _ in record.headers if k.startswith("dlq_")]
    assert any(
        "replayed to" in r.getMessage()
        and "olivia" in r.getMessage()
        and "fixed the producer" in r.getMessage()
        for r in caplog.records
    )
    # The engine read it again: still not JSON, so dead-lettered once more.
    assert len(await listed(served, 2, "?reason=malformed_json")) == 2

    moved = await served.http.post(
        where, json={"reason": "for its twin", "saga_id": "dl-twin"}, headers=OPERATOR
    )
    assert moved.status_code == 200, moved.text
    assert (moved.json()["topic"], moved.json()["saga_id"]) == (inbox, "dl-twin")
    record = await record_at(settings, inbox, moved.json()["partition"], moved.json()["offset"])
    assert record.key == b"dl-twin"
    assert dict(record.headers)["ce_sagaid"] == b"dl-twin"


async def test_readers_may_look_but_not_replay_and_bad_input_is_a_4xx(
    settings: Settings, served: ServedWorker
) -> None:
    await produce_bad_starts(settings)
    row = (await listed(served, 2))[0]
    where = f"/dead-letters/{row['partition']}/{row['offset']}"
    refused = await served.http.post(f"{where}/replay", json={"reason": "r"}, headers=READER)
    assert refused.status_code == 403, refused.text
    page = await served.http.get(f"/ui{where}", headers=READER)
    assert page.status_code == 200
    assert "dlq-payload" in page.text
    assert 'id="dlq-replay"' not in page.text  # no replay form for a reader
    assert 'id="dlq-replay"' in (await served.http.get(f"/ui{where}", headers=OPERATOR)).text

    for query in ("?limit=0", "?limit=1001", "?limit=x"):
        bad = await served.http.get(f"/dead-letters{query}", headers=READER)
        assert bad.status_code == 422, (query, bad.text)
    missing = await served.http.get(f"/dead-letters/{row['partition']}/99999", headers=READER)
    assert missing.status_code == 404
    assert "no dead-lettered record at offset 99999" in missing.json()["detail"]
    assert (await served.http.get("/dead-letters/7/0", headers=READER)).status_code == 404
    assert (await served.http.get("/dead-letters/-1/0", headers=READER)).status_code == 422
    no_reason = await served.http.post(f"{where}/replay", json={}, headers=OPERATOR)
    assert no_reason.status_code == 422
    blank = await served.http.post(f"{where}/replay", json={"reason": "  "}, headers=OPERATOR)
    assert blank.status_code == 422
    gone = await served.http.post(
        f"/dead-letters/{row['partition']}/99999/replay", json={"reason": "r"}, headers=OPERATOR
    )
    assert gone.status_code == 404


async def test_a_record_without_an_origin_is_a_409_unless_sent_to_a_saga(
    settings: Settings, served: ServedWorker
) -> None:
    """A dead letter with no ``dlq_topic`` header (or one naming the dead-letter topic)
    has nowhere to go back to."""
    dlq = Topics.of(settings.kafka).dlq
    await produce(settings, dlq, b"{}", b"k", [("dlq_reason", b"rejected")])
    await produce(
        settings, dlq, b"{}", b"k", [("dlq_reason", b"loop"), ("dlq_topic", dlq.encode())]
    )
    rows = await listed(served, 2)
    for row in rows:
        where = f"/dead-letters/{row['partition']}/{row['offset']}/replay"
        answer = await served.http.post(where, json={"reason": "try"}, headers=OPERATOR)
        assert answer.status_code == 409, answer.text
        assert answer.json()["error"] == "DeadLetterNotReplayable"
    nowhere = next(r for r in rows if r["reason"] == "rejected")
    where = f"/dead-letters/{nowhere['partition']}/{nowhere['offset']}/replay"
    sent = await served.http.post(
        where, json={"reason": "its saga", "saga_id": "s-1"}, headers=OPERATOR
    )
    assert sent.status_code == 200, sent.text
    assert sent.json()["topic"] == Topics.of(settings.kafka).inbox
