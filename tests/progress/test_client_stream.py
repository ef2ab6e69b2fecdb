"""``SagaClient.stream`` (issue 41 §5) against a served admin API: the items of a saga
still running come as they are committed, then the iterator ends with the saga."""

from __future__ import annotations

import httpx
import pytest

from saga_engine import SagaNotFound
from saga_engine.client import ProgressItem, SagaClient
from saga_engine.testing import SagaTestEnv
from tests.admin.conftest import OPERATOR, READER_TOKEN, admin_settings
from tests.admin.served import served_in_thread
from tests.progress.sagas import Order, Tracked


async def seed(env: SagaTestEnv) -> dict[str, str]:
    held = await env.start(Tracked, Order(hold=True))
    return {"held": held.saga_id}


def numbers(items: list[ProgressItem]) -> list[int]:
    return [item.number for item in items]


async def test_the_client_follows_a_running_saga_to_its_end() -> None:
    settings = admin_settings(port=0)
    with served_in_thread(settings, seed, sagas=[Tracked]) as served:
        saga_id = served.seeded["held"]
        client = SagaClient(settings, admin_url=served.url, admin_token=READER_TOKEN)
        stream = client.stream(saga_id)
        first = [await anext(stream), await anext(stream)]
        assert [(i.number, i.topic, i.payload) for i in first] == [
            (1, "status", {"stage": "reserving"}),
            (2, "eta", {"minutes": 5}),
        ]
        # The stream is open while the saga waits; a signal moves it on, live.
        async with httpx.AsyncClient(base_url=served.url, headers=OPERATOR) as http:
            body = {"name": "go", "payload": {"stage": "packing"}}
            sent = await http.post(f"/sagas/{saga_id}/signal", json=body)
            assert sent.is_success, sent.text
        rest = [item async for item in stream]  # ends with the saga
        assert [(i.number, i.payload) for i in rest] == [
            (3, {"stage": "packing"}),
            (4, {"stage": "done"}),
        ]
        # after= and topics= as the route's.
        status = [i async for i in client.stream(saga_id, after=1, topics=["status"])]
        assert numbers(status) == [3, 4]
        with pytest.raises(SagaNotFound):
            await anext(client.stream("no-such-saga"))
