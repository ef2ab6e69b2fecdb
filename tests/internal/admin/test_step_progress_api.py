"""Participants' step reports on the admin API (issue 41 §5), over the in-memory engine
with the board fed by hand: shown on the command in flight (``GET /sagas/{id}``) and on
the stream with ``?steps=true`` as unnumbered ``step_progress`` events, gone once the
reply is in the history; and the cap on open streams (``admin.max_streams``)."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import pytest

from saga_engine import SagaStatus
from saga_engine.admin import create_admin_app
from saga_engine.admin._progress_stream import sse_frames
from saga_engine.admin._step_board import StepProgressBoard
from saga_engine.client import SagaClient
from saga_engine.testing import SagaTestEnv
from saga_engine.transport._step_progress import StepProgressRecord
from tests.admin.conftest import READER, READER_TOKEN, admin_settings, make_client
from tests.admin.served import served_in_thread
from tests.progress.sagas import Order, Tracked
from tests.progress.test_stream_api import frames
from tests.waiting import eventually


def report(saga_id: str, command_id: str, seq: int) -> StepProgressRecord:
    return StepProgressRecord(
        saga_id=saga_id,
        command_id=command_id,
        step="reserve",
        attempt=1,
        seq=seq,
        at=datetime(2026, 1, 1, tzinfo=UTC),
        body={"pct": seq * 10},
    )


async def test_a_running_steps_reports_show_on_the_saga_and_the_stream_until_its_reply() -> None:
    env = SagaTestEnv([Tracked], settings=admin_settings())
    env.hold(lambda command: command.step == "reserve")
    board = StepProgressBoard()
    app = create_admin_app(env.engine, env.settings, parts=env.parts, step_progress=board)
    run = await env.start(Tracked, Order())
    async with make_client(app) as http:
        (flying,) = (await http.get(f"/sagas/{run.saga_id}", headers=READER)).json()["in_flight"]
        assert flying["progress"] == []
        board.add(report(run.saga_id, flying["command_id"], 1))
        board.add(report(run.saga_id, flying["command_id"], 2))
        board.add(report(run.saga_id, "an-ended-command", 1))  # not in flight: not shown
        shown = (await http.get(f"/sagas/{run.saga_id}", headers=READER)).json()
        assert [(p["seq"], p["body"]) for p in shown["in_flight"][0]["progress"]] == [
            (1, {"pct": 10}),
            (2, {"pct": 20}),
        ]
        assert len(board.reports(run.saga_id)) == 2  # what no longer runs was dropped
        url = f"/sagas/{run.saga_id}/stream?follow=false"
        streamed = frames((await http.get(f"{url}&steps=true", headers=READER)).text)
        assert [(f["id"], f["event"]) for f in streamed] == [
            ("1", "message"),
            (None, "step_progress"),
            (None, "step_progress"),
        ]
        assert streamed[2]["data"] == {
            "command_id": flying["command_id"],
            "step": "reserve",
            "attempt": 1,
            "seq": 2,
            "at": "2026-01-01T00:00:00+00:00",
            "body": {"pct": 20},
        }
        # Without steps=true: the numbered items only (a client that knows no more).
        assert [f["event"] for f in frames((await http.get(url, headers=READER)).text)] == [
            "message"
        ]
        await env.release()
        assert await run.status() == SagaStatus.COMPLETED
        board.add(report(run.saga_id, flying["command_id"], 3))  # late: after its reply
        after = frames((await http.get(f"{url}&steps=true", headers=READER)).text)
        assert [f["event"] for f in after] == ["message"] * 3 + ["end"]
        assert board.reports(run.saga_id) == []


async def seed(env: SagaTestEnv) -> dict[str, str]:
    return {"held": (await env.start(Tracked, Order(hold=True))).saga_id}


@pytest.mark.timeout(60)
async def test_streams_beyond_max_streams_get_a_503_with_retry_after_until_one_closes() -> None:
    settings = admin_settings(port=0, max_streams=1)
    with served_in_thread(settings, seed, sagas=[Tracked]) as served:
        url = f"/sagas/{served.seeded['held']}/stream"
        async with httpx.AsyncClient(base_url=served.url, headers=READER) as http:
            async with http.stream("GET", url) as first:
                assert first.status_code == 200
                lines = first.aiter_lines()
                assert await anext(lines) == "id: 1"  # open, and holding its slot
                refused = await http.get(url)
                assert refused.status_code == 503
                assert refused.headers["Retry-After"] == "2"
                assert "at most 1 progress streams" in refused.json()["detail"]
                assert "admin.max_streams" in refused.json()["detail"]

            async def reopened() -> int:
                return (await http.get(f"{url}?follow=false")).status_code

            # The first one's slot is given back when its reader goes away.
            await eventually(reopened, until=lambda status: status == 200)
            # Every stream that ended gave its slot back: one may open again, and one only.
            async with http.stream("GET", url) as again:
                assert again.status_code == 200
                assert (await http.get(url)).status_code == 503
        client = SagaClient(settings, admin_url=served.url, admin_token=READER_TOKEN)
        items = client.stream(served.seeded["held"])
        assert (await anext(items)).number == 1


async def test_a_stream_sends_each_report_once_a_new_run_too_and_says_when_the_step_ended() -> None:
    env = SagaTestEnv([Tracked], settings=admin_settings())
    env.hold(lambda command: command.step == "reserve")
    run = await env.start(Tracked, Order(hold=True))
    (command_id,) = [c.command_id for c in env.commands() if c.step == "reserve"]
    board = StepProgressBoard()
    frames_of = sse_frames(env.parts.store, run.saga_id, 0, None, True, board)

    async def next_frame() -> str:
        frame = (await anext(frames_of)).decode()
        return frame if not frame.startswith(":") else await next_frame()

    assert (await next_frame()).startswith("id: 1\n")
    for seq in (1, 2):
        board.add(report(run.saga_id, command_id, seq))
        assert f'"seq":{seq},' in await next_frame()
    board.add(report(run.saga_id, command_id, 2))  # the same again: stale, not sent
    board.add(report(run.saga_id, command_id, 1))  # the handler ran again: sent
    again = await next_frame()
    assert again.startswith("event: step_progress\n")
    assert '"seq":1,' in again
    await env.release()
    assert (await next_frame()).startswith("id: 2\n")
    assert await next_frame() == (f'event: step_ended\ndata: {{"command_id":"{command_id}"}}\n\n')
    await frames_of.aclose()
