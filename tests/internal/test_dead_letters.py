"""The engine's dead letters (``_kafka.KafkaDeadLetterPublisher``) carry the headers proto/PROTOCOL.md
(section 11) and ``proto/schemas/dlq-headers.schema.json`` promise, also when a record is
too large even for the dead-letter topic. (The rest of the wire contract is checked
through the public names in tests/test_proto.py.)"""

from __future__ import annotations

import pytest
from aiokafka.errors import MessageSizeTooLargeError

from saga_engine.protocol import Headers, PoisonReason, encode
from saga_engine.transport._kafka import KafkaDeadLetterPublisher
from tests.test_proto import TOPICS, command, errors, header_dict


class _Producer:
    """Stands in for AIOKafkaProducer: records what KafkaDeadLetterPublisher sends."""

    def __init__(self, *, too_large_once: bool = False) -> None:
        self.sent: list[tuple[str, bytes | None, bytes | None, Headers]] = []
        self._too_large = too_large_once

    async def send_and_wait(
        self, topic: str, value: bytes | None, *, key: bytes | None, headers: Headers
    ) -> None:
        if self._too_large:
            self._too_large = False
            raise MessageSizeTooLargeError()
        self.sent.append((topic, key, value, headers))


@pytest.mark.parametrize("reason", [r.value for r in PoisonReason])
async def test_dead_letter_headers_validate(reason: str) -> None:
    producer = _Producer()
    key, value, headers = encode(command())
    await KafkaDeadLetterPublisher(producer, TOPICS.dlq).publish(
        key=key,
        value=value,
        headers=[*headers, ("dlq_reason", b"stale")],
        reason=reason,
        detail="why " * 1000,
        origin_topic=TOPICS.inbox,
        origin_partition=3,
        origin_offset=1742,
        consumer="engine-1",
    )
    [(topic, sent_key, sent_value, sent_headers)] = producer.sent
    assert (topic, sent_key, sent_value) == (TOPICS.dlq, key, value)
    found = header_dict(sent_headers)
    assert found["dlq_reason"] == reason
    assert errors("dlq-headers.schema.json", found) == []


async def test_truncated_dead_letters_validate() -> None:
    producer = _Producer(too_large_once=True)
    await KafkaDeadLetterPublisher(producer, TOPICS.dlq).publish(
        key=b"k",
        value=b"x" * 100_000,
        headers=[],
        reason=PoisonReason.OVERSIZED.value,
        detail="too big",
        origin_topic=TOPICS.inbox,
        origin_partition=0,
        origin_offset=0,
        consumer="engine-1",
    )
    [(_, _, value, headers)] = producer.sent
    found = header_dict(headers)
    assert found["dlq_truncated"] == "100000"
    assert value is not None
    assert len(value) == 64 * 1024
    assert errors("dlq-headers.schema.json", found) == []
    assert errors("dlq-headers.schema.json", {**found, "dlq_reason": "bad_luck"})
    assert errors("dlq-headers.schema.json", {**found, "dlq_offset": "-1"})
