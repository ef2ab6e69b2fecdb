"""`saga cancel`, `dlq list` and `dlq replay` against the real Kafka (and `saga signal`'s
local checks: it goes through the admin API, see tests/edge)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from saga_engine.settings import KafkaSettings
from tests.cli.conftest import as_json, invoke, one_line_error
from tests.conftest import TopicFactory
from tests.integration.kafka_helpers import read_topic

pytestmark = pytest.mark.integration


def _headers(record: Any) -> dict[str, str]:
    return {k: bytes(v).decode() for k, v in record.headers}


def _env(kafka_bootstrap: str, prefix: str) -> dict[str, str]:
    return {
        "SAGA_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
        "SAGA_KAFKA__TOPIC_PREFIX": prefix,
        "SAGA_KAFKA__PARTITIONS": "2",
    }


async def _topics(kafka_topic: TopicFactory) -> str:
    """Creates {prefix}.inbox and {prefix}.dlq (deleted after the test); returns the prefix."""
    inbox = await kafka_topic("inbox", partitions=2)
    await kafka_topic("dlq", partitions=2)
    return inbox.removesuffix(".inbox")


@pytest.fixture
async def prefix(kafka_topic: TopicFactory) -> str:
    return await _topics(kafka_topic)


def test_a_bad_payload_is_one_line_error(kafka_bootstrap: str, prefix: str) -> None:
    env = _env(kafka_bootstrap, prefix)
    assert "--payload is not valid JSON" in one_line_error(
        invoke(["signal", "s", "n", "--payload", "{oops"], env)
    )
    assert "must be a JSON object" in one_line_error(
        invoke(["signal", "s", "n", "--payload", "[1]"], env)
    )


async def _dead_letter(kafka_bootstrap: str, prefix: str) -> None:
    """A dead letter as an engine writes it (proto/PROTOCOL.md, section 11): the record's
    key, value and headers, and the dlq_* headers saying why and where it came from."""
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(
            f"{prefix}.dlq",
            b'{"answer": 42}',
            key=b"saga-7",
            headers=[
                ("ce_sagaid", b"saga-7"),
                ("ce_type", b"reply"),
                ("dlq_reason", b"undecodable"),
                ("dlq_detail", b"the body is not a reply"),
                ("dlq_topic", f"{prefix}.inbox".encode()),
                ("dlq_partition", b"1"),
                ("dlq_offset", b"17"),
                ("dlq_consumer", b"engine-a"),
            ],
        )
    finally:
        await producer.stop()


def test_dlq_list_and_replay(kafka_bootstrap: str, prefix: str) -> None:
    env = _env(kafka_bootstrap, prefix)
    assert as_json(invoke(["dlq", "list", "--json", "--timeout", "10"], env)) == []
    asyncio.run(_dead_letter(kafka_bootstrap, prefix))
    [row] = as_json(invoke(["dlq", "list", "--json"], env))
    assert {k: v for k, v in row.items() if k != "partition"} == {
        "offset": 0,
        "reason": "undecodable",
        "detail": "the body is not a reply",
        "origin_topic": f"{prefix}.inbox",
        "origin_partition": "1",
        "origin_offset": "17",
        "saga_id": "saga-7",
    }
    table = invoke(["dlq", "list"], env)
    assert table.exit_code == 0, table.output
    assert "undecodable" in table.stdout
    assert f"{prefix}.inbox[1]@17" in table.stdout

    back = invoke(["dlq", "replay", "0"], env)
    assert back.exit_code == 0, back.output
    assert f"to {prefix}.inbox[" in back.stdout
    moved = as_json(invoke(["dlq", "replay", "0", "--to-saga", "saga-8", "--json"], env))
    assert moved["topic"] == f"{prefix}.inbox"
    assert moved["saga_id"] == "saga-8"

    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap)
    records = asyncio.run(read_topic(kafka, f"{prefix}.inbox", 2))
    got = sorted((r.key, _headers(r)["ce_sagaid"], r.value) for r in records)
    assert got == [
        (b"saga-7", "saga-7", b'{"answer": 42}'),
        (b"saga-8", "saga-8", b'{"answer": 42}'),
    ]
    for record in records:
        assert not [k for k in _headers(record) if k.startswith("dlq_")]
        assert _headers(record)["ce_type"] == "reply"

    missing = one_line_error(invoke(["dlq", "replay", "5"], env))
    assert "no dead-lettered record at offset 5" in missing


def test_dlq_of_a_missing_topic_is_one_line_error(kafka_bootstrap: str, unique_id: str) -> None:
    env = _env(kafka_bootstrap, f"absent{unique_id}")
    line = one_line_error(invoke(["dlq", "list", "--timeout", "10"], env))
    assert f"absent{unique_id}.dlq does not exist" in line
