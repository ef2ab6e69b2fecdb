"""Callers waiting for sagas to end or park (``Engine.wait``), woken by the engine."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from saga_engine.store._store import SagaRecord


class Waiters:
    def __init__(self) -> None:
        self._futures: dict[str, list[asyncio.Future[None]]] = {}

    def __len__(self) -> int:
        """Sagas someone waits for now (nothing per saga outlives its use)."""
        return len(self._futures)

    def notify(self, saga_id: str) -> None:
        """The saga ended or parked here: its waiters read the store again now."""
        for future in self._futures.pop(saga_id, []):
            if not future.done():
                future.set_result(None)

    async def wait(
        self,
        saga_id: str,
        read: Callable[[], Awaitable[SagaRecord]],
        *,
        timeout: float,  # noqa: ASYNC109
        poll_s: float,
    ) -> SagaRecord:
        """Waits until the saga ``read`` returns is terminal or parked; raises
        TimeoutError (the builtin) if it is still moving after ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            record = await read()
            if record.status.is_terminal or record.status.is_parked:
                return record
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"saga {saga_id} is still {record.status.value}")
            future: asyncio.Future[None] = loop.create_future()
            self._futures.setdefault(saga_id, []).append(future)
            try:
                # Woken early when this engine finishes the saga; otherwise poll the
                # store, because the saga may be driven by another instance.
                await asyncio.wait_for(future, min(remaining, poll_s))
            except TimeoutError:
                pass
            finally:
                futures = self._futures.get(saga_id, [])
                if future in futures:
                    futures.remove(future)
                if not futures:
                    self._futures.pop(saga_id, None)
