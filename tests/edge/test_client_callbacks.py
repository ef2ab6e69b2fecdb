"""``SagaClient.complete_callback`` and ``.fail_callback`` against a real worker (the real
Postgres, Kafka and admin API): a trusted party answers a saga's callback wait by its URL
or its token, through the admin API's callback route. The first body wins and its repeat
gets the same answer; another body, a forged token, a body the wait's model refuses or a
wait that is over raise the engine's error, and change nothing (issue 41, section 2)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import SecretStr

from saga_engine import (
    CallbackConflict,
    CallbackGone,
    CallbackSettings,
    CallbackTokenInvalid,
    InvalidPayload,
    Settings,
)
from saga_engine.client import CallbackAnswer, SagaClient
from saga_engine.protocol import Envelope
from tests.edge.conftest import OPERATOR, events, settled_on
from tests.integration.kafka_helpers import fake_participant
from tests.served_worker import ServedWorker, served_worker
from tests.test_callbacks import Kyc, Verdict
from tests.waiting import eventually

pytestmark = pytest.mark.integration

KEYS = CallbackSettings(keys={"edge": SecretStr("edge-callback-key-" + "5" * 32)})


@contextlib.asynccontextmanager
async def vendor(
    settings: Settings,
) -> AsyncIterator[tuple[ServedWorker, list[Envelope], SagaClient]]:
    """A worker signing callback URLs, the KYC vendor it asks, and a trusted client."""
    settings = settings.model_copy(update={"callbacks": KEYS})
    async with (
        served_worker(settings, [Kyc]) as served,
        fake_participant(settings, "kyc") as received,
        SagaClient(settings, admin_url=served.url) as client,
    ):
        yield served, received, client


async def _waiting(served: ServedWorker, received: list[Envelope]) -> tuple[str, str]:
    """Starts a ``kyc`` saga; its id and the callback URL its step sent the vendor."""
    response = await served.http.post("/sagas/kyc", json={}, headers=OPERATOR)
    assert response.status_code == 202, response.text
    saga_id: str = response.json()["saga_id"]
    asked = await eventually(lambda: [c for c in received if c.saga_id == saga_id] or None)
    await settled_on(served, saga_id, "running")

    # The vendor's reply to the step recorded: the saga waits on its callback, and its
    # history changes no more until the callback is answered (a test comparing it before
    # and after a refused answer must not race that reply: it failed that way in CI).
    async def waits_for_the_callback() -> bool:
        kinds = [e.get("kind") for e in await events(served, saga_id)]
        return kinds[-1:] == ["reply_received"]

    await eventually(waits_for_the_callback)
    return saga_id, str(asked[0].body["callback_url"])


async def _output(served: ServedWorker, saga_id: str) -> Any:
    await settled_on(served, saga_id, "completed")
    return (await served.http.get(f"/sagas/{saga_id}", headers=OPERATOR)).json()["output"]


async def test_a_trusted_party_completes_and_fails_callbacks_by_url_or_token(
    settings: Settings,
) -> None:
    async with vendor(settings) as (served, received, client):
        saga_id, url = await _waiting(served, received)
        answer = await client.complete_callback(url, Verdict(approved=True, score=9))
        assert answer == CallbackAnswer(saga_id, "callback:kyc-verdict:1", failed=False)
        assert await _output(served, saga_id) == {"outcome": "approved=True score=9"}
        # A webhook sender's retry gets the same answer; another body a conflict.
        assert await client.complete_callback(url, {"score": 9, "approved": True}) == answer
        before = await events(served, saga_id)
        with pytest.raises(CallbackConflict):
            await client.complete_callback(url, {"approved": False})
        with pytest.raises(CallbackConflict):
            await client.fail_callback(url, "too late")
        assert await events(served, saga_id) == before

        # By its token alone; a body the wait's model refuses names the field first.
        other, other_url = await _waiting(served, received)
        token = other_url.partition("/callbacks/")[2]
        before = await events(served, other)
        with pytest.raises(InvalidPayload) as refused:
            await client.complete_callback(token, {"approved": "perhaps"})
        assert [e["loc"] for e in refused.value.errors] == [["body", "approved"]]
        assert await events(served, other) == before
        failed = await client.fail_callback(token, "document unreadable", {"code": 17})
        assert failed == CallbackAnswer(other, "callback:kyc-verdict:1", failed=True)
        assert await _output(served, other) == {
            "outcome": "failed: document unreadable {'code': 17}"
        }


async def test_hostile_urls_and_tokens_are_refused_and_change_nothing(settings: Settings) -> None:
    async with vendor(settings) as (served, received, client):
        saga_id, url = await _waiting(served, received)
        before = await events(served, saga_id)
        text, _, mac = url.partition("/callbacks/")[2].partition(".")
        forged = f"{text}.{'A' * len(mac)}"
        with pytest.raises(CallbackTokenInvalid):
            await client.complete_callback(forged, {"approved": True})  # refused by the engine
        for bad in ("", "   ", "not a token", f"{url}/elsewhere", "a.b" * 400, "x.y\n"):
            with pytest.raises(CallbackTokenInvalid):  # refused before anything is sent
                await client.complete_callback(bad, {"approved": True})
        with pytest.raises(InvalidPayload, match="reason"):
            await client.fail_callback(url, " ")
        assert await events(served, saga_id) == before
        # Once the saga has ended, a new answer finds its wait gone.
        await client.complete_callback(url, {"approved": False})
        assert await _output(served, saga_id) == {"outcome": "approved=False score=0"}
        ended = await events(served, saga_id)
        with pytest.raises(CallbackGone):
            await client.fail_callback(f"{url}/fail", "too late")
        assert await events(served, saga_id) == ended
