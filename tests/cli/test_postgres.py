"""`saga list`, `show` and `history`: through an engine's admin API over the real Postgres."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import datetime

import pytest
from pydantic import SecretStr

from saga_engine import SagaStatus
from saga_engine.cli import CliError
from saga_engine.settings import AdminSettings, PostgresSettings, Settings
from saga_engine.store import PostgresEventStore, migrate
from saga_engine.testing import SagaRun, SagaTestEnv
from tests.admin.sagas import Credit, Empty, Leaf, Middle, Noop, Refund, Root, Transfer
from tests.admin.served import served_in_thread
from tests.cli.conftest import as_json, invoke, one_line_error
from tests.conftest import PgTarget

pytestmark = pytest.mark.integration


async def _seed(env: SagaTestEnv) -> dict[str, str]:
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


@pytest.fixture
def seeded(pg: PgTarget) -> Iterator[tuple[dict[str, str], dict[str, str]]]:
    """Saga ids in known states in a real Postgres, an engine's admin API over them, and
    the environment that points the CLI at that API (by host and port, as an operator
    on the engine's machine would have them)."""
    asyncio.run(migrate(pg.database_dsn, pg.schema))

    async def store() -> PostgresEventStore:
        return await PostgresEventStore.connect(
            PostgresSettings(dsn=SecretStr(pg.database_dsn), db_schema=pg.schema)
        )

    settings = Settings(admin=AdminSettings(host="127.0.0.1", port=0))
    with served_in_thread(settings, _seed, store) as served:
        port = served.url.rsplit(":", 1)[1]
        yield served.seeded, {"SAGA_ADMIN__HOST": "127.0.0.1", "SAGA_ADMIN__PORT": port}


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
    wide = invoke(["list", "--wide"], env)
    assert wide.exit_code == 0, wide.output
    assert ids["stuck"] in wide.stdout  # the whole id
    assert "CompensationStuck" in wide.stdout  # and its error
    bad = invoke(["list", "--status", "sleeping"], env)
    assert bad.exit_code == 2  # usage error from typer


def test_list_by_activity_with_whole_ids_at_80_columns(
    seeded: tuple[dict[str, str], dict[str, str]],
) -> None:
    ids, env = seeded
    # Newest activity first by default (the test clock may give sagas the same time:
    # ties go by id, descending).
    listed = as_json(invoke(["list", "--json"], env))
    newest = [s["saga_id"] for s in listed]
    assert sorted(newest) == sorted(ids.values())
    activity = {s["saga_id"]: datetime.fromisoformat(s["activity_at"]) for s in listed}
    assert newest == sorted(newest, key=lambda i: (activity[i], i), reverse=True)
    by_id = as_json(invoke(["list", "--sort", "id", "--json"], env))
    assert [s["saga_id"] for s in by_id] == sorted(ids.values())
    assert invoke(["list", "--sort", "age"], env).exit_code == 2
    # An 80-column terminal: every id whole, on one line, newest first; the counts.
    table = invoke(["list"], {**env, "COLUMNS": "80"})
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    rows = [next(n for n, line in enumerate(lines) if i in line) for i in newest]
    assert rows == sorted(rows)
    assert max(len(line) for line in lines) <= 80
    assert "compensation_stuck 1" in table.stdout
    wide = invoke(["list"], env)
    assert "signal 'approve'" in wide.stdout  # what the waiting saga waits for


def test_show_prints_input_and_output(seeded: tuple[dict[str, str], dict[str, str]]) -> None:
    ids, env = seeded
    waiting = invoke(["show", ids["waiting"]], env)
    assert waiting.exit_code == 0, waiting.output
    assert '"account": "w"' in waiting.stdout
    assert '"wait_for_approval": true' in waiting.stdout
    done = as_json(invoke(["show", ids["done"], "--json"], env))
    shown = invoke(["show", ids["done"]], env).stdout
    assert "output" in shown
    for key in done["output"]:
        assert f'"{key}"' in shown
    stuck = invoke(["show", ids["stuck"]], env).stdout
    assert '"type": "CompensationStuck"' in stuck  # the error, details included


def test_show_a_saga_with_owed_compensations(
    seeded: tuple[dict[str, str], dict[str, str]],
) -> None:
    ids, env = seeded
    waiting = as_json(invoke(["show", ids["waiting"], "--json"], env))
    assert waiting["status"] == "running"
    assert [(w["kind"], w["name"], w["until"]) for w in waiting["waiting_for"]] == [
        ("signal", "approve", None)
    ]
    shown = invoke(["show", ids["waiting"]], env)
    assert "waiting for" in shown.stdout
    assert "signal 'approve' (no deadline)" in shown.stdout
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
    [wait] = stuck["waiting_for"]
    assert (wait["kind"], wait["step"], wait["compensation"]) == ("operator", "debit", True)
    table = invoke(["show", ids["stuck"]], env)
    assert table.exit_code == 0, table.output
    for text in ("compensation_stuck", "compensations owed", "debit", "locked", "is stuck"):
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
    assert table.exit_code == 0, table.output
    assert "saga_completed" in table.stdout
    # Each line carries the gist of its payload: the input, the reason and who acted.
    stuck = invoke(["history", ids["stuck"]], env)
    assert 'input {"account":"s","amount":1,"wait_for_approval":false}' in stuck.stdout
    assert "error 'closed'" in stuck.stdout
    assert "CompensationStuck: compensation of 'debit' still failing" in stuck.stdout


def test_operator_actions_answer_what_the_api_answers(
    seeded: tuple[dict[str, str], dict[str, str]],
) -> None:
    ids, env = seeded
    # A signal to a finished saga: the API's 409 and its reason, exit 4.
    late = one_line_error(invoke(["signal", ids["done"], "approve", "--payload", "{}"], env), 4)
    assert late.startswith("error: 409: ")
    assert "completed" in late
    # A payload the signal's model refuses: 422 naming the field, exit 5.
    wrong = one_line_error(invoke(["signal", ids["waiting"], "approve", "--payload", "{}"], env), 5)
    assert "by" in wrong
    # Skipping a step that waits for its reply needs a result...
    need = one_line_error(invoke(["skip", ids["waiting"], "debit", "--reason", "r"], env), 5)
    assert "needs a result" in need
    # ...a stuck compensation does not: the operator undid it by hand.
    skipped = as_json(
        invoke(["skip", ids["stuck"], "debit", "--reason", "refunded by hand", "--json"], env)
    )
    assert (skipped["action"], skipped["status"]) == ("skip", "compensated")
    # Cancel goes through the API too, and says so when it no longer applies.
    cancelled = as_json(invoke(["cancel", ids["waiting"], "--reason", "called", "--json"], env))
    assert cancelled["action"] == "cancel"
    again = one_line_error(invoke(["cancel", ids["done"], "--reason", "late"], env), 4)
    assert "completed" in again


def test_unknown_saga_is_one_line_error(seeded: tuple[dict[str, str], dict[str, str]]) -> None:
    _, env = seeded
    for command in (["show", "nope"], ["history", "nope"], ["show", "nope", "--json"]):
        line = one_line_error(invoke(command, env), 3)
        assert line.startswith("error: 404: ")
        assert "nope" in line
    debug = invoke(["--debug", "show", "nope"], env)
    assert debug.exit_code == 1
    assert isinstance(debug.exception, CliError)
    assert debug.exc_info is not None
    assert debug.exc_info[2] is not None


def test_an_unreachable_admin_api_is_one_line_error() -> None:
    env = {"SAGA_ADMIN__HOST": "127.0.0.1", "SAGA_ADMIN__PORT": "1"}
    line = one_line_error(invoke(["list"], env), 7)
    assert "could not reach the admin API at http://127.0.0.1:1" in line


def test_show_names_a_sagas_parent_and_children(pg: PgTarget) -> None:
    asyncio.run(migrate(pg.database_dsn, pg.schema))

    async def store() -> PostgresEventStore:
        return await PostgresEventStore.connect(
            PostgresSettings(dsn=SecretStr(pg.database_dsn), db_schema=pg.schema)
        )

    async def seed(env: SagaTestEnv) -> dict[str, str]:
        root = await env.engine.start(Root, Empty())
        assert await env.run_until_settled(SagaRun(env, root, Root)) == SagaStatus.COMPLETED
        return {"root": root}

    settings = Settings(admin=AdminSettings(host="127.0.0.1", port=0))
    with served_in_thread(settings, seed, store, sagas=(Root, Middle, Leaf)) as served:
        env = {"SAGA_ADMIN_URL": served.url}
        root = as_json(invoke(["show", served.seeded["root"], "--json"], env))
        [middle] = root["children"]
        shown = invoke(["show", middle["saga_id"]], env)
        assert shown.exit_code == 0, shown.output
        assert f"root {served.seeded['root']}" in shown.stdout  # its parent
        assert "child sagas" in shown.stdout
        assert "child:a" in shown.stdout
        assert "child:b" in shown.stdout
