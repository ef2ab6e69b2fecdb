"""The participant kit with a payload codec, on the real Postgres and Kafka: sealed
commands are opened before the handler; replies go out sealed, and are stored sealed in
its deduplication table and its outbox (the relay path is forced by one failed send);
a redelivered command gets the stored reply back; clear commands are still read; a
participant without the key dead-letters a sealed command as ``undecodable``."""

from __future__ import annotations

import os
from typing import Any

import pytest

from saga_engine.core.history._codec import HEADER, AesGcmCodec, CodecChain, ZstdCodec
from saga_engine.kernel._errors import KafkaUnavailable
from saga_engine.participant import _replies
from saga_engine.protocol import ReplyBody
from saga_engine.transport._kafka import start_record
from saga_engine.transport._wire import Envelope, decode, encode
from tests.participant import test_participant
from tests.participant.helpers import command, query
from tests.participant.test_participant import World, _stat
from tests.waiting import eventually

pytestmark = pytest.mark.integration

world = test_participant.world

#: The canary: a number no header or id holds. Above the ledger's limit, so the handler
#: refuses it with details that carry it ({"requested": AMOUNT, "limit": 100}).
AMOUNT = 918_273_645
CODEC = CodecChain(ZstdCodec(threshold=16), AesGcmCodec({"k1": os.urandom(32)}, "k1"))


async def _raw_replies(world: World, count: int) -> list[Any]:
    found: list[Any] = []

    async def enough() -> bool:
        for records in (await world.bus._inbox.getmany(timeout_ms=100)).values():
            found.extend(records)
        return len(found) >= count

    assert await eventually(enough, timeout=20, interval=0)
    return found


def _opened(record: Any) -> Envelope:
    return decode(record.key, record.value, list(record.headers), max_bytes=10**7, codec=CODEC)


async def test_sealed_commands_and_replies_through_the_outbox(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_start = start_record
    refused: list[str] = []

    async def refuse_once(producer: Any, topic: str, *args: Any) -> Any:
        if not refused:
            refused.append(topic)
            raise KafkaUnavailable("injected: the reply could not be produced")
        return await real_start(producer, topic, *args)

    monkeypatch.setattr(_replies, "start_record", refuse_once)
    participant = await world.participant(relay_interval_s=0.05, relay_grace_s=0.2, codec=CODEC)
    cmd = command("Reserve", {"amount": AMOUNT})
    key, value, headers = encode(cmd, CODEC)
    assert str(AMOUNT).encode() not in value
    await world.bus.send_raw(key, value, headers)

    [reply] = await _raw_replies(world, 1)
    assert refused == [world.bus.topics.inbox]
    assert str(AMOUNT).encode() not in reply.value
    assert dict(reply.headers)[HEADER] == b"zstd,aes-gcm"
    expected = ReplyBody.model_validate(_opened(reply).body)
    assert expected.outcome == "failure"
    assert expected.payload["requested"] == AMOUNT
    assert await eventually(lambda: _stat(participant, "outbox_relayed", 1))

    rows = await query(
        world.pg.dsn,
        "SELECT (SELECT string_agg(p::text, '') FROM saga_processed_commands p) AS processed, "
        "(SELECT string_agg(o::text, '') FROM saga_reply_outbox o) AS outbox",
    )
    assert rows[0]["outbox"]
    assert rows[0]["processed"]
    assert str(AMOUNT) not in rows[0]["outbox"]
    assert str(AMOUNT) not in rows[0]["processed"]

    # Redelivered: answered from the stored (sealed) reply, the handler not run again.
    await world.bus.send_raw(key, value, headers)
    replies = await _raw_replies(world, 1)
    assert ReplyBody.model_validate(_opened(replies[-1]).body) == expected
    assert world.effects.calls[cmd.command_id] == 1  # the handler ran once
    assert participant.stats["duplicates"] == 1

    # A clear command (a sender without the codec) is still read; its reply is sealed.
    clear = command("Reserve", {"amount": 7})
    await world.bus.send(clear)
    [answer] = await _raw_replies(world, 1)
    assert dict(answer.headers)[HEADER] == b"zstd,aes-gcm"
    assert ReplyBody.model_validate(_opened(answer).body).payload["amount"] == 7


async def test_a_participant_without_the_key_dead_letters_a_sealed_command(
    world: World,
) -> None:
    participant = await world.participant()
    cmd = command("Reserve", {"amount": AMOUNT})
    await world.bus.send_raw(*encode(cmd, CODEC))
    [dead] = await world.bus.wait_dead_letters(1)
    assert dict(dead.headers)["dlq_reason"] == b"undecodable"
    assert b"no codec configured" in dict(dead.headers)["dlq_detail"]
    assert participant.stats["processed"] == 0
    assert world.effects.calls[cmd.command_id] == 0
