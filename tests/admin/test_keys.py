"""Per-key concurrency where operators look: ``waiting_for`` on the API and the page say
"queued behind saga ...", ``GET /concurrency-keys`` lists holders and queue, and the
CLI's ``saga show`` and ``saga keys`` print the same (against a served admin API)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from pydantic import BaseModel

from saga_engine import ConcurrencyLimit, Saga, SagaContext, SagaStatus
from saga_engine.admin import create_admin_app
from saga_engine.testing import SagaTestEnv
from tests.admin.conftest import READER, READER_TOKEN, admin_settings, make_client
from tests.admin.served import Served, served_in_thread
from tests.cli.conftest import as_json, invoke


class Move(BaseModel):
    account: str


class Moved(BaseModel):
    ok: bool = True


class Hold(BaseModel):
    account: str


class OneAtATime(Saga[Move, Moved]):
    name = "one-at-a-time"
    concurrency = ConcurrencyLimit(key="account", limit=1)

    async def run(self, ctx: SagaContext, move: Move) -> Moved:
        await ctx.step("hold", to="vault", command=Hold(account=move.account))
        return Moved()


async def seed(env: SagaTestEnv) -> dict[str, str]:
    env.participant("vault").on(Hold, no_reply=True)  # the holder keeps its key
    first = await env.engine.start(OneAtATime, {"account": "acc-1"})
    second = await env.engine.start(OneAtATime, {"account": "acc-1"})
    await env.settle()
    return {"first": first, "second": second}


@pytest.fixture
async def keyed() -> AsyncIterator[tuple[SagaTestEnv, httpx.AsyncClient, dict[str, str]]]:
    env = SagaTestEnv([OneAtATime], settings=admin_settings())
    ids = await seed(env)
    app = create_admin_app(env.engine, env.settings, parts=env.parts, schedules=env.schedules)
    async with make_client(app) as http:
        yield env, http, ids


async def test_the_api_and_the_page_say_behind_whom_a_saga_is_queued(
    keyed: tuple[SagaTestEnv, httpx.AsyncClient, dict[str, str]],
) -> None:
    _, http, ids = keyed
    body = (await http.get(f"/sagas/{ids['second']}", headers=READER)).json()
    assert body["status"] == SagaStatus.RUNNING.value
    [wait] = body["waiting_for"]
    assert (wait["kind"], wait["name"]) == ("key", "acc-1")
    assert f"queued behind saga {ids['first']}" in wait["what"]
    first = (await http.get(f"/sagas/{ids['first']}", headers=READER)).json()
    assert [w["kind"] for w in first["waiting_for"]] == ["reply"]

    slots = (await http.get("/concurrency-keys", headers=READER)).json()["slots"]
    assert [(s["saga_id"], s["held"], s["position"]) for s in slots] == [
        (ids["first"], True, 0),
        (ids["second"], False, 1),
    ]
    none = await http.get("/concurrency-keys", params={"key": "other"}, headers=READER)
    assert none.json() == {"slots": []}
    assert (
        await http.get("/concurrency-keys", params={"key": ""}, headers=READER)
    ).status_code == 422

    page = await http.get(f"/ui/sagas/{ids['second']}", headers=READER)
    assert page.status_code == 200
    assert f"queued behind saga {ids['first']}" in page.text
    assert "queued for concurrency key" in page.text  # the timeline's row


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with served_in_thread(admin_settings(port=0), seed, sagas=(OneAtATime,)) as running:
        yield running


def test_saga_show_and_saga_keys_print_the_queue(served: Served) -> None:
    ids, url = served.seeded, served.url
    env = {"SAGA_ADMIN_TOKEN": READER_TOKEN}
    shown = invoke(["show", ids["second"], "--admin-url", url], env)
    assert shown.exit_code == 0, shown.output
    assert f"queued behind saga {ids['first']}" in shown.stdout
    listed = invoke(["keys", "--type", "one-at-a-time", "--admin-url", url], env)
    assert listed.exit_code == 0, listed.output
    assert "holds" in listed.stdout
    assert "queued #1" in listed.stdout
    body = as_json(invoke(["keys", "--key", "acc-1", "--admin-url", url, "--json"], env))
    assert [s["saga_id"] for s in body["slots"]] == [ids["first"], ids["second"]]
