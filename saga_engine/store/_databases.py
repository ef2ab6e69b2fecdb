"""The Postgres databases of a deployment, and what is done to each of them alike.

One database (``SAGA_PG__DSN``, the default), or past one database the control database
(``SAGA_PG__CONTROL_DSN``) and every shard (``SAGA_PG__SHARDS``). Each gets the same
migrations, in the same schema (``SAGA_PG__DB_SCHEMA``): ``migrate_all`` runs them on
every database at once and reports each (``saga migrate``, the engine's auto-migrate),
one database's failure never hiding the others'. ``database_status`` is what ``saga
shard status`` shows of each: whether it answers (and why not), its schema version, its
sagas.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import asyncpg

from saga_engine.kernel._settings import PostgresSettings, Settings
from saga_engine.store._migrations import _quote_ident, migrate
from saga_engine.store._pgbase import _OPEN_STATUSES

__all__ = [
    "Database",
    "DatabaseStatus",
    "MigrationReport",
    "database_status",
    "deployment_databases",
    "migrate_all",
    "migrate_everywhere",
]

T = TypeVar("T")

#: How long a database may take to accept a connection before it counts as not answering.
CONNECT_TIMEOUT_S = 10.0
#: How long ``database_status``'s reads of one database may take.
STATUS_TIMEOUT_S = 30.0

Role = Literal["database", "control", "shard"]


@dataclass(frozen=True, slots=True)
class Database:
    """One Postgres database of the deployment: ``name`` is the shard's, or ``control``,
    or ``database`` when there is only one. ``dsn`` is a secret: never printed."""

    name: str
    role: Role
    dsn: str = field(repr=False)


def deployment_databases(pg: PostgresSettings) -> list[Database]:
    """The control database then every shard, in the settings' order; or the one
    database when no shards are configured."""
    if not pg.shards:
        return [Database("database", "database", pg.dsn.get_secret_value())]
    if pg.control_dsn is None:  # Settings refuse this; PostgresSettings alone may not
        raise ValueError("SAGA_PG__SHARDS needs SAGA_PG__CONTROL_DSN")
    control = Database("control", "control", pg.control_dsn.get_secret_value())
    return [control, *(Database(s.name, "shard", s.dsn.get_secret_value()) for s in pg.shards)]


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def _on_database(
    database: Database,
    work: Callable[[asyncpg.Connection[Any]], Awaitable[T]],
    command_timeout_s: float | None = None,
) -> T:
    conn = await asyncpg.connect(
        database.dsn, timeout=CONNECT_TIMEOUT_S, command_timeout=command_timeout_s
    )
    try:
        return await work(conn)
    finally:
        await conn.close()


async def _schema_version(conn: asyncpg.Connection[Any], schema: str) -> int | None:
    """The highest migration recorded in ``schema``; None when none is (or no table)."""
    table = f"{_quote_ident(schema)}.schema_migrations"
    if await conn.fetchval("SELECT to_regclass($1)", table) is None:
        return None
    version = await conn.fetchval(f"SELECT max(version) FROM {table}")
    return None if version is None else int(version)


# --------------------------------------------------------------------------- migrations


@dataclass(frozen=True, slots=True)
class MigrationReport:
    """What ``migrate_all`` did to one database: its schema version before and after
    (None: no migration recorded), the versions applied, or the error that stopped it
    (``after`` is then what it could tell, and the migrations before the error stay)."""

    name: str
    role: Role
    before: int | None
    after: int | None
    applied: tuple[int, ...] = ()
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_data(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "role": self.role,
            "before": self.before,
            "after": self.after,
            "applied": list(self.applied),
            "error": None if self.error is None else _reason(self.error),
        }


async def _migrate_one(database: Database, schema: str) -> MigrationReport:
    before: int | None = None
    try:

        async def work(conn: asyncpg.Connection[Any]) -> MigrationReport:
            nonlocal before
            before = await _schema_version(conn, schema)
            applied = await migrate(conn, schema)
            after = await _schema_version(conn, schema)
            return MigrationReport(database.name, database.role, before, after, tuple(applied))

        return await _on_database(database, work)
    except Exception as exc:
        return MigrationReport(database.name, database.role, before, None, error=exc)


async def migrate_all(settings: Settings) -> list[MigrationReport]:
    """Applies the pending migrations to every database of the deployment at once (the
    one database, or the control database and every shard) and reports each, in
    ``deployment_databases`` order; a database that fails is reported, not raised."""
    schema = settings.pg.db_schema
    databases = deployment_databases(settings.pg)
    return list(await asyncio.gather(*(_migrate_one(db, schema) for db in databases)))


async def migrate_everywhere(settings: Settings) -> list[MigrationReport]:
    """``migrate_all`` for an engine's start: the first database's error is raised as it
    was (a transient one lets the start wait for Postgres), after every database had
    its turn."""
    reports = await migrate_all(settings)
    for report in reports:
        if report.error is not None:
            raise report.error
    return reports


# --------------------------------------------------------------------------- status


@dataclass(frozen=True, slots=True)
class DatabaseStatus:
    """One database as ``saga shard status`` shows it: answers or not (``reason`` says
    why not), its schema version, and its sagas (None before its migrations ran)."""

    name: str
    role: Role
    answers: bool
    reason: str | None = None
    schema_version: int | None = None
    sagas: int | None = None
    open_sagas: int | None = None

    def to_data(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "role": self.role,
            "answers": self.answers,
            "reason": self.reason,
            "schema_version": self.schema_version,
            "sagas": self.sagas,
            "open_sagas": self.open_sagas,
        }


async def database_status(database: Database, schema: str) -> DatabaseStatus:
    """Asks ``database`` for its schema version and its sagas (total and open; exact
    counts, a scan of ``sagas``); a database that does not answer is a status saying
    why, never an error."""

    async def work(conn: asyncpg.Connection[Any]) -> DatabaseStatus:
        version = await _schema_version(conn, schema)
        sagas = f"{_quote_ident(schema)}.sagas"
        if version is None or await conn.fetchval("SELECT to_regclass($1)", sagas) is None:
            return DatabaseStatus(database.name, database.role, True, schema_version=version)
        row = await conn.fetchrow(
            f"SELECT count(*) AS total, count(*) FILTER (WHERE status = ANY($1::text[])) "
            f"AS open FROM {sagas}",
            _OPEN_STATUSES,
        )
        assert row is not None  # an aggregate has one row
        return DatabaseStatus(
            database.name, database.role, True, None, version, row["total"], row["open"]
        )

    try:
        return await _on_database(database, work, STATUS_TIMEOUT_S)
    except Exception as exc:
        return DatabaseStatus(database.name, database.role, False, _reason(exc))
