"""The main of a test application's participant process: built from the environment's
settings, started, and stopped on SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable

from saga_engine import Settings
from saga_engine.participant import Participant


async def serve_participant(build: Callable[[Settings], Participant]) -> None:
    participant = build(Settings())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await participant.start()
    print(f"participant {participant.name} running", file=sys.stderr, flush=True)
    try:
        await stop.wait()
    finally:
        await participant.stop()
