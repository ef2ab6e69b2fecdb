"""An inbox consumer that dies of a bug is not a silent stall: the worker logs it once and
``/health`` answers 503 ``failing`` (a restart cures it), over the real servers."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import PgTarget
from tests.edge.conftest import Checkout, start
from tests.served_worker import real_settings, served_worker
from tests.waiting import eventually

pytestmark = pytest.mark.integration


async def test_a_dead_inbox_consumer_fails_health(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = real_settings(pg, kafka_bootstrap, unique_id)
    async with served_worker(settings, [Checkout]) as served:
        assert (await served.http.get("/health")).json() == {"status": "ok"}

        async def broken(batch: Any) -> None:
            raise RuntimeError("a bug in the batch path")

        inbox = served.worker._inbox
        assert inbox is not None
        inbox.process = broken  # type: ignore[method-assign,assignment]
        await start(served)  # its record reaches the broken consumer

        async def failing() -> bool:
            return (await served.http.get("/health")).status_code == 503

        await eventually(failing)
        body = (await served.http.get("/health")).json()
        assert body["status"] == "failing"
        assert (
            "the inbox consumer stopped: RuntimeError('a bug in the batch path')"
            in (body["problems"][0])
        )
        assert "the inbox consumer stopped" in caplog.text
