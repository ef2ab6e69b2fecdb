"""The code behind :mod:`saga_engine.cli`, whose docstring says what it is for."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

import orjson
import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from saga_engine.cli._flow import register as _register_flow
from saga_engine.cli._schedule import schedule_app
from saga_engine.cli._support import (
    archive_file_histories,
    dlq_row,
    header,
    load_saga_or_archived,
    read_dlq,
)
from saga_engine.kernel._errors import CliError, SagaError
from saga_engine.kernel._mainloop import run
from saga_engine.kernel._settings import Settings
from saga_engine.kernel._version import __version__

T = TypeVar("T")

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Operate saga-engine: migrate the schema, inspect and replay sagas.",
)
out = Console()
err = Console(stderr=True)


class _State:
    debug = False


JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
) -> None:
    """saga-engine: durable sagas over Postgres and Kafka."""
    _State.debug = debug


def _run(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Runs a coroutine; turns expected errors into one line and exit code 1."""
    try:
        return run(make())
    except (SagaError, OSError, ValueError, CliError) as exc:
        if _State.debug:
            raise
        err.print(f"[red]error:[/red] {exc}", markup=True, highlight=False, soft_wrap=True)
        raise typer.Exit(getattr(exc, "exit_code", 1)) from None
    except Exception as exc:
        if _State.debug:
            raise
        err.print(f"[red]error:[/red] {type(exc).__name__}: {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None


def _run_sync(fn: Callable[[], T]) -> T:
    async def wrapper() -> T:
        return fn()

    return _run(wrapper)


def _print_json(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_UTC_Z).decode())
    sys.stdout.write("\n")


@app.command()
def version(as_json: JsonOpt = False) -> None:
    """Print the installed version."""
    if as_json:
        _print_json({"version": __version__})
    else:
        out.print(__version__)


@app.command()
def worker(
    app_spec: Annotated[
        str,
        typer.Argument(metavar="APP", help="Module with the saga classes: pkg.mod or pkg.mod:attr"),
    ],
    log_level: Annotated[str, typer.Option("--log-level", help="Python log level.")] = "INFO",
) -> None:
    """Run an engine instance: consume the saga inbox and drive the sagas it owns."""
    import logging
    import os
    import signal as signals

    from saga_engine.core._replay import load_sagas, load_triggers
    from saga_engine.kernel._crash import crash_hook
    from saga_engine.runner._scheduler import load_schedules
    from saga_engine.worker._worker import SagaWorker

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    settings = Settings()
    # The environment is read here, at the edge: fault injection for crash tests, and
    # OTLP export when OTEL_EXPORTER_OTLP_ENDPOINT is set.
    hook = crash_hook(os.environ.get("SAGA_CRASH_AT"))
    from saga_engine.telemetry import configure_from_env

    configure_from_env(service_name=os.environ.get("OTEL_SERVICE_NAME", "saga-engine"))

    async def go() -> None:
        sagas = load_sagas(app_spec)
        triggers = load_triggers(app_spec)
        schedules = load_schedules(app_spec)
        engine = SagaWorker(
            settings, sagas, crash_hook=hook, triggers=triggers, schedules=schedules
        )
        loop = asyncio.get_running_loop()
        stopping = asyncio.Event()
        for sig in (signals.SIGTERM, signals.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
        # Start-up may wait for Kafka and Postgres (for ever by default): a stop signal
        # meanwhile ends the wait instead of being ignored until the grace period ends.
        starting = loop.create_task(engine.start())
        stop_waiter = loop.create_task(stopping.wait())
        await asyncio.wait({starting, stop_waiter}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            starting.cancel()
            await asyncio.wait({starting})
            await engine.stop()
            return
        stop_waiter.cancel()
        starting.result()  # a start that failed for good says why
        err.print(f"engine {engine.instance_id} running sagas: {', '.join(s.name for s in sagas)}")
        try:
            await stopping.wait()
        finally:
            await engine.stop()

    _run(go)


@app.command()
def migrate(
    sql: Annotated[
        bool, typer.Option("--sql", help="Print the SQL instead of applying it.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Apply the shipped schema migrations to SAGA_PG__DSN / SAGA_PG__DB_SCHEMA."""
    from saga_engine.store._migrations import migrate as apply
    from saga_engine.store._migrations import migration_sql, shipped_migrations

    if sql:
        sys.stdout.write(migration_sql())
        return
    settings = Settings()
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

    applied = _run(go)
    if as_json:
        _print_json({"schema": settings.pg.db_schema, "applied": applied})
    elif applied:
        out.print(f"applied migrations {applied} to schema {settings.pg.db_schema}")
    else:
        out.print(f"schema {settings.pg.db_schema} is up to date")


@app.command()
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
    from saga_engine.core._replay import HistoryExport, load_history, load_sagas
    from saga_engine.core._replay import replay as check

    classes = _run_sync(lambda: load_sagas(sagas))
    path = Path(target)
    if path.is_dir() or path.name.endswith(".jsonl.gz"):
        _replay_directory(path, classes, as_json)
        return
    if path.exists():
        history: HistoryExport = _run_sync(lambda: load_history(path))
    else:
        history = _run(lambda: load_saga_or_archived(target))  # live, or archived
    result = _run_sync(lambda: check(classes, history))
    if as_json:
        _print_json(_replay_json(result))
    elif result.deterministic:
        out.print(
            f"[green]deterministic[/green]: {result.events} events of saga {result.saga_id} "
            f"({result.saga_type}) replay cleanly; status {result.status.value}"
        )
    else:
        out.print(f"[red]nondeterministic[/red]: {result.error}", highlight=False)
    raise typer.Exit(0 if result.deterministic else 1)


def _replay_json(result: Any) -> dict[str, Any]:
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
    from saga_engine.core._replay import load_history
    from saga_engine.core._replay import replay as check

    if directory.is_dir():
        files = sorted(
            p for p in [*directory.glob("*.json"), *directory.glob("*.jsonl.gz")] if p.is_file()
        )
    else:
        files = [directory]  # one archive file
    if not files:
        _fail(f"no *.json history files or *.jsonl.gz archives in {directory}")
    rows: list[dict[str, Any]] = []
    with Progress(console=err, transient=True, disable=as_json) as progress:
        task = progress.add_task("replaying", total=len(files))
        for file in files:
            progress.update(task, description=f"replaying {file.name}")
            try:
                histories = (
                    archive_file_histories(file)
                    if file.name.endswith(".jsonl.gz")
                    else [load_history(file)]
                )
                rows += [{"file": file.name, **_replay_json(check(classes, h))} for h in histories]
            except (SagaError, OSError, ValueError, CliError) as exc:
                if _State.debug:
                    raise
                rows.append({"file": file.name, "deterministic": False, "error": str(exc)})
            progress.advance(task)
    diverged = [r for r in rows if not r["deterministic"]]
    if as_json:
        _print_json({"histories": rows, "diverged": len(diverged)})
    else:
        table = Table(title=f"replay of {directory}")
        for column in ("file", "saga", "events", "result"):
            table.add_column(column)
        for r in rows:
            verdict = (
                "[green]deterministic[/green]"
                if r["deterministic"]
                else f"[red]diverged[/red]: {r['error']}"
            )
            table.add_row(r["file"], r.get("saga_id", ""), str(r.get("events", "")), verdict)
        out.print(table)
        out.print(f"{len(rows) - len(diverged)} of {len(rows)} histories replay cleanly")
    raise typer.Exit(1 if diverged else 0)


def _fail(message: str) -> Any:
    """Reports ``message`` as the one-line error and exits 1."""
    if _State.debug:
        raise CliError(message)
    err.print(f"[red]error:[/red] {message}", markup=True, highlight=False)
    raise typer.Exit(1)


@app.command()
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
    from saga_engine.cli._support import archive_now, parse_duration

    try:
        period = parse_duration(older_than)
    except CliError as exc:
        raise typer.BadParameter(str(exc), param_hint="--older-than") from exc
    settings = Settings()
    report = _run(lambda: archive_now(settings, period, saga_type, dry_run))
    if as_json:
        _print_json(
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


# ---------------------------------------------------------------------- through the admin API
#
# Reads and operator actions go through an engine's admin API (``_cli_admin``): the CLI
# answers what the API answers, with the same checks, the same audit trail, and an exit
# code per kind of refusal (3 not found, 4 conflict, 5 invalid, 6 auth, 7 unreachable).

AdminUrl = Annotated[
    str | None,
    typer.Option(
        "--admin-url",
        envvar="SAGA_ADMIN_URL",
        show_default=False,
        help="An engine's admin API (token from SAGA_ADMIN_TOKEN). Default: where "
        "SAGA_ADMIN__HOST / SAGA_ADMIN__PORT make it listen (127.0.0.1:8080).",
    ),
]
ReasonOpt = Annotated[str, typer.Option("--reason", help="Why; recorded in the saga's history.")]


def _api(option: str | None) -> Any:
    from saga_engine.cli._admin import AdminApi, admin_url

    return AdminApi(admin_url(option), os.environ.get("SAGA_ADMIN_TOKEN"))


# ---------------------------------------------------------------------- dead letters

dlq_app = typer.Typer(
    no_args_is_help=True, help="Inspect and replay the dead-letter topic ({prefix}.dlq)."
)
app.add_typer(dlq_app, name="dlq")
# ``saga schedule ...``: durable schedules, through the admin API (``_cli_schedule``).
app.add_typer(schedule_app, name="schedule")


TimeoutOpt = Annotated[
    float, typer.Option("--timeout", min=0.1, help="Seconds to spend reading the topic.")
]


@dlq_app.command("list")
def dlq_list(
    limit: Annotated[int, typer.Option("--limit", min=1, help="Show the newest N.")] = 100,
    timeout: TimeoutOpt = 30.0,
    as_json: JsonOpt = False,
) -> None:
    """List dead-lettered records: offset, reason, detail, origin and saga id."""
    settings = Settings()
    records = _run(lambda: read_dlq(settings, timeout))[-limit:]
    rows = [dlq_row(r) for r in records]
    if as_json:
        _print_json(rows)
        return
    table = Table(title=f"{settings.kafka.topic_prefix}.dlq: {len(rows)} record(s)")
    for column in ("partition", "offset", "reason", "detail", "origin", "saga"):
        table.add_column(column)
    for r in rows:
        origin = f"{r['origin_topic']}[{r['origin_partition']}]@{r['origin_offset']}"
        table.add_row(
            str(r["partition"]), str(r["offset"]), r["reason"], r["detail"], origin, r["saga_id"]
        )
    out.print(table)


@dlq_app.command("replay")
def dlq_replay(
    offset: Annotated[int, typer.Argument(min=0, help="The record's offset in the DLQ topic.")],
    partition: Annotated[
        int | None,
        typer.Option("--partition", min=0, help="Its DLQ partition (needed if ambiguous)."),
    ] = None,
    to_saga: Annotated[
        str | None,
        typer.Option("--to-saga", help="Send it to the inbox, addressed to this saga instead."),
    ] = None,
    timeout: TimeoutOpt = 30.0,
    as_json: JsonOpt = False,
) -> None:
    """Re-publish a dead-lettered record (without its dlq_* headers) to its origin topic,
    or with --to-saga to the inbox with its key and ce_sagaid set to that saga."""
    from saga_engine.transport._kafka import make_producer
    from saga_engine.transport._topics import Topics

    settings = Settings()

    async def go() -> dict[str, Any]:
        records = [
            r
            for r in await read_dlq(settings, timeout)
            if r.offset == offset and (partition is None or r.partition == partition)
        ]
        if not records:
            where = f" in partition {partition}" if partition is not None else ""
            raise CliError(f"no dead-lettered record at offset {offset}{where}")
        if len(records) > 1:
            found = ", ".join(str(r.partition) for r in records)
            raise CliError(f"offset {offset} is in partitions {found}: choose with --partition")
        [record] = records
        headers = [(k, bytes(v)) for k, v in record.headers or () if not k.startswith("dlq_")]
        key = record.key
        if to_saga is not None:
            topic = Topics.of(settings.kafka).inbox
            key = to_saga.encode()
            headers = [(k, v) for k, v in headers if k != "ce_sagaid"]
            headers.append(("ce_sagaid", to_saga.encode()))
        else:
            topic = header(record, "dlq_topic")
            if not topic:
                raise CliError("the record has no dlq_topic header: replay it with --to-saga")
        producer = make_producer(settings.kafka)
        await producer.start()
        try:
            sent = await asyncio.wait_for(
                producer.send_and_wait(topic, record.value, key=key, headers=headers), timeout
            )
        finally:
            await producer.stop()
        return {
            "from": {"partition": record.partition, "offset": record.offset},
            "topic": topic,
            "partition": sent.partition,
            "offset": sent.offset,
            "saga_id": to_saga or header(record, "ce_sagaid"),
        }

    result = _run(go)
    if as_json:
        _print_json(result)
    else:
        out.print(
            f"replayed dlq[{result['from']['partition']}]@{result['from']['offset']} to "
            f"{result['topic']}[{result['partition']}]@{result['offset']}",
            highlight=False,
        )


# The operator commands (list, show, history, signal, cancel, retry, skip,
# force-compensate, resume), through the admin API: their module imports the helpers above.
from saga_engine.cli import _operator  # noqa: E402, F401

# ``saga rollout show|set`` (its module imports the helpers above).
from saga_engine.cli._rollout import rollout_app  # noqa: E402

app.add_typer(rollout_app, name="rollout")

# ``saga flow`` (flow control, through the admin API) lives in its own module.
_register_flow(app)


def main() -> None:
    app()
