"""The contract suites' shards: the Postgres databases a sharded store's contract runs on.

``pg_shards`` is the one place that says where the shards live: today two databases of
the test cluster (the session's, and one more made here), each test in a fresh schema
of both. Pointing the suite at separate clusters changes this fixture only.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from tests.conftest import PgTarget


@pytest.fixture(scope="session")
async def pg_second_database(pg_database: str) -> AsyncIterator[str]:
    """A second database on the session's cluster, dropped at the session's end."""
    name = f"{urlsplit(pg_database).path.lstrip('/')}_b"
    dsn = urlunsplit(urlsplit(pg_database)._replace(path=f"/{name}"))
    admin = await asyncpg.connect(pg_database)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    yield dsn
    admin = await asyncpg.connect(pg_database)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.fixture
async def pg_shards(pg: PgTarget, pg_second_database: str) -> AsyncIterator[tuple[PgTarget, ...]]:
    """Two shards' Postgres targets: ``pg``'s schema, and a fresh schema of the second
    database (dropped after the test)."""
    schema = f"s_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(pg_second_database)
    try:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
    finally:
        await conn.close()
    parts = urlsplit(pg_second_database)
    second = PgTarget(
        dsn=urlunsplit(parts._replace(query=f"search_path={schema}")),
        schema=schema,
        database_dsn=pg_second_database,
    )
    yield (pg, second)
    conn = await asyncpg.connect(pg_second_database)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()
