"""The step reports an admin process holds: a bounded map, in memory, of participants'
progress on the steps they are handling (``tx.progress``; the record in
``transport._step_progress``).

Per saga, per command: the latest ``items_per_step`` reports of its latest run. A report
numbered 1, or of a later attempt, starts a new run (the handler ran again); one of an
older attempt, or whose ``seq`` is not above the last one kept, is stale and dropped. Bounds: at most ``max_sagas`` sagas and ``max_bytes`` of reports
(the least recently reported saga goes first), ``steps_per_saga`` commands per saga (the
oldest goes first), and a command not reported on for ``ttl_s`` seconds is gone. Readers drop what no longer runs:
``retain`` keeps only the commands a saga's history still has in flight. Nothing here
is durable: a process that starts again starts empty.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson

from saga_engine.kernel._serde import JsonDict
from saga_engine.kernel._settings import AdminSettings
from saga_engine.transport._step_progress import StepProgressRecord

__all__ = ["StepProgressBoard", "StepReport"]


@dataclass(frozen=True, slots=True)
class StepReport:
    """One report, as the API shows it."""

    command_id: str
    step: str
    attempt: int
    seq: int
    at: datetime
    body: Any
    #: About how many bytes it holds (its body as JSON, and the rest), for the budget.
    size: int = 0
    #: Its place among every report this board kept, from 1: a reader that saw up to n
    #: has every later one to see.
    serial: int = 0

    def as_json(self) -> JsonDict:
        return {
            "command_id": self.command_id,
            "step": self.step,
            "attempt": self.attempt,
            "seq": self.seq,
            "at": self.at.isoformat(),
            "body": self.body,
        }


@dataclass(slots=True)
class _Command:
    attempt: int
    touched: float
    reports: collections.deque[StepReport] = field(default_factory=collections.deque)
    #: The sum of its reports' sizes.
    size: int = 0


class StepProgressBoard:
    """The latest reports per running step, bounded in sagas, steps, items, bytes and
    age."""

    def __init__(
        self,
        *,
        items_per_step: int = 10,
        max_sagas: int = 10_000,
        steps_per_saga: int = 32,
        max_bytes: int = 64 * 1024 * 1024,
        ttl_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
        stats: collections.Counter[str] | None = None,
    ) -> None:
        if min(items_per_step, max_sagas, steps_per_saga, max_bytes) < 1 or ttl_s <= 0:
            msg = "a board's bounds are at least 1 (and its ttl_s above 0)"
            raise ValueError(msg)
        self.items_per_step = items_per_step
        self.max_sagas = max_sagas
        self.steps_per_saga = steps_per_saga
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self._clock = clock
        #: saga id -> command id -> its reports; both least recently reported first.
        self._sagas: collections.OrderedDict[str, collections.OrderedDict[str, _Command]] = (
            collections.OrderedDict()
        )
        #: The sizes of every report kept, summed.
        self.bytes = 0
        #: The serial of the last report kept.
        self.serial = 0
        #: saga id -> (the event its readers wait on, how many wait).
        self._waiters: dict[str, tuple[asyncio.Event, int]] = {}
        #: ``step_progress_stale`` and ``step_progress_evicted`` (the engine's counters,
        #: in a worker: they show on ``/metrics``).
        self.stats: collections.Counter[str] = stats if stats is not None else collections.Counter()

    @classmethod
    def of(
        cls, admin: AdminSettings, stats: collections.Counter[str] | None = None
    ) -> StepProgressBoard:
        """A board with ``admin``'s bounds, counting in ``stats``."""
        return cls(
            items_per_step=admin.step_progress_items,
            max_sagas=admin.step_progress_sagas,
            max_bytes=admin.step_progress_max_bytes,
            ttl_s=admin.step_progress_ttl_s,
            stats=stats,
        )

    def add(self, record: StepProgressRecord) -> bool:
        """Keeps ``record``; False (and counted) when it is stale."""
        now = self._clock()
        commands = self._sagas.get(record.saga_id)
        if commands is None:
            commands = self._sagas[record.saga_id] = collections.OrderedDict()
        self._sagas.move_to_end(record.saga_id)
        entry = commands.get(record.command_id)
        # seq 1 starts a run of the handler: a new one, or the same attempt run again (an
        # outage retried, a crash redelivered elsewhere: the numbers start again).
        if (
            entry is None
            or record.seq == 1
            or record.attempt > entry.attempt
            or self._expired(entry, now)
        ):
            if entry is not None:
                self.bytes -= entry.size
            entry = commands[record.command_id] = _Command(record.attempt, now)
        elif record.attempt < entry.attempt or (
            entry.reports and record.seq <= entry.reports[-1].seq
        ):
            self.stats["step_progress_stale"] += 1
            return False
        entry.touched = now
        commands.move_to_end(record.command_id)
        self.serial += 1
        report = _report(record, self.serial)
        entry.reports.append(report)
        entry.size += report.size
        self.bytes += report.size
        while len(entry.reports) > self.items_per_step:
            gone = entry.reports.popleft()
            entry.size -= gone.size
            self.bytes -= gone.size
        self._bound(record.saga_id, commands)
        self._wake(record.saga_id)
        return True

    def reports(self, saga_id: str, command_ids: Iterable[str] | None = None) -> list[StepReport]:
        """The reports kept for ``saga_id`` (of ``command_ids`` only, if given), in the
        order they came per command; expired ones are dropped first."""
        commands = self._sagas.get(saga_id)
        if commands is None:
            return []
        now = self._clock()
        self._remove(saga_id, [c for c, e in commands.items() if self._expired(e, now)])
        wanted = None if command_ids is None else set(command_ids)
        return [
            report
            for command_id, entry in commands.items()
            if wanted is None or command_id in wanted
            for report in entry.reports
        ]

    def retain(self, saga_id: str, running: Collection[str]) -> None:
        """Drops the saga's reports on commands not in ``running`` (their reply, or
        their timeout, is in the history now)."""
        commands = self._sagas.get(saga_id)
        if commands is not None:
            self._remove(saga_id, [c for c in commands if c not in running])

    def drop(self, saga_id: str, command_ids: Iterable[str]) -> None:
        """Drops the saga's reports on ``command_ids`` (those that ended)."""
        self._remove(saga_id, command_ids)

    def _remove(self, saga_id: str, command_ids: Iterable[str]) -> None:
        commands = self._sagas.get(saga_id)
        if commands is None:
            return
        for command_id in command_ids:
            entry = commands.pop(command_id, None)
            if entry is not None:
                self.bytes -= entry.size
        if not commands:
            del self._sagas[saga_id]

    def __len__(self) -> int:
        """How many sagas have reports kept."""
        return len(self._sagas)

    async def changed(self, saga_id: str, seconds: float) -> bool:
        """Waits until a report on ``saga_id`` is kept, for at most ``seconds``; True if
        one was."""
        event, count = self._waiters.get(saga_id, (asyncio.Event(), 0))
        self._waiters[saga_id] = (event, count + 1)
        try:
            await asyncio.wait_for(event.wait(), seconds)
        except TimeoutError:
            return False
        finally:
            current = self._waiters.get(saga_id)
            if current is not None and current[0] is event:
                if current[1] <= 1:
                    del self._waiters[saga_id]
                else:
                    self._waiters[saga_id] = (event, current[1] - 1)
        return True

    def _wake(self, saga_id: str) -> None:
        waiting = self._waiters.pop(saga_id, None)
        if waiting is not None:
            waiting[0].set()

    def _expired(self, entry: _Command, now: float) -> bool:
        return now - entry.touched > self.ttl_s

    def _bound(self, saga_id: str, commands: collections.OrderedDict[str, _Command]) -> None:
        while len(commands) > self.steps_per_saga:
            self._remove(saga_id, [next(iter(commands))])
            self.stats["step_progress_evicted"] += 1
        while self._sagas and (len(self._sagas) > self.max_sagas or self.bytes > self.max_bytes):
            _, gone = self._sagas.popitem(last=False)
            self.bytes -= sum(entry.size for entry in gone.values())
            self.stats["step_progress_evicted"] += 1


def _report(record: StepProgressRecord, serial: int) -> StepReport:
    # The body as JSON, and about what its ids, numbers and time take besides.
    size = len(orjson.dumps(record.body)) + 256
    return StepReport(
        record.command_id,
        record.step,
        record.attempt,
        record.seq,
        record.at,
        record.body,
        size,
        serial,
    )
