"""The commands that work on the event store itself, not through an engine: ``saga
migrate`` (the schema), ``saga replay`` (a history, from a file, an archive or the
store, against the current code) and ``saga archive`` (retention's archive, now)."""

from __future__ import annotations

import gzip
import re
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import Progress

from saga_engine.cli._common import (
    Debug,
    JsonOpt,
    err,
    fail,
    make_table,
    out,
    print_json,
    run_async,
    run_sync,
)
from saga_engine.core.history._codec import CodecChain, open_archive
from saga_engine.core.planning._replay import HistoryExport, ReplayResult, load_history, load_sagas
from saga_engine.core.planning._replay import replay as check
from saga_engine.kernel._errors import CliError, CodecError, SagaError, SagaNotFound
from saga_engine.kernel._settings import Settings
from saga_engine.runner._retention import Retention, RetentionReport

__all__ = ["archive_file_histories", "commands"]

#: Added to the ``saga`` app without a name: ``saga migrate``, ``saga replay``, ...
commands = typer.Typer()


@commands.command()
def migrate(
    sql: Annotated[
        bool, typer.Option("--sql", help="Print the SQL instead of applying it.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Apply the shipped schema migrations to SAGA_PG__DSN / SAGA_PG__DB_SCHEMA (with
    SAGA_PG__SHARDS: to the control database and every shard, reporting each)."""
    from saga_engine.store._migrations import migrate as apply
    from saga_engine.store._migrations import migration_sql, shipped_migrations

    if sql:
        sys.stdout.write(migration_sql())
        return
    settings = Settings()
    if settings.pg.shards:
        _migrate_shards(settings, as_json)
        return
    total = len(shipped_migrations())

    async def go() -> list[int]:
        with Progress(console=err, transient=True, disable=as_json) as progress:
            task = progress.add_task("migrating", total=total)

            def report(message: str) -> None:
                step = 1 if message.startswith("applying") else 0
                progress.update(task, advance=step, description=message)

            return await apply(
                settings.pg.dsn.get_secret_value(), settings.pg.db_schema, progress=report
            )

    applied = run_async(go)
    if as_json:
        print_json({"schema": settings.pg.db_schema, "applied": applied})
    elif applied:
        out.print(f"applied migrations {applied} to schema {settings.pg.db_schema}")
    else:
        out.print(f"schema {settings.pg.db_schema} is up to date")


def _migrate_shards(settings: Settings, as_json: bool) -> None:
    """``saga migrate`` past one database: every database at once, one row each; exit 1
    when one failed (the others are migrated all the same)."""
    from saga_engine.store._databases import migrate_all

    with err.status("migrating the control database and every shard", spinner="dots"):
        reports = run_async(lambda: migrate_all(settings))
    failed = [r for r in reports if not r.ok]
    if as_json:
        print_json({"schema": settings.pg.db_schema, "databases": [r.to_data() for r in reports]})
    else:

        def result(data: dict[str, Any]) -> str:
            if data["error"]:
                return f"[red]failed[/red]: {data['error']}"
            applied = data["applied"]
            if not applied:
                return "up to date"
            return f"applied {len(applied)}: {applied[0]:04d} to {applied[-1]:04d}"

        rows = [
            (d["name"], d["role"], str(d["before"] or "none"), str(d["after"] or ""), result(d))
            for d in (r.to_data() for r in reports)
        ]
        columns = ("database", "role", "version before", "version after", "result")
        out.print(make_table(f"migrations of schema {settings.pg.db_schema}", columns, rows))
    if failed:
        err.print(
            f"[red]error:[/red] {len(failed)} of {len(reports)} databases failed to migrate: "
            f"{', '.join(r.name for r in failed)}; the others are migrated. Fix them and run "
            "`saga migrate` again",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(1)


# ---------------------------------------------------------------------- replay


@commands.command()
def replay(
    target: Annotated[
        str,
        typer.Argument(
            help="A history file (JSON export), an archive file (*.jsonl.gz), a directory of "
            "them, or a saga id (live or archived)."
        ),
    ],
    sagas: Annotated[
        str,
        typer.Option("--sagas", "-s", help="Module with the saga classes: pkg.mod or pkg.mod:attr"),
    ],
    as_json: JsonOpt = False,
) -> None:
    """Replay a history against the current code; report deterministic or the first divergence.

    Given a directory, replays every *.json in it (with a progress bar) and exits 1 if
    any of them diverges or cannot be read."""
    classes = run_sync(lambda: load_sagas(sagas))
    path = Path(target)
    if path.is_dir() or path.name.endswith(".jsonl.gz"):
        _replay_directory(path, classes, as_json)
        return
    if path.exists():
        history: HistoryExport = run_sync(lambda: load_history(path))
    else:
        history = run_async(lambda: _load_saga_or_archived(target))  # live, or archived
    # The callback keys of this deployment: code that reads a callback's URL needs them.
    keys = Settings().callbacks
    result = run_sync(lambda: check(classes, history, callbacks=keys))
    if as_json:
        print_json(_replay_json(result))
    elif result.deterministic:
        out.print(
            f"[green]deterministic[/green]: {result.events} events of saga {result.saga_id} "
            f"({result.saga_type}) replay cleanly; status {result.status.value}"
        )
    else:
        out.print(f"[red]nondeterministic[/red]: {result.error}", highlight=False)
    raise typer.Exit(0 if result.deterministic else 1)


def _replay_json(result: ReplayResult) -> dict[str, Any]:
    return {
        "saga_id": result.saga_id,
        "saga_type": result.saga_type,
        "events": result.events,
        "deterministic": result.deterministic,
        "status": result.status.value,
        "error": str(result.error) if result.error else None,
    }


def _replay_directory(directory: Path, classes: Any, as_json: bool) -> None:
    """Every history of a directory (exports and archive files), or of one archive."""
    if directory.is_dir():
        files = sorted(
            p for p in [*directory.glob("*.json"), *directory.glob("*.jsonl.gz")] if p.is_file()
        )
    else:
        files = [directory]  # one archive file
    if not files:
        fail(f"no *.json history files or *.jsonl.gz archives in {directory}")
    rows: list[dict[str, Any]] = []
    with Progress(console=err, transient=True, disable=as_json) as progress:
        task = progress.add_task("replaying", total=len(files))
        for file in files:
            progress.update(task, description=f"replaying {file.name}")
            rows += _replay_file(file, classes)
            progress.advance(task)
    diverged = [r for r in rows if not r["deterministic"]]
    if as_json:
        print_json({"histories": rows, "diverged": len(diverged)})
    else:
        cells = [
            (
                r["file"],
                r.get("saga_id", ""),
                str(r.get("events", "")),
                "[green]deterministic[/green]"
                if r["deterministic"]
                else f"[red]diverged[/red]: {r['error']}",
            )
            for r in rows
        ]
        columns = ("file", "saga", "events", "result")
        out.print(make_table(f"replay of {directory}", columns, cells, "ellipsis"))
        out.print(f"{len(rows) - len(diverged)} of {len(rows)} histories replay cleanly")
    raise typer.Exit(1 if diverged else 0)


def _replay_file(file: Path, classes: Any) -> list[dict[str, Any]]:
    """One row per history of ``file``; a file that cannot be read is one diverged row."""
    try:
        histories = (
            archive_file_histories(file)
            if file.name.endswith(".jsonl.gz")
            else [load_history(file)]
        )
        keys = Settings().callbacks
        return [
            {"file": file.name, **_replay_json(check(classes, h, callbacks=keys))}
            for h in histories
        ]
    except (SagaError, OSError, ValueError, CliError) as exc:
        if Debug.on:
            raise
        return [{"file": file.name, "deterministic": False, "error": str(exc)}]


def archive_file_histories(path: Path) -> list[HistoryExport]:
    """The histories of an archive file (``sagas-*.jsonl.gz``), one per line."""
    try:
        blob = open_archive(CodecChain.from_settings(Settings().codec), path.read_bytes())
        lines = gzip.decompress(blob).splitlines()
    except (OSError, EOFError, CodecError) as exc:
        raise CliError(f"cannot read archive file {path}: {exc}") from exc
    return [load_history(line) for line in lines if line.strip()]


async def _load_saga_or_archived(saga_id: str) -> HistoryExport:
    """A saga's history from the live tables, or else from ``saga_archive``."""
    from saga_engine.store._connect import connect_event_store

    settings = Settings()
    codec = CodecChain.from_settings(settings.codec)
    store = await connect_event_store(settings, codec=codec)
    try:
        try:
            loaded = await store.load(saga_id)
        except SagaNotFound:
            archived = await store.archived_history(saga_id)
            if archived is None:
                raise
            return load_history(gzip.decompress(open_archive(codec, archived)))
    finally:
        await store.close()
    return HistoryExport(saga_id, loaded.record.saga_type, [s.event for s in loaded.events])


# ---------------------------------------------------------------------- archive


@commands.command()
def archive(
    older_than: Annotated[
        str,
        typer.Option(
            "--older-than",
            help="Finished sagas whose last change is older than this: 30d, 12h, 90m, 2w.",
        ),
    ],
    saga_type: Annotated[
        list[str] | None, typer.Option("--type", help="Only this saga type (repeatable).")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Count what would go, change nothing.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Archive and delete finished sagas now, as retention does in the background
    (SAGA_RETENTION__ARCHIVE: table, directory or none). `saga replay ID` still replays
    an archived saga; `saga replay FILE.jsonl.gz` replays an archive file."""
    try:
        period = _parse_duration(older_than)
    except CliError as exc:
        raise typer.BadParameter(str(exc), param_hint="--older-than") from exc
    settings = Settings()
    report = run_async(lambda: _archive_now(settings, period, saga_type, dry_run))
    if as_json:
        print_json(
            {
                "dry_run": dry_run,
                "found": report.found,
                "deleted": report.deleted,
                "archive": settings.retention.archive,
                "files": report.files,
            }
        )
    elif dry_run:
        out.print(f"{report.found} finished sagas are older than {older_than} (dry run)")
    else:
        where = {"table": "saga_archive", "directory": ", ".join(report.files) or "no file"}
        target = where.get(settings.retention.archive, "nowhere (archive=none)")
        out.print(f"archived {report.deleted} finished sagas to {target} and deleted them")


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def _parse_duration(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``3600s``, ``2w``."""
    match = _DURATION.match(text)
    if match is None:
        raise CliError(f"not a duration: {text!r} (write e.g. 30d, 12h, 90m, 3600s)")
    try:
        period = timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2)])
        datetime.now(UTC) - period  # the cutoff: an instant Postgres and Python hold
    except OverflowError:
        raise CliError(f"{text!r} reaches before year 1: write a shorter duration") from None
    return period


async def _archive_now(
    settings: Settings, older_than: timedelta, saga_types: list[str] | None, dry_run: bool
) -> RetentionReport:
    """One retention pass over every partition, with ``older_than`` as the period of
    every type, archiving as ``SAGA_RETENTION__ARCHIVE`` says."""
    from saga_engine.store._connect import connect_event_store

    codec = CodecChain.from_settings(settings.codec)
    store = await connect_event_store(settings, codec=codec)
    try:
        return await Retention(settings.retention, store, codec).run(
            datetime.now(UTC), older_than=older_than, saga_types=saga_types, dry_run=dry_run
        )
    finally:
        await store.close()
