"""The Go kit's step reports end to end (issue 41 §5, PROTOCOL.md 5b): a participant
built with kits/go (``cmd/progress-participant``) calls ``cmd.Progress`` while its
handler works; the engine worker's admin API shows the reports on the command in flight
and on the stream, and none once the reply is in the history."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from saga_engine import Settings
from saga_engine.client import SagaClient
from saga_engine.worker import SagaWorker
from tests.go_kit import build_binary, running
from tests.progress.test_step_progress_kafka import (
    Packing,
    Parcel,
    check_followed,
    follow,
    reported,
    settings,  # noqa: F401  (the settings fixture)
)

pytestmark = pytest.mark.integration


@pytest.fixture
async def go_warehouse(
    go_built: str,
    settings: Settings,  # noqa: F811
    tmp_path: Path,
) -> AsyncIterator[Path]:
    """The Go participant ``warehouse`` running; the folder where a file named after a
    saga id lets its handler finish."""
    binary, released = tmp_path / "progress-participant", tmp_path / "released"
    released.mkdir()
    await build_binary(go_built, "./cmd/progress-participant", binary)
    env = {
        **os.environ,
        "SAGA_KAFKA__BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers,
        "SAGA_KAFKA__TOPIC_PREFIX": settings.kafka.topic_prefix,
        "SAGA_KAFKA__PARTITIONS": str(settings.kafka.partitions),
        "SAGA_PG__DSN": settings.participant.dsn.get_secret_value(),
        "SAGA_PARTICIPANT__NAME": "warehouse",
        "SAGA_PARTICIPANT__SCHEMA": settings.participant.db_schema,
        "PROGRESS_RELEASE_DIR": str(released),
    }
    async with running(binary, env):
        yield released


# The clock covers the test only: the kit's build (``go_built``) is bounded on its own.
@pytest.mark.timeout(120, func_only=True)
async def test_a_go_participants_reports_show_while_its_step_runs_and_go_with_its_reply(
    settings: Settings,  # noqa: F811
    go_warehouse: Path,
) -> None:
    worker = SagaWorker(settings, [Packing])
    await worker.start()
    try:
        assert worker.admin_url is not None
        async with (
            SagaClient(settings) as client,
            httpx.AsyncClient(base_url=worker.admin_url) as http,
        ):
            saga_id = await client.start(Packing, Parcel(items=3))
            progress = await reported(http, saga_id)
            assert progress[-1]["attempt"] == 1
            assert progress[-1]["body"]["of"] == 3
            assert [p["seq"] for p in progress] == sorted(p["seq"] for p in progress)

            def release() -> None:
                (go_warehouse / saga_id).touch()

            await check_followed(http, saga_id, await follow(http, saga_id, release))
    finally:
        await worker.stop()
