"""The progress stream's bounds (issue 41 §5): a keep-alive comment on an idle
connection, a connection closed after its lifetime, and a client that reconnects after
such a close (or any drop) resuming with no gap and no duplicate."""

from __future__ import annotations

import httpx
import pytest

from saga_engine.admin import create_admin_app
from saga_engine.admin._progress_stream import StreamTiming
from saga_engine.client import SagaClient
from saga_engine.testing import SagaTestEnv
from tests.admin.conftest import OPERATOR, READER, READER_TOKEN, admin_settings, make_client
from tests.admin.served import served_in_thread
from tests.progress.sagas import Order, Tracked


@pytest.fixture
def short_lived(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(StreamTiming, "keepalive", 0.02)
    monkeypatch.setattr(StreamTiming, "poll_max", 0.01)
    monkeypatch.setattr(StreamTiming, "lifetime", 0.2)


@pytest.mark.usefixtures("short_lived")
async def test_an_idle_stream_sends_keep_alives_and_closes_after_its_lifetime() -> None:
    env = SagaTestEnv([Tracked], settings=admin_settings())
    run = await env.start(Tracked, Order(hold=True))
    app = create_admin_app(env.engine, env.settings, parts=env.parts)
    async with make_client(app) as http:
        body = (await http.get(f"/sagas/{run.saga_id}/stream", headers=READER)).text
    assert ": keep-alive\n\n" in body
    assert "event: end" not in body  # closed without an end: the saga still runs
    assert body.count("id: ") == 2


async def seed(env: SagaTestEnv) -> dict[str, str]:
    return {"held": (await env.start(Tracked, Order(hold=True))).saga_id}


@pytest.mark.usefixtures("short_lived")
async def test_the_client_reconnects_after_a_close_and_resumes_after_its_last_item() -> None:
    settings = admin_settings(port=0)
    with served_in_thread(settings, seed, sagas=[Tracked]) as served:
        saga_id = served.seeded["held"]
        client = SagaClient(settings, admin_url=served.url, admin_token=READER_TOKEN)
        stream = client.stream(saga_id, reconnect_delay=0.01)
        got = [(await anext(stream)).number, (await anext(stream)).number]
        # Several connections close (lifetime 0.2 s) while the saga waits; then it moves.
        async with httpx.AsyncClient(base_url=served.url, headers=OPERATOR) as http:
            for _ in range(3):
                idle = await http.get(f"/sagas/{saga_id}/stream", headers=READER)
                assert "event: end" not in idle.text
            body = {"name": "go", "payload": {"stage": "packing"}}
            assert (await http.post(f"/sagas/{saga_id}/signal", json=body)).is_success
        got += [item.number async for item in stream]
        assert got == [1, 2, 3, 4]
