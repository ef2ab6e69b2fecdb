"""A signal is checked against the saga's declaration at every edge before anything is
recorded: the admin API (422 naming the field), the CLI (one line, exit 1), the client
(raises) and the inbox (a dead letter saying why). The saga is untouched, and a good
signal afterwards still completes it."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from saga_engine import InvalidPayload, Settings, UnstorableValue
from saga_engine.client import SagaClient
from saga_engine.protocol import Envelope, MessageType, ReplyBody, Topics
from tests.cli.conftest import invoke, one_line_error
from tests.edge.conftest import (
    OPERATOR,
    Charged,
    Checkout,
    dead_letters,
    events,
    produce,
    settled_on,
    start,
    status,
    topic_size,
)
from tests.integration.kafka_helpers import fake_participant
from tests.served_worker import OPERATOR_TOKEN, ServedWorker
from tests.waiting import eventually

pytestmark = pytest.mark.integration


def _charged(_: Envelope) -> ReplyBody:
    return ReplyBody(outcome="success", payload=Charged(receipt="r-1", amount=1).model_dump())


async def _waiting_for_go(served: ServedWorker) -> str:
    saga_id = await start(served)

    async def charged() -> bool:
        if await status(served, saga_id) is None:
            return False  # started through the inbox: not recorded yet
        return any(e["kind"] == "reply_received" for e in await events(served, saga_id))

    await eventually(charged)
    assert await status(served, saga_id) == "running"
    return saga_id


async def test_the_admin_api_refuses_a_bad_signal_naming_the_field(
    settings: Settings, served: ServedWorker
) -> None:
    async with fake_participant(settings, "bank", _charged):
        saga_id = await _waiting_for_go(served)
        before = await events(served, saga_id)
        url = f"/sagas/{saga_id}/signal"

        wrong_type = await served.http.post(
            url, json={"name": "go", "payload": {"ok": "not-a-bool"}}, headers=OPERATOR
        )
        assert wrong_type.status_code == 422, wrong_type.text
        assert wrong_type.json()["error"] == "InvalidPayload"
        [problem] = wrong_type.json()["detail"]
        assert problem["loc"] == ["body", "payload", "ok"]
        assert "boolean" in problem["msg"]

        missing = await served.http.post(url, json={"name": "go"}, headers=OPERATOR)
        assert missing.status_code == 422
        assert missing.json()["detail"][0]["loc"] == ["body", "payload", "ok"]

        undeclared = await served.http.post(
            url, json={"name": "og", "payload": {"ok": True}}, headers=OPERATOR
        )
        assert undeclared.status_code == 422
        assert undeclared.json()["detail"] == [
            {
                "loc": ["body", "name"],
                "msg": "saga 'edge-checkout' declares no signal 'og' (it declares: go)",
                "type": "unknown_signal",
            }
        ]

        nul = await served.http.post(
            url, json={"name": "go", "payload": {"ok": True, "by": "a\u0000b"}}, headers=OPERATOR
        )
        assert nul.status_code == 422
        assert nul.json()["error"] == "UnstorableValue"
        assert nul.json()["detail"][0]["loc"] == ["body", "payload", "by"]

        # FastAPI's own checks (a reason over 2000 characters) answer a 422 too, without
        # echoing the input back (an unpaired surrogate in it used to make that a 500).
        long = {"name": "go", "payload": {"ok": True}, "reason": "x" * 2001 + "\ud800"}
        too_long = await served.http.post(
            url,
            content=json.dumps(long).encode(),
            headers={**OPERATOR, "Content-Type": "application/json"},
        )
        assert too_long.status_code == 422, too_long.text
        assert too_long.json()["detail"][0]["loc"] == ["body", "reason"]
        assert "input" not in too_long.json()["detail"][0]

        assert await events(served, saga_id) == before
        assert await status(served, saga_id) == "running"
        good = await served.http.post(
            url, json={"name": "go", "payload": {"ok": True}}, headers=OPERATOR
        )
        assert good.status_code == 200, good.text
        await settled_on(served, saga_id, "completed")


async def test_the_cli_refuses_a_bad_signal_in_one_line(
    settings: Settings, served: ServedWorker
) -> None:
    async with fake_participant(settings, "bank", _charged):
        saga_id = await _waiting_for_go(served)
        before = await events(served, saga_id)
        env = {"SAGA_ADMIN_TOKEN": OPERATOR_TOKEN, "SAGA_ADMIN_URL": served.url}

        def cli(*args: str) -> str:
            return one_line_error(invoke(["signal", saga_id, *args], env), 5)

        # The CLI calls the API synchronously: from a thread, so this loop serves it.
        wrong = await asyncio.to_thread(cli, "go", "--payload", '{"ok": "not-a-bool"}')
        assert wrong.startswith("error: 422: payload.ok: Input should be a valid boolean")
        undeclared = await asyncio.to_thread(cli, "og", "--payload", '{"ok": true}')
        assert "name: saga 'edge-checkout' declares no signal 'og'" in undeclared
        assert await events(served, saga_id) == before

        sent = await asyncio.to_thread(
            invoke, ["signal", saga_id, "go", "--payload", '{"ok": true}', "--json"], env
        )
        assert sent.exit_code == 0, sent.output
        await settled_on(served, saga_id, "completed")


async def test_the_inbox_dead_letters_a_bad_signal_and_the_client_refuses_to_send_one(
    settings: Settings, served: ServedWorker
) -> None:
    async with fake_participant(settings, "bank", _charged):
        saga_id = await _waiting_for_go(served)
        before = await events(served, saga_id)
        inbox = Topics.of(settings.kafka).inbox

        def signal(name: str, payload: dict[str, object]) -> Envelope:
            return Envelope(
                message_type=MessageType.SIGNAL,
                source="/buggy-producer",
                saga_id=saga_id,
                subject=name,
                body={"name": name, "signal_id": str(uuid.uuid4()), "payload": payload},
            )

        await produce(
            settings, inbox, signal("go", {"ok": "not-a-bool"}), signal("og", {"ok": True})
        )
        letters = await dead_letters(settings, 2)
        assert [d["dlq_reason"] for d in letters] == ["invalid_signal", "invalid_signal"]
        assert "payload.ok: Input should be a valid boolean" in letters[0]["dlq_detail"]
        assert "declares no signal 'og'" in letters[1]["dlq_detail"]
        assert {d["dlq_topic"] for d in letters} == {inbox}
        assert await events(served, saga_id) == before

        async with SagaClient(settings) as client:
            with pytest.raises(InvalidPayload, match=r"payload\.ok"):
                await client.signal(saga_id, Checkout.go, {"ok": "not-a-bool"})
            with pytest.raises(InvalidPayload, match="declares no signal 'og'"):
                await client.signal(saga_id, "og", {"ok": True}, saga=Checkout)
            with pytest.raises(UnstorableValue, match=r"payload\.ok"):
                await client.signal(saga_id, "go", {"ok": "\u0000"})
            # Nothing of those reached the inbox: only the two records sent above are
            # there (plus the start and the bank's reply).
            assert await topic_size(settings, inbox) == 4
            await client.signal(saga_id, Checkout.go, {"ok": True})
        await settled_on(served, saga_id, "completed")
        assert served.worker.engine is not None
        assert served.worker.parts.stats.counts["dead_lettered_invalid_signal"] == 2


def _charged_never_refunded(command: Envelope) -> ReplyBody | None:
    """A bank that charges, and never answers a refund: its saga stays compensating."""
    return _charged(command) if command.subject == "Charge" else None


async def test_a_signal_no_wait_can_take_any_more_is_refused_at_every_edge(
    settings: Settings, served: ServedWorker
) -> None:
    """Before: 200 from the API, exit 0 from the CLI, and a signal_received in the
    history of a saga whose code had stopped: a signal accepted that nothing consumes."""
    async with fake_participant(settings, "bank", _charged_never_refunded):
        saga_id = await _waiting_for_go(served)
        cancel = await served.http.post(
            f"/sagas/{saga_id}/cancel", json={"reason": "changed my mind"}, headers=OPERATOR
        )
        assert cancel.status_code == 200, cancel.text
        await settled_on(served, saga_id, "compensating")

        go = {"name": "go", "payload": {"ok": True}}
        refused = await served.http.post(f"/sagas/{saga_id}/signal", json=go, headers=OPERATOR)
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"] == "InvalidTransition"
        assert "is compensating" in refused.json()["detail"]

        env = {"SAGA_ADMIN_TOKEN": OPERATOR_TOKEN, "SAGA_ADMIN_URL": served.url}
        args = ["signal", saga_id, "go", "--payload", '{"ok": true}']
        line = await asyncio.to_thread(lambda: one_line_error(invoke(args, env), 4))
        assert "is compensating" in line

        inbox = Topics.of(settings.kafka).inbox
        signal = Envelope(
            message_type=MessageType.SIGNAL,
            source="/late-producer",
            saga_id=saga_id,
            subject="go",
            body={"name": "go", "signal_id": "late", "payload": {"ok": True}},
        )
        await produce(settings, inbox, signal)
        [letter] = await dead_letters(settings, 1)
        assert letter["dlq_reason"] == "not_accepted"
        assert "is compensating" in letter["dlq_detail"]
        assert "signal_received" not in [e["kind"] for e in await events(served, saga_id)]
        assert await status(served, saga_id) == "compensating"
