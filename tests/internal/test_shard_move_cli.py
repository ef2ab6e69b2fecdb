"""``saga shard move`` (issue 43) on real Postgres clusters: shard ``a`` on the second
cluster, ``b`` on the third, ``c`` in the control database's schema on the first. A
move run through the command, killed (SIGKILL, ``SAGA_CRASH_AT``) at each of its steps
and run again; refusals that change nothing; ``saga shard status`` while one is under
way."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from saga_engine.protocol import partition_for
from saga_engine.store._pgshard_move import MOVE_CRASH_POINTS
from tests.cli.conftest import as_json, invoke, one_line_error
from tests.conftest import PgTarget
from tests.doc_blocks import code_blocks
from tests.internal.test_shard_move import PARTITIONS, rows, settings_of, write_sagas

pytestmark = pytest.mark.integration

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def _env(pg: PgTarget, shards: tuple[PgTarget, ...]) -> dict[str, str]:
    """The environment of ``settings_of``'s deployment, for the command."""
    pg_settings = settings_of(pg, shards).pg
    listed = [
        {"name": s.name, "partitions": s.partitions, "dsn": s.dsn.get_secret_value()}
        for s in pg_settings.shards
    ]
    return {
        "SAGA_PG__SHARDS": orjson.dumps(listed).decode(),
        "SAGA_PG__CONTROL_DSN": pg.database_dsn,
        "SAGA_PG__DB_SCHEMA": pg.schema,
        "SAGA_KAFKA__PARTITIONS": str(PARTITIONS),
    }


def _prepare(pg: PgTarget, shards: tuple[PgTarget, ...], count: int) -> list[str]:
    """Every database migrated, the map seeded (all on ``a``), ``count`` sagas on ``a``."""
    return asyncio.run(write_sagas(settings_of(pg, shards), count))


async def _state(pg: PgTarget, shards: tuple[PgTarget, ...]) -> dict[str, Any]:
    """What each database holds: sagas, decision rows, the fence; the map's epoch and
    move."""
    out: dict[str, Any] = {}
    for name, target in (("a", shards[0]), ("b", shards[1]), ("c", pg)):
        sagas = await rows(target, "SELECT saga_id, last_seq FROM sagas ORDER BY saga_id")
        decisions = await rows(target, "SELECT saga_id, seq FROM saga_decisions")
        fence = await rows(target, "SELECT partition, state FROM shard_partitions")
        out[name] = (
            [(r["saga_id"], r["last_seq"]) for r in sagas],
            sorted((r["saga_id"], r["seq"]) for r in decisions),
            sorted((r["partition"], r["state"]) for r in fence),
        )
    [row] = await rows(pg, "SELECT epoch, moving FROM shard_map ORDER BY epoch DESC LIMIT 1")
    out["map"] = (row["epoch"], row["moving"])
    return out


def _saga_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "saga_engine", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_move_through_the_command(pg: PgTarget, pg_shards: tuple[PgTarget, ...]) -> None:
    ids = _prepare(pg, pg_shards, 40)
    env = _env(pg, pg_shards)
    result = invoke(["shard", "move", "--partitions", "4-7", "--to", "b", "--json"], env)
    report = as_json(result)
    moved = {i for i in ids if partition_for(i, PARTITIONS) >= 4}
    assert (report["outcome"], report["epoch"], report["sagas"]) == ("moved", 2, len(moved))
    assert report["from"] == {"a": "4-7"}
    assert report["paused_s"] >= 0
    assert "copied" in result.stderr
    state = asyncio.run(_state(pg, pg_shards))
    assert {s for s, _ in state["b"][0]} == moved
    assert {s for s, _ in state["a"][0]} == set(ids) - moved
    status = as_json(invoke(["shard", "status", "--json"], env))
    assert status["map"]["epoch"] == 2
    assert status["map"]["moving"] is None
    assert {r["name"]: r["partitions"] for r in status["shards"]} == {
        "a": "0-3",
        "b": "4-7",
        "c": "",
    }

    shown = invoke(["shard", "move", "--partitions", "0-1", "--to", "c"], env)
    assert shown.exit_code == 0, shown.output
    assert "sagas copied" in shown.stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--partitions", "1-2", "--to", "z"], "no shard is named 'z'"),
        (["--partitions", "6-9", "--to", "b"], "partition 9 does not exist"),
        (["--partitions", "0-7", "--to", "a"], "already on shard 'a'"),
        (["--partitions", "0-2"], "name the range and where it goes"),
        (["--abort"], "no move is under way"),
    ],
)
def test_a_bad_request_changes_nothing(
    pg: PgTarget, pg_shards: tuple[PgTarget, ...], args: list[str], says: str
) -> None:
    _prepare(pg, pg_shards, 5)
    before = asyncio.run(_state(pg, pg_shards))
    line = one_line_error(invoke(["shard", "move", *args], _env(pg, pg_shards)))
    assert says in line
    assert asyncio.run(_state(pg, pg_shards)) == before


def test_a_move_killed_at_each_step_finishes_when_run_again(
    pg: PgTarget, pg_shards: tuple[PgTarget, ...]
) -> None:
    """One move, SIGKILLed at every crash point in turn (each run gets one step further),
    then run to its end: the same result as a move never killed."""
    ids = _prepare(pg, pg_shards, 24)
    env = _env(pg, pg_shards)
    before = asyncio.run(_state(pg, pg_shards))
    args = ("shard", "move", "--partitions", "2-5", "--to", "c", "--batch", "5")
    for point in MOVE_CRASH_POINTS:
        killed = _saga_cli({**env, "SAGA_CRASH_AT": point}, *args)
        assert killed.returncode == -9, (point, killed.stdout, killed.stderr)
        assert f"crash point {point} reached" in killed.stderr
        if point == "move_after_copy_batch":  # a different move is refused meanwhile
            other = invoke(["shard", "move", "--partitions", "6-7", "--to", "b"], env)
            assert "another move is under way" in one_line_error(other)
            status = as_json(invoke(["shard", "status", "--json"], env))
            assert status["map"]["moving"]["partitions"] == "2-5"
            shown = invoke(["shard", "status"], env)
            assert "paused since" in shown.stdout
    done = _saga_cli(env, *args, "--json")
    assert done.returncode == 0, done.stderr
    assert orjson.loads(done.stdout)["outcome"] == "moved"
    state = asyncio.run(_state(pg, pg_shards))
    moved = {i for i in ids if 2 <= partition_for(i, PARTITIONS) <= 5}
    c_sagas, c_decisions, c_fence = state["c"]
    a_before, a_decisions_before, _ = before["a"]
    # nothing doubled, nothing lost: the moved sagas' rows exactly as they were on a
    assert c_sagas == [row for row in a_before if row[0] in moved]
    assert c_decisions == [row for row in a_decisions_before if row[0] in moved]
    assert c_fence == [(p, "active") for p in range(2, 6)]
    a_sagas, _, a_fence = state["a"]
    assert {s for s, _ in a_sagas} == set(ids) - moved
    assert a_fence == [(p, "active") for p in (0, 1, 6, 7)]
    assert state["map"] == (2, None)


def test_abort_through_the_command(pg: PgTarget, pg_shards: tuple[PgTarget, ...]) -> None:
    _prepare(pg, pg_shards, 12)
    env = _env(pg, pg_shards)
    before = asyncio.run(_state(pg, pg_shards))
    args = ("shard", "move", "--partitions", "0-3", "--to", "b")
    killed = _saga_cli({**env, "SAGA_CRASH_AT": "move_after_verify"}, *args)
    assert killed.returncode == -9, killed.stderr
    aborted = as_json(invoke(["shard", "move", "--abort", "--json"], env))
    assert aborted["outcome"] == "aborted"
    after = asyncio.run(_state(pg, pg_shards))
    assert after["b"] == ([], [], [])
    assert after["a"][:2] == before["a"][:2]
    assert after["a"][2] == [(p, "active") for p in range(8)]
    assert after["map"] == (1, None)

    killed = _saga_cli({**env, "SAGA_CRASH_AT": "move_after_commit"}, *args)
    assert killed.returncode == -9, killed.stderr
    refused = one_line_error(invoke(["shard", "move", "--abort"], env))
    assert "past its commit point" in refused


def test_the_documented_move_runs_as_written(pg: PgTarget, pg_shards: tuple[PgTarget, ...]) -> None:
    """docs/operations.md, "Moving a range": its commands, on a map of 64 partitions
    where c holds none."""
    [block] = code_blocks(OPERATIONS, "shell", under="### Moving a range")
    a, b = pg_shards
    listed = [
        {"name": "a", "partitions": "0-31", "dsn": a.database_dsn},
        {"name": "b", "partitions": "32-63", "dsn": b.database_dsn},
        {"name": "c", "partitions": "", "dsn": pg.database_dsn},
    ]
    env = {
        "SAGA_PG__SHARDS": orjson.dumps(listed).decode(),
        "SAGA_PG__CONTROL_DSN": pg.database_dsn,
        "SAGA_PG__DB_SCHEMA": pg.schema,
        "SAGA_KAFKA__PARTITIONS": "64",
    }
    assert invoke(["migrate"], env).exit_code == 0
    asyncio.run(_seed_map(pg, {"a": "0-31", "b": "32-63", "c": ""}, 64))
    for line in block.code.splitlines():
        args = line.split("#", 1)[0].split()
        assert args[0] == "saga", line
        done = invoke(args[1:], env)
        assert done.exit_code == 0, (line, done.output)
    status = as_json(invoke(["shard", "status", "--json"], env))
    assert {r["name"]: r["partitions"] for r in status["shards"]} == {
        "a": "0-31",
        "b": "32-47",
        "c": "48-63",
    }
    assert status["map"]["epoch"] == 2


async def _seed_map(pg: PgTarget, shards: dict[str, str], partitions: int) -> None:
    data = {"epoch": 1, "partitions": partitions, "shards": shards}
    await rows(
        pg, f"INSERT INTO shard_map (epoch, map) VALUES (1, '{orjson.dumps(data).decode()}')"
    )


def test_one_database_has_nothing_to_move(pg: PgTarget) -> None:
    env = {"SAGA_PG__DSN": pg.database_dsn, "SAGA_PG__DB_SCHEMA": pg.schema}
    line = one_line_error(invoke(["shard", "move", "--partitions", "0-3", "--to", "b"], env))
    assert "no shards are configured" in line
