"""``/health`` says ``degraded``, with the problems, while the worker's board holds any
(issue 22: a partition no fetch can read, a group that does not settle)."""

from __future__ import annotations

import httpx

from saga_engine.admin import create_admin_app
from saga_engine.settings import AdminSettings, Settings
from saga_engine.telemetry._health import HealthBoard
from saga_engine.testing import SagaTestEnv
from tests.admin.sagas import Transfer


async def test_health_is_degraded_while_a_problem_stands_and_ok_after() -> None:
    board = HealthBoard()
    env = SagaTestEnv([Transfer])
    app = create_admin_app(
        env.engine, Settings(admin=AdminSettings()), parts=env.parts, health=board
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://admin"
    ) as http:
        assert (await http.get("/health")).json() == {"status": "ok"}
        board.report("unreadable:x", "engine e: cannot read t[3] at offset 7")
        answer = await http.get("/health")
        assert answer.status_code == 200  # a restart would not cure it: not a 503
        assert answer.json() == {
            "status": "degraded",
            "problems": ["engine e: cannot read t[3] at offset 7"],
        }
        board.clear("unreadable:x")
        assert (await http.get("/health")).json() == {"status": "ok"}
