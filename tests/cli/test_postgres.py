"""`saga list`, `show` and `history` reading the real Postgres."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import SecretStr

from saga_engine import SagaStatus
from saga_engine._errors import SagaNotFound
from saga_engine._migrations import migrate
from saga_engine._pgstore import PostgresEventStore
from saga_engine.settings import PostgresSettings
from saga_engine.testing import SagaRun, SagaTestEnv
from tests.admin.sagas import Credit, Noop, Refund, Transfer
from tests.cli.conftest import as_json, invoke, one_line_error
from tests.conftest import PgTarget

pytestmark = pytest.mark.integration


async def _seed(pg: PgTarget) -> dict[str, str]:
    await migrate(pg.database_dsn, pg.schema)
    store = await PostgresEventStore.connect(
        PostgresSettings(dsn=SecretStr(pg.database_dsn), db_schema=pg.schema)
    )
    try:
        env = SagaTestEnv([Transfer, Noop], store=store)
        waiting = await env.engine.start(
            Transfer, {"account": "w", "amount": 3, "wait_for_approval": True}
        )
        assert await env.run_until_settled(SagaRun(env, waiting, Transfer)) == SagaStatus.RUNNING
        done = await env.engine.start(Noop, {})
        assert await env.run_until_settled(SagaRun(env, done, Noop)) == SagaStatus.COMPLETED
        env.participant("payee").on(Credit, reject="closed", times=1)
        env.participant("ledger").on(Refund, reject="locked", times=2)
        stuck = await env.engine.start(Transfer, {"account": "s", "amount": 1})
        assert await env.run_until_settled(SagaRun(env, stuck, Transfer)) == (
            SagaStatus.COMPENSATION_STUCK
        )
        return {"waiting": waiting, "done": done, "stuck": stuck}
    finally:
        await store.close()


@pytest.fixture
def seeded(pg: PgTarget) -> tuple[dict[str, str], dict[str, str]]:
    """Saga ids in known states, and the environment that points the CLI at them."""
    ids = asyncio.run(_seed(pg))
    return ids, {"SAGA_PG__DSN": pg.database_dsn, "SAGA_PG__DB_SCHEMA": pg.schema}


def test_list_filters_by_status_and_type(seeded: tuple[dict[str, str], dict[str, str]]) -> None:
    ids, env = seeded
    everything = as_json(invoke(["list", "--json"], env))
    assert sorted(s["saga_id"] for s in everything) == sorted(ids.values())
    running = as_json(invoke(["list", "--status", "running", "--json"], env))
    assert [s["saga_id"] for s in running] == [ids["waiting"]]
    parked = as_json(
        invoke(["list", "--status", "running", "--status", "compensation_stuck", "--json"], env)
    )
    assert sorted(s["saga_id"] for s in parked) == sorted([ids["waiting"], ids["stuck"]])
    noops = as_json(invoke(["list", "--type", "noop", "--json"], env))
    assert [(s["saga_id"], s["status"]) for s in noops] == [(ids["done"], "completed")]
    assert len(as_json(invoke(["list", "--limit", "1", "--json"], env))) == 1
    table = invoke(["list"], env)
    assert table.exit_code == 0, table.output
    assert ids["stuck"] in table.stdout
    assert "compensation_stuck" in table.stdout
    bad = invoke(["list", "--status", "sleeping"], env)
    assert bad.exit_code == 2  # usage error from typer


def test_show_a_saga_with_owed_compensations(
    seeded: tuple[dict[str, str], dict[str, str]],
) -> None:
    ids, env = seeded
    waiting = as_json(invoke(["show", ids["waiting"], "--json"], env))
    assert waiting["status"] == "running"
    assert waiting["saga_type"] == "transfer"
    assert [(p["step"], p["state"]) for p in waiting["pending_compensations"]] == [
        ("credit", "owed"),
        ("debit", "owed"),
    ]
    stuck = as_json(invoke(["show", ids["stuck"], "--json"], env))
    assert stuck["status"] == "compensation_stuck"
    assert stuck["error"] is not None
    [pending] = stuck["pending_compensations"]
    assert (pending["step"], pending["state"], pending["attempts"]) == ("debit", "stuck", 2)
    table = invoke(["show", ids["stuck"]], env)
    assert table.exit_code == 0, table.output
    for text in ("compensation_stuck", "compensations owed", "debit", "locked"):
        assert text in table.stdout, text
    done = invoke(["show", ids["done"]], env)
    assert "no compensations owed" in done.stdout


def test_history_of_a_saga(seeded: tuple[dict[str, str], dict[str, str]]) -> None:
    ids, env = seeded
    exported = as_json(invoke(["history", ids["done"], "--json"], env))
    assert exported["saga_id"] == ids["done"]
    assert next(e["kind"] for e in exported["events"]) == "saga_started"
    assert exported["events"][-1]["kind"] == "saga_completed"
    table = invoke(["history", ids["done"]], env)
    assert table.exit_code == 0
    assert "saga_completed" in table.stdout


def test_unknown_saga_is_one_line_error(seeded: tuple[dict[str, str], dict[str, str]]) -> None:
    _, env = seeded
    for command in (["show", "nope"], ["history", "nope"], ["show", "nope", "--json"]):
        line = one_line_error(invoke(command, env))
        assert "nope" in line
    debug = invoke(["--debug", "show", "nope"], env)
    assert debug.exit_code == 1
    assert isinstance(debug.exception, SagaNotFound)
    assert debug.exc_info is not None
    assert debug.exc_info[2] is not None


def test_an_unreachable_database_is_one_line_error() -> None:
    env = {"SAGA_PG__DSN": "postgresql://postgres@127.0.0.1:1/none"}
    line = one_line_error(invoke(["list"], env))
    assert "error:" in line
