"""The admin API served by uvicorn in a thread of its own, for synchronous HTTP clients."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from saga_engine import Saga
from saga_engine.admin import DeadLetterReader, create_admin_app, serve_admin
from saga_engine.settings import Settings
from saga_engine.store import EventStore
from saga_engine.testing import SagaTestEnv
from tests.admin.sagas import Noop, Transfer

Seed = Callable[[SagaTestEnv], Awaitable[dict[str, str]]]
#: Opens the event store the engine under test uses (None: the in-memory one).
StoreFactory = Callable[[], Awaitable[EventStore]]


@dataclass
class Served:
    url: str = ""
    #: Whatever the seed function returned (e.g. ids of sagas in known states).
    seeded: dict[str, str] = field(default_factory=dict)
    #: The loop the engine and the server run on (to call into them thread-safely).
    loop: asyncio.AbstractEventLoop | None = None


@contextmanager
def served_in_thread(
    settings: Settings,
    seed: Seed,
    store: StoreFactory | None = None,
    sagas: Sequence[type[Saga[Any, Any]]] = (Transfer, Noop),
    dead_letters: DeadLetterReader | None = None,
    step_progress: Any = None,
) -> Iterator[Served]:
    """Runs engine, participants and server on one loop in a thread; stops them after.
    ``dead_letters``: the dead-letter topic the app serves (none by default);
    ``step_progress``: the board of participants' step reports it shows (an empty one)."""
    served = Served()
    ready = threading.Event()
    failure: list[BaseException] = []
    stop: list[asyncio.Event] = []
    loops: list[asyncio.AbstractEventLoop] = []

    async def main() -> None:
        opened = await store() if store is not None else None
        env = SagaTestEnv(list(sagas), settings=settings, store=opened)
        served.seeded = await seed(env)
        app = create_admin_app(
            env.engine,
            settings,
            parts=env.parts,
            schedules=env.schedules,
            batches=env.batches,
            dead_letters=dead_letters,
            step_progress=step_progress,
        )
        server = await serve_admin(app, settings)
        served.url = server.url
        stopped = asyncio.Event()
        stop.append(stopped)
        loops.append(asyncio.get_running_loop())
        served.loop = loops[0]
        ready.set()
        try:
            while not stopped.is_set():  # the participants answer whatever the API started
                await env.settle()
                await asyncio.sleep(0.01)
        finally:
            await server.stop()
            if opened is not None:
                await opened.close()

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:
            failure.append(exc)
            ready.set()

    thread = threading.Thread(target=run, name="admin-api-under-test", daemon=True)
    thread.start()
    ready.wait(timeout=30)
    if failure:
        raise failure[0]
    try:
        yield served
    finally:
        if loops:
            loops[0].call_soon_threadsafe(stop[0].set)
        thread.join(timeout=30)
        if failure:
            raise failure[0]
