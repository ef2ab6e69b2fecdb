"""What every demo service shares: its own schema, a pool, the participant kit, /health.

A service's tables live in its own schema, ``SAGA_PARTICIPANT__DB_SCHEMA`` in the
database ``SAGA_PARTICIPANT__DSN`` (as if it had a database of its own); the participant
kit keeps its processed-commands and reply-outbox tables in the same schema, so a
handler's business writes and the record of the command commit together.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import asyncpg
import orjson
from fastapi import FastAPI
from pydantic import BaseModel

from saga_engine import Settings
from saga_engine.client import SagaClient
from saga_engine.participant import Participant
from saga_engine.telemetry import configure_from_env, default_telemetry
from services_demo.config import DemoSettings

# asyncpg's classes are generic only in its stubs.
Pool: TypeAlias = "asyncpg.Pool[asyncpg.Record]"
Connection: TypeAlias = "asyncpg.Connection[asyncpg.Record]"
Seed = Callable[[Connection], Awaitable[None]]


@dataclass
class Service:
    """A running service: its settings, its database pool and its participant (if any)."""

    name: str
    settings: Settings
    demo: DemoSettings
    schema: str
    pool: Pool
    participant: Participant | None = None
    saga_client: SagaClient | None = None
    extra_health: dict[str, Any] = field(default_factory=dict)


class Holder:
    """Set in the app's lifespan; read by its routes."""

    def __init__(self) -> None:
        self._service: Service | None = None

    @property
    def service(self) -> Service:
        if self._service is None:
            raise RuntimeError("the service is not started")
        return self._service

    @property
    def pool(self) -> Pool:
        return self.service.pool

    def set(self, service: Service | None) -> None:
        self._service = service


def _lock_key(schema: str) -> int:
    return int.from_bytes(
        hashlib.sha256(f"demo:{schema}".encode()).digest()[:8], "big", signed=True
    )


async def prepare_schema(dsn: str, schema: str, ddl: str, seed: Seed | None) -> None:
    """Creates the schema, the business tables and the seed data (idempotent, under a lock)."""
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _lock_key(schema))
            await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
            await conn.execute(f'SET LOCAL search_path TO "{schema}"')
            await conn.execute(ddl)
            if seed is not None:
                await seed(conn)
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def running_service(
    name: str,
    *,
    ddl: str,
    seed: Seed | None = None,
    participant: Callable[[Settings], Participant] | None = None,
) -> AsyncIterator[Service]:
    """Prepares the schema, opens the pool, starts the participant; undoes it all at exit."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    settings = Settings()
    demo = DemoSettings()
    dsn = settings.participant.dsn.get_secret_value()
    schema = settings.participant.db_schema
    await prepare_schema(dsn, schema, ddl, seed)
    pool: Pool = await asyncpg.create_pool(
        dsn, min_size=1, max_size=5, server_settings={"search_path": schema}
    )
    service = Service(name=name, settings=settings, demo=demo, schema=schema, pool=pool)
    try:
        if participant is not None:
            service.participant = participant(settings)
            await service.participant.start()
        yield service
    finally:
        if service.participant is not None:
            await service.participant.stop()
        await pool.close()


def answers_ddl(table: str) -> str:
    """A table of answers kept per ``Idempotency-Key`` (see :func:`answer_once`)."""
    return f"""
CREATE TABLE IF NOT EXISTS {table} (
    idempotency_key text PRIMARY KEY,
    request         jsonb NOT NULL,
    status_code     int NOT NULL,
    response        jsonb NOT NULL,
    calls           int NOT NULL DEFAULT 1,
    created_at      timestamptz NOT NULL DEFAULT now(),
    last_call_at    timestamptz NOT NULL DEFAULT now()
);
"""


async def answer_once(
    pool: Pool, table: str, key: str, request: BaseModel, status: int, answer: dict[str, Any]
) -> tuple[int, dict[str, Any], int]:
    """How a service answers a call the engine makes (an HTTP step, which it sends again
    under the same ``Idempotency-Key`` after a timeout or a 5xx): the first call's answer
    (``status``, ``answer``) is stored in ``table`` (:func:`answers_ddl`), and every call
    with the key gets it. Returns the stored status, body, and the calls so far."""
    row = await pool.fetchrow(
        f"INSERT INTO {table} (idempotency_key, request, status_code, response) "
        "VALUES ($1, $2::jsonb, $3, $4::jsonb) ON CONFLICT (idempotency_key) DO UPDATE "
        f"SET calls = {table}.calls + 1, last_call_at = now() "
        "RETURNING status_code, response, calls",
        key,
        request.model_dump_json(),
        status,
        orjson.dumps(answer).decode(),
    )
    assert row is not None
    return row["status_code"], orjson.loads(row["response"]), row["calls"]


def observe(app: FastAPI, name: str) -> None:
    """Traces and metrics for this service: exported over OTLP/HTTP when
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (docker-compose points it at Jaeger), with
    spans for its HTTP requests and its queries. Its participant continues each saga's
    trace from the command's ``traceparent`` either way."""
    configure_from_env(service_name=name)
    default_telemetry().instrument_app(app)


def add_health(app: FastAPI, holder: Holder) -> None:
    @app.get("/health", tags=["ops"])
    async def health() -> dict[str, Any]:
        """Answers once the service's schema, pool and participant are up."""
        service = holder.service
        await service.pool.fetchval("SELECT 1")
        return {
            "service": service.name,
            "status": "ok",
            "schema": service.schema,
            "commands": service.participant.command_types if service.participant else [],
            **service.extra_health,
        }
