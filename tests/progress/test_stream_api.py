"""``GET /sagas/{id}/stream`` (issue 41 §5): server-sent events of a saga's progress
items that resume from ``Last-Event-ID`` with no gap and no duplicate."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from saga_engine import SagaStatus
from saga_engine.admin import create_admin_app
from saga_engine.testing import SagaTestEnv
from tests.admin.conftest import OPERATOR, READER, admin_settings, bearer, make_client
from tests.progress.sagas import Order, Status, Tracked


@pytest.fixture
async def env_http() -> AsyncIterator[tuple[SagaTestEnv, httpx.AsyncClient]]:
    env = SagaTestEnv([Tracked], settings=admin_settings())
    app = create_admin_app(env.engine, env.settings, parts=env.parts)
    async with make_client(app) as http:
        yield env, http


def frames(body: str) -> list[dict[str, Any]]:
    """The events of an SSE body: each as {"id", "event", "data"} (comments dropped)."""
    out = []
    for block in body.split("\n\n"):
        lines = [line for line in block.split("\n") if line and not line.startswith(":")]
        if not lines:
            continue
        fields = dict(line.split(": ", 1) for line in lines)
        out.append(
            {
                "id": fields.get("id"),
                "event": fields.get("event", "message"),
                "data": json.loads(fields["data"]),
            }
        )
    return out


async def test_an_ended_saga_streams_every_item_then_end(
    env_http: tuple[SagaTestEnv, httpx.AsyncClient],
) -> None:
    env, http = env_http
    run = await env.start(Tracked, Order())
    response = await http.get(f"/sagas/{run.saga_id}/stream", headers=READER)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    got = frames(response.text)
    assert [(f["id"], f["data"]["topic"], f["data"]["payload"]) for f in got[:-1]] == [
        ("1", "status", {"stage": "reserving"}),
        ("2", "eta", {"minutes": 5}),
        ("3", "status", {"stage": "done"}),
    ]
    assert got[-1] == {
        "id": None,
        "event": "end",
        "data": {"status": "completed", "last_number": 3},
    }


async def test_last_event_id_resumes_after_it_with_no_gap_and_no_duplicate(
    env_http: tuple[SagaTestEnv, httpx.AsyncClient],
) -> None:
    env, http = env_http
    run = await env.start(Tracked, Order(hold=True))
    # Open: what is there now (follow=false), the last item's number to resume from.
    first = frames(
        (await http.get(f"/sagas/{run.saga_id}/stream?follow=false", headers=READER)).text
    )
    assert [f["id"] for f in first] == ["1", "2"]  # no end: it is still running
    await env.signal(run, "go", Status(stage="packing"))
    assert await run.status() == SagaStatus.COMPLETED
    headers = {**READER, "Last-Event-ID": first[-1]["id"]}
    rest = frames((await http.get(f"/sagas/{run.saga_id}/stream", headers=headers)).text)
    assert [f["id"] for f in rest] == ["3", "4", None]
    every = [int(f["id"]) for f in first + rest if f["id"] is not None]
    assert every == list(range(1, 5))
    # Last-Event-ID wins over after; after alone works too; the topics filter keeps numbers.
    both = f"/sagas/{run.saga_id}/stream?after=0"
    assert next(f["id"] for f in frames((await http.get(both, headers=headers)).text)) == "3"
    eta = frames((await http.get(f"/sagas/{run.saga_id}/stream?topics=eta", headers=READER)).text)
    assert [(f["id"], f["data"]["topic"]) for f in eta[:-1]] == [("2", "eta")]
    assert eta[-1]["data"]["last_number"] == 2


async def test_an_unknown_saga_is_a_404_and_a_bad_token_a_401(
    env_http: tuple[SagaTestEnv, httpx.AsyncClient],
) -> None:
    env, http = env_http
    missing = await http.get("/sagas/no-such-saga/stream", headers=READER)
    assert missing.status_code == 404
    run = await env.start(Tracked, Order())
    for headers in ({}, bearer("not-the-token-at-all-000000")):
        refused = await http.get(f"/sagas/{run.saga_id}/stream", headers=headers)
        assert refused.status_code == 401
    assert (await http.get(f"/sagas/{run.saga_id}/stream", headers=OPERATOR)).status_code == 200


@pytest.mark.parametrize(
    ("query", "headers", "field"),
    [
        ("?topics=has%20space", {}, "topics"),
        ("?topics=" + ",".join(f"t{i}" for i in range(21)), {}, "topics"),
        ("?after=-1", {}, "after"),
        ("", {"Last-Event-ID": "three"}, "last-event-id"),
        ("", {"Last-Event-ID": "9" * 13}, "last-event-id"),
    ],
)
async def test_bad_parameters_are_a_422_naming_them(
    env_http: tuple[SagaTestEnv, httpx.AsyncClient],
    query: str,
    headers: dict[str, str],
    field: str,
) -> None:
    env, http = env_http
    run = await env.start(Tracked, Order())
    response = await http.get(f"/sagas/{run.saga_id}/stream{query}", headers={**READER, **headers})
    assert response.status_code == 422, response.text
    assert field in json.dumps(response.json())
