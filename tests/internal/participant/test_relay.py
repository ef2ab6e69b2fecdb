"""The participant's reply outbox on the real Postgres and Kafka: a reply the batch path
could not hand to Kafka (one send made to fail, inside ``_replies``) is stored
before the offset moves on, and the relay publishes it."""

from __future__ import annotations

from typing import Any

import pytest

from saga_engine.kernel._errors import KafkaUnavailable
from saga_engine.participant import _replies
from saga_engine.protocol import ReplyBody
from saga_engine.transport._kafka import start_record
from tests.participant import test_participant
from tests.participant.helpers import command
from tests.participant.test_participant import World, _stat, body_of
from tests.waiting import eventually

pytestmark = pytest.mark.integration

# The participant tests' world: a ledger participant over the real Kafka and Postgres.
world = test_participant.world


async def test_the_relay_publishes_a_reply_that_could_not_be_sent(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Kafka refuses the first reply the participant hands to the producer (the broker is
    # real; only this one send is made to fail).
    real_start = start_record
    refused: list[str] = []

    async def refuse_once(producer: Any, topic: str, *args: Any) -> Any:
        if not refused:
            refused.append(topic)
            raise KafkaUnavailable("injected: the reply could not be produced")
        return await real_start(producer, topic, *args)

    monkeypatch.setattr(_replies, "start_record", refuse_once)
    participant = await world.participant(relay_interval_s=0.05, relay_grace_s=0.2)
    cmd = command("Reserve", {"amount": 12})
    await world.bus.send(cmd)

    # The reply that did not go out is handed to the outbox before the offset is
    # committed, and the relay sends it.
    replies = await world.bus.wait_replies(1)
    assert refused == [world.bus.topics.inbox]
    assert body_of(replies[0]) == ReplyBody(
        outcome="success", payload={"reservation": f"r-{cmd.command_id}", "amount": 12}
    )
    assert participant.stats["replies_to_relay"] == 1
    assert await eventually(lambda: _stat(participant, "outbox_relayed", 1))
    assert await eventually(world.all_published)
    assert world.effects.calls[cmd.command_id] == 1
    assert participant.stats["duplicates"] == 0
