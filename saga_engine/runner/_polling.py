"""A background loop that does one round of work, then waits for a wake-up or its delay:
the shape of the scheduler's and the batch runner's loops, written once.

A round returns how long to wait before the next (0: at once). A ``TransientError`` is
retried with a back-off (Postgres or Kafka away); any other error is logged and the loop
looks again after ``poll_s``, so a bug never ends it. ``poll_now`` cuts the wait short.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from saga_engine.kernel._errors import TransientError
from saga_engine.kernel._retry import STARTUP
from saga_engine.telemetry._telemetry import detach_from_trace

__all__ = ["PollingLoop"]


class PollingLoop:
    def __init__(
        self,
        name: str,
        round: Callable[[], Awaitable[float]],
        *,
        poll_s: float,
        what: str,
        log: logging.Logger,
    ) -> None:
        self._name = name
        self._round = round
        self._poll_s = poll_s
        #: What a round does, for the log ("firing schedules").
        self._what = what
        self._log = log
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self._name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        detach_from_trace()
        backoff = STARTUP.backoff()
        while True:
            try:
                delay = await self._round()
                backoff.reset()
            except TransientError as exc:
                delay = backoff.next_delay()
                self._log.warning("%s failed (%s); retrying in %.1fs", self._what, exc, delay)
                await asyncio.sleep(delay)
                continue
            except Exception:  # a bug must not end the loop: log it, and look again later
                self._log.exception("unexpected error %s", self._what)
                await asyncio.sleep(self._poll_s)
                continue
            if delay > 0:
                await asyncio.sleep(delay)  # the next round is due then: nothing asks sooner
