"""The ``saga`` command line (typer + rich).

Every command takes ``--json`` for machine-readable output. Errors are one line on
stderr and a non-zero exit; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

import orjson
import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

import saga_engine
from saga_engine._errors import SagaError
from saga_engine.settings import Settings

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
        return asyncio.run(make())
    except (SagaError, OSError, ValueError) as exc:
        if _State.debug:
            raise
        err.print(f"[red]error:[/red] {exc}", markup=True, highlight=False)
        raise typer.Exit(1) from None
    except Exception as exc:
        if _State.debug:
            raise
        err.print(f"[red]error:[/red] {type(exc).__name__}: {exc}", highlight=False)
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
        _print_json({"version": saga_engine.__version__})
    else:
        out.print(saga_engine.__version__)


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

    from saga_engine._crash import crash_hook
    from saga_engine._worker import SagaWorker
    from saga_engine.replay import load_sagas, load_triggers

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    settings = Settings()
    # The environment is read here, at the edge: fault injection for crash tests.
    hook = crash_hook(os.environ.get("SAGA_CRASH_AT"))

    async def go() -> None:
        sagas = load_sagas(app_spec)
        triggers = load_triggers(app_spec)
        engine = SagaWorker(settings, sagas, crash_hook=hook, triggers=triggers)
        loop = asyncio.get_running_loop()
        stopping = asyncio.Event()
        for sig in (signals.SIGTERM, signals.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
        await engine.start()
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
    from saga_engine._migrations import migrate as apply
    from saga_engine._migrations import migration_sql, shipped_migrations

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
    target: Annotated[str, typer.Argument(help="A history file (JSON export) or a saga id.")],
    sagas: Annotated[
        str,
        typer.Option("--sagas", "-s", help="Module with the saga classes: pkg.mod or pkg.mod:attr"),
    ],
    as_json: JsonOpt = False,
) -> None:
    """Replay a history against the current code; report deterministic or the first divergence."""
    from saga_engine.replay import HistoryExport, load_history, load_sagas
    from saga_engine.replay import replay as check

    classes = _run_sync(lambda: load_sagas(sagas))
    path = Path(target)
    if path.exists():
        history: HistoryExport = _run_sync(lambda: load_history(path))
    else:
        history = _run(lambda: _load_from_db(target))
    result = _run_sync(lambda: check(classes, history))
    if as_json:
        _print_json(
            {
                "saga_id": result.saga_id,
                "saga_type": result.saga_type,
                "events": result.events,
                "deterministic": result.deterministic,
                "status": result.status.value,
                "error": str(result.error) if result.error else None,
            }
        )
    elif result.deterministic:
        out.print(
            f"[green]deterministic[/green]: {result.events} events of saga {result.saga_id} "
            f"({result.saga_type}) replay cleanly; status {result.status.value}"
        )
    else:
        out.print(f"[red]nondeterministic[/red]: {result.error}", highlight=False)
    raise typer.Exit(0 if result.deterministic else 1)


async def _load_from_db(saga_id: str) -> Any:
    from saga_engine._pgstore import PostgresEventStore
    from saga_engine.replay import HistoryExport

    settings = Settings()
    store = await PostgresEventStore.connect(settings.pg)
    try:
        loaded = await store.load(saga_id)
    finally:
        await store.close()
    return HistoryExport(saga_id, loaded.record.saga_type, [s.event for s in loaded.events])


@app.command()
def history(
    saga_id: Annotated[str, typer.Argument(help="The saga's id.")],
    as_json: JsonOpt = False,
) -> None:
    """Print a saga's history (with --json: the export that `saga replay` reads)."""
    from saga_engine.replay import export_history

    loaded = _run(lambda: _load_from_db(saga_id))
    if as_json:
        _print_json(export_history(loaded.saga_id, loaded.saga_type, loaded.events))
        return
    table = Table(title=f"{loaded.saga_type} {loaded.saga_id}")
    for column in ("#", "at", "event", "detail"):
        table.add_column(column)
    for seq, event in enumerate(loaded.events, start=1):
        table.add_row(str(seq), event.at.isoformat(), event.kind, event.describe())
    out.print(table)


def main() -> None:
    app()
