"""`saga archive` and replaying archived sagas, on the real Postgres: finished sagas
are archived (to the table, or to a directory) and deleted; open ones stay; an archived
saga still replays, by id or from its archive file."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import SecretStr

from saga_engine import SagaStatus
from saga_engine.settings import PostgresSettings
from saga_engine.store import PostgresEventStore, migrate
from saga_engine.testing import SagaRun, SagaTestEnv
from tests.admin.sagas import Noop, Transfer
from tests.cli.conftest import as_json, invoke
from tests.conftest import PgTarget

pytestmark = pytest.mark.integration

SAGAS = ["--sagas", "tests.admin.sagas"]


async def _seed(pg: PgTarget) -> tuple[list[str], str]:
    await migrate(pg.database_dsn, pg.schema)
    store = await PostgresEventStore.connect(
        PostgresSettings(dsn=SecretStr(pg.database_dsn), db_schema=pg.schema)
    )
    try:
        # Started a day ago, so that "older than 0s" (the real clock) takes them.
        yesterday = datetime.now(UTC) - timedelta(days=1)
        env = SagaTestEnv([Transfer, Noop], store=store, start_time=yesterday)
        done = []
        for _ in range(3):
            saga_id = await env.engine.start(Noop, {})
            assert await env.run_until_settled(SagaRun(env, saga_id, Noop)) is (
                SagaStatus.COMPLETED
            )
            done.append(saga_id)
        waiting = await env.engine.start(
            Transfer, {"account": "w", "amount": 3, "wait_for_approval": True}
        )
        assert await env.run_until_settled(SagaRun(env, waiting, Transfer)) is (SagaStatus.RUNNING)
        return sorted(done), waiting
    finally:
        await store.close()


@pytest.fixture
def seeded(pg: PgTarget) -> tuple[list[str], str, dict[str, str]]:
    done, waiting = asyncio.run(_seed(pg))
    return done, waiting, {"SAGA_PG__DSN": pg.database_dsn, "SAGA_PG__DB_SCHEMA": pg.schema}


def _listed(env: dict[str, str]) -> list[str]:
    """The sagas left in the schema (read from Postgres: `saga list` asks an engine)."""

    async def read() -> list[str]:
        store = await PostgresEventStore.connect(
            PostgresSettings(
                dsn=SecretStr(env["SAGA_PG__DSN"]), db_schema=env["SAGA_PG__DB_SCHEMA"]
            )
        )
        try:
            return sorted(r.saga_id for r in await store.list_sagas(limit=1000))
        finally:
            await store.close()

    return asyncio.run(read())


def test_archive_to_the_table_then_replay_by_id(
    seeded: tuple[list[str], str, dict[str, str]],
) -> None:
    done, waiting, env = seeded
    dry = as_json(invoke(["archive", "--older-than", "0s", "--dry-run", "--json"], env))
    assert (dry["found"], dry["deleted"]) == (3, 0)
    assert _listed(env) == sorted([*done, waiting])  # a dry run changes nothing

    report = as_json(invoke(["archive", "--older-than", "0s", "--json"], env))
    assert (report["found"], report["deleted"], report["archive"]) == (3, 3, "table")
    assert _listed(env) == [waiting]  # the open saga stays

    replayed = as_json(invoke(["replay", done[0], *SAGAS, "--json"], env))
    assert replayed["saga_id"] == done[0]
    assert replayed["deterministic"] is True
    assert replayed["status"] == "completed"
    # Nothing left past the period: a second pass archives nothing.
    assert as_json(invoke(["archive", "--older-than", "0s", "--json"], env))["deleted"] == 0


def test_archive_to_a_directory_then_replay_the_file(
    seeded: tuple[list[str], str, dict[str, str]], tmp_path: Path
) -> None:
    done, waiting, env = seeded
    to_dir = {
        **env,
        "SAGA_RETENTION__ARCHIVE": "directory",
        "SAGA_RETENTION__DIRECTORY": str(tmp_path / "archive"),
    }
    report = as_json(invoke(["archive", "--older-than", "0s", "--json"], to_dir))
    assert report["deleted"] == 3
    [file] = report["files"]
    assert Path(file).name.endswith(".jsonl.gz")
    assert _listed(env) == [waiting]
    replayed = as_json(invoke(["replay", file, *SAGAS, "--json"], env))
    assert sorted(r["saga_id"] for r in replayed["histories"]) == done
    assert replayed["diverged"] == 0


def test_a_bad_period_is_refused_before_anything_changes(
    seeded: tuple[list[str], str, dict[str, str]],
) -> None:
    done, waiting, env = seeded
    result = invoke(["archive", "--older-than", "soon"], env)
    assert result.exit_code == 2
    assert "not a duration" in result.output
    assert _listed(env) == sorted([*done, waiting])
