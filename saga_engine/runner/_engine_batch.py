"""The engine's batch path: the starts and replies of one inbox batch as one unit.

``Engine.deliver`` takes one input: a lock, a decision, an append awaited on its own, its
commands sent and awaited one by one. Under load the inbox hands the engine hundreds of
inputs at a time, and doing that per input costs a task, an append wait and a send wait
each. Here a batch is:

1. **decided**: every saga's lock is taken, and each of its inputs is given to its
   runtime in record order (no I/O);
2. **appended** together: one create or append per saga, all submitted at once, so the
   store's group commit writes them in one transaction;
3. **sent** together: every resulting command is handed to the producer, then the
   acknowledgements are awaited at once (few produce requests, one wait);
4. then the bookkeeping of each saga (counters, waiters, timers, the end of a saga).

Only the common case takes this path: a start, or a reply to a saga held in memory.
Anything else, and any saga whose input or write fails here, is handed back to the
caller, which applies it with ``deliver``/``start`` one input at a time: those handle
stale copies, conflicts, rebuilds and errors, and every input is idempotent there (a
reply by its command id, a start by its saga id). A saga handed back after its events
may have become durable is reloaded first (``reload`` sends what it has in flight).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from saga_engine.core._decision import Decision, DropReason, OutboundCommand, Reply
from saga_engine.core._events import Event
from saga_engine.core._runtime import SagaRuntime
from saga_engine.core._start import PreparedStart, check_same_start, start_input
from saga_engine.kernel._errors import ConcurrencyError
from saga_engine.runner._cache import LiveSaga
from saga_engine.store._store import Append, NewSaga
from saga_engine.transport._bus import PipelinedSender

if TYPE_CHECKING:
    from saga_engine.runner._engine import Engine

log = logging.getLogger("saga_engine.engine")


@dataclass(slots=True)
class BatchInput:
    """One start or reply of the batch. ``key`` is the caller's (its record)."""

    saga_id: str
    key: Any
    reply: Reply | None = None
    start: PreparedStart | None = None


@dataclass(slots=True)
class BatchResult:
    """What the caller still has to do: ``redo`` inputs one at a time, after reloading
    the sagas in ``reload`` (their events may be durable, their commands not sent)."""

    redo: list[BatchInput] = field(default_factory=list)
    reload: set[str] = field(default_factory=set)


@dataclass(slots=True)
class _Work:
    saga_id: str
    inputs: list[BatchInput] = field(default_factory=list)
    live: LiveSaga | None = None
    #: Created by this batch (a start): written with ``create``.
    new: bool = False
    #: The in-memory copy changed: evict it if the batch gives up on this saga.
    mutated: bool = False
    events: list[Event] = field(default_factory=list)
    commands: list[OutboundCommand] = field(default_factory=list)
    last: Decision | None = None
    failed: bool = False
    #: Each event with the number of replies held once its decision was taken.
    counted: list[tuple[Event, int]] = field(default_factory=list)


class BatchApplier:
    def __init__(self, engine: Engine) -> None:
        self._e = engine

    async def apply(self, inputs: Sequence[BatchInput]) -> BatchResult:
        engine = self._e
        works: dict[str, _Work] = {}
        for item in inputs:
            work = works.get(item.saga_id)
            if work is None:
                work = works[item.saga_id] = _Work(item.saga_id)
            work.inputs.append(item)
        result = BatchResult()
        held: list[str] = []
        try:
            for saga_id in works:
                # One saga's inputs are serialised with everything else done to it (a
                # timer, an operator's action); other holders take one lock at a time,
                # so taking many here cannot deadlock.
                await engine.live.locks.acquire(saga_id)
                held.append(saga_id)
            for work in works.values():
                self._decide(work, result)
            written = [w for w in works.values() if not w.failed and w.events]
            await self._write(written, result)
            await self._send([w for w in written if not w.failed], result)
            for work in works.values():
                if not work.failed and work.live is not None:
                    self._settle(work)
            for work in works.values():
                if not work.failed and engine._ownership is not None:
                    await engine._let_go_unless_owned(work.saga_id, bool(work.events))
        except Exception:
            # A bug on this path must not stop the inbox: every saga of the batch is
            # rebuilt from the store, re-sending what it has in flight, and its inputs
            # are applied again one at a time (idempotent), where errors are handled.
            log.exception("the batch path failed; applying its inputs one at a time")
            for work in works.values():
                self._forget(work)
            return BatchResult(redo=list(inputs), reload=set(works))
        except BaseException:
            # Cancelled mid-batch: what is in memory may be ahead of the store.
            for work in works.values():
                self._forget(work)
            raise
        finally:
            for saga_id in held:
                engine.live.locks.release(saga_id)
        return result

    def _forget(self, work: _Work) -> None:
        engine = self._e
        if work.new and work.live is not None and engine.live.get(work.saga_id) is not work.live:
            work.live.runtime.close()  # never registered: nothing else refers to it
        elif work.saga_id in engine.live:
            engine.live.evict(work.saga_id)

    # ------------------------------------------------------------------ 1. decide

    def _decide(self, work: _Work, result: BatchResult) -> None:
        engine = self._e
        work.live = engine.live.get(work.saga_id)
        try:
            for item in work.inputs:
                if item.start is not None:
                    if not self._start(work, item.start):
                        return self._give_up(work, result)
                    continue
                assert item.reply is not None
                if work.live is None:
                    return self._give_up(work, result)  # not in memory: deliver loads it
                decision = work.live.runtime.handle(item.reply)
                if decision.dropped is DropReason.UNKNOWN_COMMAND:
                    # Maybe a stale copy, maybe a stray reply: deliver tells them apart.
                    return self._give_up(work, result)
                if decision.dropped is not None:
                    engine.stats.inc(f"dropped_{decision.dropped.value}")
                    continue
                self._take(work, decision)
        except Exception:
            # The single path raises it again, and says what it means.
            self._give_up(work, result)
        return None

    def _start(self, work: _Work, start: PreparedStart) -> bool:
        engine = self._e
        if work.live is not None:
            check_same_start(
                start.definition,
                work.live.runtime.started,
                start.payload,
                start.saga_id,
                start.idempotency_key,
                engine.registry,
            )
            engine.stats.inc("start_deduplicated")
            return True
        runtime, decision = SagaRuntime.start(start.definition, start_input(start))
        work.live = LiveSaga(runtime, committed_seq=0, started_at=start.now)
        work.new = True
        self._take(work, decision)
        return True

    @staticmethod
    def _take(work: _Work, decision: Decision) -> None:
        work.mutated = True
        assert work.live is not None
        # As deliver would count them, one decision at a time (a park is counted once).
        held = len(work.live.runtime.held_steps())
        work.counted.extend((event, held) for event in decision.events)
        work.events.extend(decision.events)
        work.commands.extend(decision.commands)
        work.last = decision

    def _give_up(self, work: _Work, result: BatchResult, *, reload: bool = False) -> None:
        """Hands the saga's inputs back for the single path."""
        work.failed = True
        if work.mutated:
            self._forget(work)  # the copy in memory is ahead of the store
        result.redo.extend(work.inputs)
        if reload:
            result.reload.add(work.saga_id)

    # ------------------------------------------------------------------ 2. append

    async def _write(self, works: list[_Work], result: BatchResult) -> None:
        engine = self._e
        store = engine.store
        writes: list[Awaitable[Any]] = []
        for work in works:
            live, last = work.live, work.last
            assert live is not None
            assert last is not None
            if work.new:
                writes.append(
                    store.create(
                        NewSaga(
                            saga_id=work.saga_id,
                            saga_type=live.runtime.saga_type,
                            events=work.events,
                            projection=last.projection,
                            idempotency_key=live.runtime.started.idempotency_key,
                            search=live.runtime.state.definition.search_values(
                                live.runtime.started.input
                            ),
                            saga_version=live.runtime.state.definition.version,
                        )
                    )
                )
            else:
                writes.append(
                    store.append(
                        Append(work.saga_id, live.committed_seq, work.events, last.projection)
                    )
                )
        # Submitted together: the group commit writes them in one transaction.
        outcomes = await asyncio.gather(*writes, return_exceptions=True)
        for work, outcome in zip(works, outcomes, strict=True):
            live = work.live
            assert live is not None
            if isinstance(outcome, ConcurrencyError):
                # Someone else wrote to this saga: as in Engine._commit, the copy goes and
                # nothing is sent; deliver sorts out who owns it.
                engine.stats.inc("stale_owner")
                engine.live.evict(work.saga_id, keep_spans=True)
                work.mutated = False
                self._give_up(work, result)
            elif isinstance(outcome, BaseException):
                if not isinstance(outcome, Exception):
                    raise outcome
                # Whether it landed is unknown: reload, then apply again (idempotent).
                self._give_up(work, result, reload=True)
            elif work.new:
                if outcome is False:
                    # The id exists already (not in memory here): start decides whether
                    # it is the same request.
                    self._give_up(work, result)
                    continue
                live.committed_seq = len(work.events)
                engine.live.put(work.saga_id, live)
                engine.observer.stat("sagas_started", live.runtime.saga_type)
            else:
                live.committed_seq = int(outcome)

    # ------------------------------------------------------------------ 3. send

    async def _send(self, works: list[_Work], result: BatchResult) -> None:
        from saga_engine.transport._kafka import delivered

        engine = self._e
        spans = engine.observer.spans
        for work in works:
            engine.observer.checkpoint("after_append")
            # Live inputs only: what a rebuild replays never passes here (no span twice).
            spans.applied(work.saga_id, work.events)
            if work.commands:
                # Crash points: the events are durable, the commands not yet sent.
                engine.observer.checkpoint("before_send")
                if any(c.compensation for c in work.commands):
                    engine.observer.checkpoint("before_send_compensation")
        if sum(1 for w in works if w.commands) > 1:
            engine.observer.checkpoint("after_batch_append")
        pending: list[tuple[_Work, OutboundCommand, Awaitable[None]]] = []
        sender = engine.sender
        pipelined = isinstance(sender, PipelinedSender)
        for work in works:
            for command in work.commands:
                sent = spans.sent(command)
                try:
                    if pipelined:
                        starting = sender.start_command(sent)  # type: ignore[attr-defined]
                        pending.append((work, command, await starting))
                    else:
                        await sender.send_command(sent)
                        engine.observer.checkpoint("after_send")
                except Exception as exc:
                    self._not_sent(work, command, exc, result)
        errors = await delivered([d for _, _, d in pending])
        for (work, command, _), error in zip(pending, errors, strict=True):
            if error is not None:
                self._not_sent(work, command, error, result)
            else:
                engine.observer.checkpoint("after_send")

    def _not_sent(
        self, work: _Work, command: OutboundCommand, exc: BaseException, result: BatchResult
    ) -> None:
        # The command is recorded; reloading the saga sends it again.
        self._e.observer.spans.not_sent(command.command_id, exc)
        if not work.failed:
            self._e.live.evict(work.saga_id)
            work.failed = True
            work.mutated = False
            result.reload.add(work.saga_id)
            # Its inputs are durable: applied again they are duplicates, dropped.
            result.redo.extend(work.inputs)

    # ------------------------------------------------------------------ 4. settle

    def _settle(self, work: _Work) -> None:
        engine = self._e
        live, last = work.live, work.last
        assert live is not None
        if last is None:
            return  # only duplicates: nothing changed
        for event, held in work.counted:
            engine.observer.counted(event, live, held=held)
        if engine.flow is not None:
            engine.flow.settle(work.saga_id, live.runtime)  # permits of attempts now over
        status = last.status
        if status.is_terminal or status.is_parked:
            engine._notify(work.saga_id)
        if status.is_terminal:
            engine.observer.ended(work.saga_id, live, status, last.projection.error)
            engine.live.evict(work.saga_id)
        else:
            engine.live.arm(work.saga_id, live)
