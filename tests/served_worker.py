"""A real engine process in the test: a SagaWorker on the real Postgres and Kafka, with
its admin API served by uvicorn on a free loopback port, and an httpx client for it.

Tests of what reaches the engine from outside (HTTP requests, records on the inbox)
use it, so that every bad input travels the path a real one does.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import SecretStr

from saga_engine import Saga, Settings
from saga_engine.settings import AdminSettings, EngineSettings, KafkaSettings, PostgresSettings
from saga_engine.worker import SagaWorker
from tests.conftest import PgTarget
from tests.waiting import eventually

OPERATOR_TOKEN = "operator-token-0123456789-abcdef"
READER_TOKEN = "reader-token-0123456789-abcdefgh"


def real_settings(pg: PgTarget, kafka_bootstrap: str, unique_id: str, **admin: Any) -> Settings:
    """Settings for one test: its own schema, topics and group; the admin API on a free
    port with an operator ``olivia`` and a reader ``rita`` (override with ``admin``)."""
    admin_fields: dict[str, Any] = {
        "port": 0,
        "operators": {"olivia": SecretStr(OPERATOR_TOKEN)},
        "readers": {"rita": SecretStr(READER_TOKEN)},
        **admin,
    }
    return Settings(
        pg=PostgresSettings(dsn=SecretStr(pg.database_dsn), db_schema=pg.schema),
        kafka=KafkaSettings(
            bootstrap_servers=kafka_bootstrap,
            topic_prefix=f"t{unique_id}",
            group_id=f"engines-{unique_id}",
            partitions=2,
        ),
        engine=EngineSettings(),
        admin=AdminSettings(**admin_fields),
    )


@dataclass
class ServedWorker:
    worker: SagaWorker
    #: An httpx client whose base URL is the worker's admin API.
    http: httpx.AsyncClient

    @property
    def url(self) -> str:
        assert self.worker.admin_url is not None
        return self.worker.admin_url


@contextlib.asynccontextmanager
async def served_worker(
    settings: Settings, sagas: Sequence[type[Saga[Any, Any]]], **options: Any
) -> AsyncIterator[ServedWorker]:
    """Starts a worker (admin API included), waits until it owns the inbox's partitions,
    and stops it afterwards."""
    worker = SagaWorker(settings, sagas, **options)
    await worker.start()
    try:
        await eventually(lambda: len(worker.owned_partitions) == settings.kafka.partitions)
        assert worker.admin_url is not None
        async with httpx.AsyncClient(base_url=worker.admin_url, timeout=30.0) as http:
            yield ServedWorker(worker, http)
    finally:
        await worker.stop()
