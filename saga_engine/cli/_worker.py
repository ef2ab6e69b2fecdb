"""``saga worker APP``: an engine instance in this process, until SIGTERM or SIGINT.

The engine's modules are imported when the command runs, so that the other commands
start without loading them."""

from __future__ import annotations

import asyncio
import logging
import os
import signal as signals
from typing import Annotated

import typer

from saga_engine.cli._common import err, run_async
from saga_engine.kernel._crash import CrashHook, crash_hook
from saga_engine.kernel._settings import Settings

__all__ = ["commands"]

#: Added to the ``saga`` app without a name: ``saga worker``.
commands = typer.Typer()


@commands.command()
def worker(
    app_spec: Annotated[
        str,
        typer.Argument(metavar="APP", help="Module with the saga classes: pkg.mod or pkg.mod:attr"),
    ],
    log_level: Annotated[str, typer.Option("--log-level", help="Python log level.")] = "INFO",
) -> None:
    """Run an engine instance: consume the saga inbox and drive the sagas it owns."""
    from saga_engine.telemetry import configure_from_env

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    settings = Settings()
    # The environment is read here, at the edge: fault injection for crash tests, and
    # OTLP export when OTEL_EXPORTER_OTLP_ENDPOINT is set.
    hook = crash_hook(os.environ.get("SAGA_CRASH_AT"))
    configure_from_env(service_name=os.environ.get("OTEL_SERVICE_NAME", "saga-engine"))
    run_async(lambda: _serve(settings, app_spec, hook))


async def _serve(settings: Settings, app_spec: str, hook: CrashHook | None) -> None:
    """Starts the worker, then stops it on the first SIGTERM or SIGINT."""
    from saga_engine.core.planning._replay import load_event_sources, load_sagas, load_triggers
    from saga_engine.runner._scheduler import load_schedules
    from saga_engine.worker._worker import SagaWorker

    sagas = load_sagas(app_spec)
    triggers = load_triggers(app_spec)
    schedules = load_schedules(app_spec)
    engine = SagaWorker(
        settings,
        sagas,
        crash_hook=hook,
        triggers=triggers,
        schedules=schedules,
        event_sources=load_event_sources(app_spec),
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
