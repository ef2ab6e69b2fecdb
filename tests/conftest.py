"""Fixtures for tests on the real servers.

``make test`` starts Postgres and Kafka (scripts/devstack.py) and passes their addresses
as SAGA_PG__DSN and SAGA_KAFKA__BOOTSTRAP_SERVERS. Each test gets its own Postgres
schema inside a database created for this session, and unique Kafka topic names, so
tests never see each other's data. Unit tests of pure logic use none of these. The
tests of a sharded store also get a database on each further Postgres cluster
(SAGA_DEV_PG_SHARD_DSNS: ``make test`` starts three clusters, the first as always and two
for shards; ``pg_shard_databases``, ``pg_shards``).
"""

from __future__ import annotations

import os

# The CLI's rich consoles are made at import and keep the COLUMNS they find then, and
# pytest-xdist's workers start with COLUMNS=80: each CLI test passes its own width
# (tests/cli/conftest.py), which only works if none was fixed at import.
os.environ.pop("COLUMNS", None)
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from tests.go_kit import go_built  # noqa: F401  (the Go kit's build, a session fixture)
from tests.waiting import TIME_SCALE, eventually, scaled


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``SAGA_TEST_TIME_SCALE`` (tests/waiting.py) stretches each test's time limit (its
    ``timeout`` mark, else the configured one) as it stretches the waits' deadlines."""
    if TIME_SCALE == 1:
        return
    default = float(config.getoption("timeout", None) or config.getini("timeout") or 0)
    for item in items:
        marker = item.get_closest_marker("timeout")
        kwargs = dict(marker.kwargs) if marker is not None else {}
        seconds = float(marker.args[0]) if marker is not None and marker.args else None
        seconds = float(kwargs.get("timeout", seconds if seconds is not None else default))
        if seconds > 0:
            kwargs["timeout"] = scaled(seconds)
            item.add_marker(pytest.mark.timeout(**kwargs), append=False)


def _required_env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(
            f"{name} is not set: integration tests need the real servers. "
            "Run them with `make test` (or `make up` and export what it prints).",
            pytrace=False,
        )
    return value


def _with_database(dsn: str, database: str, **query: str) -> str:
    parts = urlsplit(dsn)
    q = "&".join(f"{k}={v}" for k, v in query.items())
    return urlunsplit((parts.scheme, parts.netloc, "/" + database, q, ""))


@dataclass(frozen=True)
class PgTarget:
    """A Postgres schema of one's own. ``dsn`` sets the search_path to it."""

    dsn: str
    schema: str
    database_dsn: str


async def _create_database(server_dsn: str) -> str:
    name = f"test_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(server_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    return _with_database(server_dsn, name)


async def _drop_database(server_dsn: str, database_dsn: str) -> None:
    name = urlsplit(database_dsn).path.lstrip("/")
    admin = await asyncpg.connect(server_dsn)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.fixture(scope="session")
async def pg_database() -> AsyncIterator[str]:
    """A database created for this test session and dropped at its end."""
    base = _required_env("SAGA_PG__DSN")
    database = await _create_database(base)
    yield database
    await _drop_database(base, database)


@pytest.fixture(scope="session")
async def pg_shard_databases() -> AsyncIterator[tuple[str, ...]]:
    """A database for this test session on each Postgres cluster past the first
    (``SAGA_DEV_PG_SHARD_DSNS``: ``make test`` starts two, ``SAGA_DEV_PG_CLUSTERS=3``),
    dropped at its end: the shards of a sharded store's tests, each a server of its own.
    The first cluster's ``pg_database`` holds their control database."""
    servers = [dsn for dsn in _required_env("SAGA_DEV_PG_SHARD_DSNS").split(",") if dsn]
    if len(servers) < 2:
        pytest.fail(
            f"SAGA_DEV_PG_SHARD_DSNS names {len(servers)} cluster(s); the sharded tests need "
            "two: run them with `make test`, or `SAGA_DEV_PG_CLUSTERS=3 make up` and export "
            "what it prints",
            pytrace=False,
        )
    made: list[tuple[str, str]] = []
    try:
        for server in servers:
            made.append((server, await _create_database(server)))
        yield tuple(database for _, database in made)
    finally:
        for server, database in made:
            await _drop_database(server, database)


async def _schema_in(database_dsn: str, schema: str | None = None) -> PgTarget:
    schema = schema or f"s_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(database_dsn)
    try:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
    finally:
        await conn.close()
    # asyncpg passes unknown DSN query parameters to the server as settings.
    return PgTarget(
        dsn=_with_database(
            database_dsn, urlsplit(database_dsn).path.lstrip("/"), search_path=schema
        ),
        schema=schema,
        database_dsn=database_dsn,
    )


async def _drop_schemas(target: PgTarget) -> None:
    conn = await asyncpg.connect(target.database_dsn)
    try:
        # With the schemas a test derived from its own (a participant's `{schema}_p`, say),
        # so that the next test sees none of them.
        derived = await conn.fetch(
            r"SELECT nspname FROM pg_namespace WHERE nspname = $1 OR nspname LIKE $1 || '\_%'",
            target.schema,
        )
        for row in derived:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{row["nspname"]}" CASCADE')
    finally:
        await conn.close()


@pytest.fixture
async def pg(pg_database: str) -> AsyncIterator[PgTarget]:
    """A fresh schema per test; its DSN puts the schema first on the search_path."""
    target = await _schema_in(pg_database)
    yield target
    await _drop_schemas(target)


@pytest.fixture
async def pg_shards(
    pg: PgTarget, pg_shard_databases: tuple[str, ...]
) -> AsyncIterator[tuple[PgTarget, ...]]:
    """A fresh schema per test on each cluster past the first (``pg_shard_databases``),
    named as the test's ``pg`` schema on the first, which is the shards' control
    database: one ``SAGA_PG__DB_SCHEMA`` serves them all. A test that stops a cluster
    (``scripts/devstack.py pg-stop N``) must start it again before it ends."""
    targets: list[PgTarget] = []
    try:
        for database in pg_shard_databases:
            targets.append(await _schema_in(database, pg.schema))
        yield tuple(targets)
    finally:
        for target in targets:
            await _drop_schemas(target)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    return _required_env("SAGA_KAFKA__BOOTSTRAP_SERVERS")


TopicFactory = Callable[..., Awaitable[str]]


@pytest.fixture
async def kafka_topic(kafka_bootstrap: str) -> AsyncIterator[TopicFactory]:
    """Creates topics with names unique to this test; deletes them afterwards."""
    prefix = f"t{uuid.uuid4().hex[:10]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    created: list[str] = []

    async def create(suffix: str = "topic", partitions: int = 1) -> str:
        name = f"{prefix}.{suffix}"
        await admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
        created.append(name)
        # Created is not yet listed: a client asking for metadata right away (the CLI's
        # `dlq list`, say) may not see the topic. Wait until the broker lists it.
        await eventually(
            admin.list_topics, until=lambda listed: name in listed, what=f"topic {name} listed"
        )
        return name

    try:
        yield create
    finally:
        if created:
            await admin.delete_topics(created)
        await admin.close()


@pytest.fixture
def unique_id() -> str:
    return uuid.uuid4().hex[:12]
