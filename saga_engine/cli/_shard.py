"""``saga shard status``: the store's databases past one (docs/operations.md, "Past one
database"), read directly from Postgres, not through an engine: the shard map in force
(its epoch, each shard's partitions, a move under way), and whether each database
answers, with its schema version and its sagas. A database that does not answer is a row
saying why; the exit code is 0 when every database answers, 1 otherwise. Without shards
it shows the one database.

``saga shard move --partitions 48-63 --to c``: moves a range of inbox partitions to
another shard online (store/_pgshard_move.py), or resumes the move left unfinished;
``--abort`` undoes one before its commit point. Progress goes to stderr, the summary to
stdout."""

from __future__ import annotations

import asyncio
import os
from typing import Annotated, Any

import typer

from saga_engine.cli._common import (
    JsonOpt,
    err,
    fail,
    field_table,
    make_table,
    out,
    print_json,
    run_async,
)
from saga_engine.kernel._crash import crash_hook
from saga_engine.kernel._settings import Settings
from saga_engine.kernel._shards import ShardMap
from saga_engine.store._databases import (
    Database,
    DatabaseStatus,
    database_status,
    deployment_databases,
)
from saga_engine.store._pgshard_map import PostgresShardMapStore, StoredShardMap
from saga_engine.store._pgshard_move import DEFAULT_BATCH, MoveReport, ShardMover

__all__ = ["shard_app"]

shard_app = typer.Typer(
    no_args_is_help=True,
    help="The store's shards past one database: the shard map and each shard's state.",
)


async def _stored_map(control: Database, schema: str) -> StoredShardMap | str:
    """The control database's current map, or why it could not be read."""
    try:
        async with PostgresShardMapStore.opened(control.dsn, schema) as maps:
            stored = await maps.current()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return stored if stored is not None else "not seeded yet (the first engine's start writes it)"


async def _status(settings: Settings) -> dict[str, Any]:
    schema = settings.pg.db_schema
    databases = deployment_databases(settings.pg)
    statuses = await asyncio.gather(*(database_status(db, schema) for db in databases))
    if not settings.pg.shards:
        [one] = statuses
        return {
            "sharded": False,
            "schema": schema,
            "partitions": settings.kafka.partitions,
            "database": one.to_data(),
            "all_answer": one.answers,
        }
    control, shards = statuses[0], statuses[1:]
    settings_map = settings.shard_map()
    assert settings_map is not None  # shards are configured
    stored = await _stored_map(databases[0], schema) if control.answers else control.reason
    in_force: ShardMap = stored.map if isinstance(stored, StoredShardMap) else settings_map
    rows = _shard_rows(in_force, shards)
    return {
        "sharded": True,
        "schema": schema,
        "partitions": in_force.partitions,
        "map": _map_data(in_force, stored),
        "control": control.to_data(),
        "shards": rows,
        "all_answer": control.answers and all(row["answers"] for row in rows),
    }


def _map_data(in_force: ShardMap, stored: StoredShardMap | str | None) -> dict[str, Any]:
    if isinstance(stored, StoredShardMap):
        return {
            "epoch": in_force.epoch,
            "source": "control database",
            "written_at": stored.written_at,
            "moving": stored.moving,
        }
    return {
        "epoch": None,
        "source": f"settings (the control database's map: {stored})",
        "written_at": None,
        "moving": None,
    }


def _shard_rows(in_force: ShardMap, shards: list[DatabaseStatus]) -> list[dict[str, Any]]:
    ranges = in_force.ranges()
    rows = [{**s.to_data(), "partitions": ranges.get(s.name, "")} for s in shards]
    configured = {s.name for s in shards}
    for name in in_force.names:  # a shard of the stored map the settings do not name
        if name not in configured:
            rows.append(
                {
                    **DatabaseStatus(name, "shard", False, "no DSN in SAGA_PG__SHARDS").to_data(),
                    "partitions": ranges[name],
                }
            )
    return rows


def _cells(row: dict[str, Any], partitions: str) -> tuple[str, ...]:
    def number(value: Any) -> str:
        return "" if value is None else str(value)

    answers = "yes" if row["answers"] else f"no: {row['reason']}"
    version = row["schema_version"]
    return (
        row["name"],
        row["role"],
        partitions,
        answers,
        "not migrated" if row["answers"] and version is None else number(version),
        number(row["sagas"]),
        number(row["open_sagas"]),
    )


_COLUMNS = ("database", "role", "partitions", "answers", "schema version", "sagas", "open")


def _print(status: dict[str, Any]) -> None:
    if not status["sharded"]:
        one = status["database"]
        out.print(f"one database (no SAGA_PG__SHARDS), schema {status['schema']}")
        rows = [_cells(one, f"all {status['partitions']}")]
        out.print(make_table("one database", _COLUMNS, rows))
        return
    shard_map = status["map"]
    fields = [
        ("epoch", str(shard_map["epoch"] or "")),
        ("from", shard_map["source"]),
        ("written at", str(shard_map["written_at"] or "")),
        ("inbox partitions", str(status["partitions"])),
        ("schema", status["schema"]),
    ]
    moving = shard_map["moving"]
    if moving:
        fields.append(("moving", _moving_text(moving, shard_map["epoch"])))
    out.print(field_table("shard map", fields))
    rows = [_cells(status["control"], "")]
    rows += [_cells(row, row["partitions"] or "none") for row in status["shards"]]
    out.print(make_table("databases", _COLUMNS, rows))


@shard_app.command("status")
def status(as_json: JsonOpt = False) -> None:
    """The shard map in force and each database's state (exit 1 if one does not answer)."""
    settings = Settings()
    result = run_async(lambda: _status(settings))
    if as_json:
        print_json(result)
    else:
        _print(result)
    raise typer.Exit(0 if result["all_answer"] else 1)


def _moving_text(moving: dict[str, Any], epoch: int | None) -> str:
    """A move under way as one line: what moves where, and how far it got."""
    sources = ", ".join(f"{ps} from {name}" for name, ps in moving.get("from", {}).items())
    if moving.get("committed_at"):
        stage = f"committed at {moving['committed_at']} (epoch {epoch}): cleanup left"
    elif moving.get("paused_at"):
        stage = f"paused since {moving['paused_at']}: copying, commit not reached"
    else:
        stage = f"recorded at {moving.get('started_at')}: not paused yet"
    return f"partitions {moving.get('partitions')} to {moving.get('to')} ({sources}); {stage}"


def _progress(line: str) -> None:
    err.print(line, highlight=False, soft_wrap=True)


def _print_move(report: MoveReport) -> None:
    sources = ", ".join(f"{ps} from {name}" for name, ps in report.sources.items())
    fields = [
        ("outcome", report.outcome + (" (resumed)" if report.resumed else "")),
        ("partitions", f"{report.partitions} to {report.to} ({sources})"),
        ("shard map epoch", str(report.epoch)),
        ("sagas copied", str(report.sagas)),
        ("seconds", f"{report.seconds:.2f}"),
    ]
    if report.paused_s is not None:
        fields.append(("range paused (s)", f"{report.paused_s:.2f}"))
    fields += [(f"rows: {table}", str(n)) for table, n in report.rows.items()]
    out.print(field_table("shard move", fields))


@shard_app.command("move")
def move(
    partitions: Annotated[
        str | None,
        typer.Option("--partitions", help="The inbox partitions to move: '48-63', '4,6-7'."),
    ] = None,
    to: Annotated[str | None, typer.Option("--to", help="The shard they move to.")] = None,
    abort: Annotated[
        bool, typer.Option("--abort", help="Undo the move under way (before its commit point).")
    ] = False,
    batch: Annotated[
        int, typer.Option("--batch", min=1, help="Sagas per batch of the copy.")
    ] = DEFAULT_BATCH,
    as_json: JsonOpt = False,
) -> None:
    """Move a range of inbox partitions to another shard online, or resume the move under
    way (each step can be run again); --abort undoes it before its commit point."""
    if not abort and (partitions is None or to is None):
        fail("name the range and where it goes: --partitions 48-63 --to c (or --abort)")
    settings = Settings()
    hook = crash_hook(os.environ.get("SAGA_CRASH_AT"))

    async def run() -> MoveReport:
        async with ShardMover.opened(
            settings.pg, batch=batch, crash=hook, progress=_progress
        ) as mover:
            if abort:
                return await mover.abort(partitions, to)
            assert partitions is not None
            assert to is not None
            return await mover.move(partitions, to)

    report = run_async(run)
    if as_json:
        print_json(report.to_data())
    else:
        _print_move(report)
