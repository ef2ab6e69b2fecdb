"""``POST /callbacks/{token}`` and ``/callbacks/{token}/fail``: the only write paths open
without a bearer token (issue 41 section 2). Their own auth is the signed token: every
forged, foreign, expired or replayed one, and every hostile body, is a 4xx that changes
nothing; the first valid body wins, its repeat gets the same answer, another a 409."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import orjson
import pytest

from saga_engine import Saga, SagaContext, SagaStatus
from saga_engine.admin import create_admin_app
from saga_engine.testing import SagaTestEnv
from tests.admin.conftest import OPERATOR, READER, admin_settings, make_client
from tests.test_callbacks import Check, Empty, Out, Verdict


class Kyc(Saga[Empty, Out]):
    name = "kyc"

    async def run(self, ctx: SagaContext, input: Empty) -> Out:
        cb = ctx.callback("kyc-verdict", model=Verdict, timeout=timedelta(hours=1))
        await ctx.step("ask", to="kyc", command=Check(callback_url=cb.url))
        verdict = await cb
        return Out(outcome=f"approved={verdict.approved}")


class Vendor:
    """The admin API and one saga waiting on its callback URL."""

    def __init__(self, env: SagaTestEnv, http: httpx.AsyncClient) -> None:
        self.env = env
        self.http = http

    async def start(self) -> tuple[str, str]:
        run = await self.env.start(Kyc, Empty())
        ask = self.env.commands("kyc")[-1]
        url: str = ask.payload["callback_url"]
        return run.saga_id, "/callbacks/" + url.partition("/callbacks/")[2]

    async def events(self, saga_id: str) -> list[str]:
        return [e.kind for e in await self.env.engine.history(saga_id)]

    async def post(self, path: str, body: Any, **headers: str) -> httpx.Response:
        return await self.http.post(
            path,
            content=body if isinstance(body, bytes) else orjson.dumps(body),
            headers={"content-type": "application/json", **headers},
        )


@pytest.fixture
async def vendor() -> AsyncIterator[Vendor]:
    env = SagaTestEnv([Kyc], settings=admin_settings(max_body_bytes=4096))
    app = create_admin_app(env.engine, env.settings, parts=env.parts)
    async with make_client(app) as http:
        yield Vendor(env, http)


def _token(path: str) -> tuple[list[Any], str]:
    text, _, mac = path.removeprefix("/callbacks/").partition(".")
    return orjson.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))), mac


def _path(claims: list[Any], mac: str) -> str:
    text = base64.urlsafe_b64encode(orjson.dumps(claims)).rstrip(b"=").decode()
    return f"/callbacks/{text}.{mac}"


async def test_a_valid_call_needs_no_token_wins_once_and_its_repeat_gets_the_same_answer(
    vendor: Vendor,
) -> None:
    saga_id, path = await vendor.start()
    first = await vendor.post(path, {"approved": True})
    assert first.status_code == 200, first.text
    assert first.json() == {
        "saga_id": saga_id,
        "wait_id": "callback:kyc-verdict:1",
        "outcome": "completed",
    }
    assert (await vendor.env.engine.get(saga_id)).status == SagaStatus.COMPLETED
    recorded = await vendor.events(saga_id)
    again = await vendor.post(path, {"approved": True})
    assert (again.status_code, again.json()) == (200, first.json())
    # Any bearer token, even a reader's or a wrong one, neither helps nor hurts.
    with_token = await vendor.post(path, {"approved": True}, authorization=f"Bearer {READER}")
    assert with_token.status_code == 200
    other = await vendor.post(path, {"approved": False}, **OPERATOR)
    assert other.status_code == 409
    assert "answered already" in other.json()["detail"]
    failing = await vendor.post(path + "/fail", {"error": "late"})
    assert failing.status_code == 409
    assert await vendor.events(saga_id) == recorded


async def test_the_saga_page_lists_the_wait_until_it_is_answered(vendor: Vendor) -> None:
    saga_id, path = await vendor.start()
    view = (await vendor.http.get(f"/sagas/{saga_id}", headers=READER)).json()
    [wait] = view["waiting_for"]
    assert (wait["kind"], wait["name"]) == ("callback", "callback:kyc-verdict:1")
    assert wait["what"] == "callback 'kyc-verdict': a call of its URL"
    assert wait["until"] == "2030-01-01T01:00:00Z"
    await vendor.post(path, {"approved": True})
    view = (await vendor.http.get(f"/sagas/{saga_id}", headers=READER)).json()
    assert view["waiting_for"] == []


async def test_the_fail_url_fails_the_wait(vendor: Vendor) -> None:
    saga_id, path = await vendor.start()
    response = await vendor.post(path + "/fail", {"error": "document unreadable"})
    assert response.status_code == 200
    assert response.json()["outcome"] == "failed"
    await vendor.env.settle()
    record = await vendor.env.engine.get(saga_id)
    assert record.status == SagaStatus.FAILED  # uncaught, it fails like any error
    assert "document unreadable" in str(record.error)


async def test_a_body_its_model_refuses_is_a_422_naming_the_field(vendor: Vendor) -> None:
    saga_id, path = await vendor.start()
    before = await vendor.events(saga_id)
    response = await vendor.post(path, {"approved": "perhaps", "score": "high"})
    assert response.status_code == 422
    assert sorted(tuple(d["loc"]) for d in response.json()["detail"]) == [
        ("body", "approved"),
        ("body", "score"),
    ]
    assert await vendor.events(saga_id) == before
    assert (await vendor.post(path, {"approved": True})).status_code == 200


async def test_forged_foreign_and_expired_tokens_are_refused_and_change_nothing(
    vendor: Vendor,
) -> None:
    saga_id, path = await vendor.start()
    other_id, other_path = await vendor.start()
    claims, mac = _token(path)
    version, key, _, wait, expires = claims
    before = (await vendor.events(saga_id), await vendor.events(other_id))
    refused = {
        "forged signature": _path(claims, "A" * len(mac)),
        "another saga's id": _path([version, key, other_id, wait, expires], mac),
        "another saga's mac": _path(claims, _token(other_path)[1]),
        "a later expiry": _path([version, key, saga_id, wait, expires + 3600], mac),
        "wrong key id": _path([version, "cb-2099", saga_id, wait, expires], mac),
        "another version": _path([2, key, saga_id, wait, expires], mac),
        "no signature": path.partition(".")[0],
        "not base64": "/callbacks/%%%.%%%",
        "a NUL byte": path + "%00",
    }
    for why, bad in refused.items():
        response = await vendor.post(bad, {"approved": True})
        assert response.status_code == 403, (why, response.text)
        assert response.json()["error"] == "CallbackTokenInvalid", why
    too_long = await vendor.post("/callbacks/" + "A" * 1100, {"approved": True})
    assert too_long.status_code == 422  # refused before anything is decoded
    assert (await vendor.events(saga_id), await vendor.events(other_id)) == before
    # Expired: the URL stops working at its expiry (its wait's timer fires then too).
    await vendor.env.advance(timedelta(hours=1, seconds=1))
    late = await vendor.post(path, {"approved": True})
    assert late.status_code == 410
    assert late.json()["error"] == "CallbackGone"


async def test_hostile_bodies_are_4xx_and_change_nothing(vendor: Vendor) -> None:
    saga_id, path = await vendor.start()
    before = await vendor.events(saga_id)
    nested = b'{"approved": true, "deep": ' + b'{"x": ' * 300 + b"1" + b"}" * 301
    cases: list[tuple[str, httpx.Response, int]] = [
        ("oversized", await vendor.post(path, {"approved": True, "pad": "x" * 8000}), 413),
        ("deeply nested", await vendor.post(path, nested), 422),
        ("a NUL in a string", await vendor.post(path, {"approved": True, "note": "a\0b"}), 422),
        ("not JSON", await vendor.post(path, b"{approved"), 400),
        ("a JSON list", await vendor.post(path, [{"approved": True}]), 422),
        (
            "form-encoded",
            await vendor.http.post(
                path, content=b"approved=true", headers={"content-type": "text/plain"}
            ),
            415,
        ),
        ("no content type", await vendor.http.post(path, content=b'{"approved": true}'), 415),
    ]
    for why, response, status in cases:
        assert response.status_code == status, (why, response.text)
    assert await vendor.events(saga_id) == before
    assert (await vendor.post(path, {"approved": True})).status_code == 200


async def test_a_saga_that_ended_another_way_answers_410(vendor: Vendor) -> None:
    saga_id, path = await vendor.start()
    await vendor.env.cancel(saga_id)
    response = await vendor.post(path, {"approved": True})
    assert response.status_code == 410
    assert "waits for no callback" in response.json()["detail"]
