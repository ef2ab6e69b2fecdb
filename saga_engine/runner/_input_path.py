"""The engine's one path: every input reaches its saga the same way, as a batch.

A start, a reply, a signal, a timer, a cancel, an operator's action, a child's start or
undo, a load (recovery, a wake-up, a reload): each is an :data:`Input`, and a single one
is a batch of one. A batch goes through:

1. **lock**: every saga's lock, in the batch's order (the other holders take one lock at
   a time, so this cannot deadlock);
2. **decide**: each saga's inputs in order, given to its copy in memory; a saga not held
   is loaded from history first (what its replay records is written with the rest, and
   what it owes is sent again). No I/O but those loads;
3. **write**: one create or append per saga, submitted together, so the store's group
   commit writes them in one transaction;
4. **send** (``_effects``): every command handed to the sender, the acknowledgements
   awaited together;
5. **settle** (``_effects``): per saga, the observer told what happened, flow control's
   permits of finished attempts given back, waiters woken, the saga armed for its next
   wake-up or let go once ended;
6. **let go**: with sagas shared between engines, one this engine does not own is let
   go (and its owner told to reload it, if it changed).

A write that conflicts with another engine's (an operator acted on the saga there) is
decided again on the saga rebuilt from history, when this engine owns it, a few times
with back-off. A write that fails lets the saga go; its inputs answer with the error, and
the caller applies them again (an input applied twice is deduplicated). A send that fails
after the write does not fail the inputs (they are recorded): the saga alone is rebuilt
soon and sends what it owes again (``reload_soon``), so no other saga of the batch, or of
the inbox, waits for it. A command the broker refuses for good is answered as refused.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from datetime import timedelta
from typing import Any

from saga_engine.core.history._decision import (
    DropReason,
    OutboundCommand,
    Reply,
    Resume,
    TimerDue,
)
from saga_engine.core.history._status import SagaStatus
from saga_engine.core.runtime._runtime import SagaRuntime
from saga_engine.core.runtime._start import (
    PreparedStart,
    check_same_start,
    start_input,
    start_search,
)
from saga_engine.kernel._errors import ConcurrencyError, SagaError, TransientError
from saga_engine.kernel._retry import CONFLICT
from saga_engine.runner._cache import LiveSaga
from saga_engine.runner._concurrency_keys import KeyGate
from saga_engine.runner._effects import Effects
from saga_engine.runner._parts import EngineParts
from saga_engine.runner._path_inputs import (
    Deliver,
    FireTimers,
    Input,
    InputOutcome,
    Load,
    LoadMode,
    Start,
    Work,
)
from saga_engine.store._store import Append, NewSaga

log = logging.getLogger("saga_engine.engine")

#: Passes at an input whose write keeps conflicting with another writer (rebuilt from
#: history between them); the third and later ones wait the ``CONFLICT`` back-off.
_CONFLICT_ATTEMPTS = 5


class InputPath:
    def __init__(self, parts: EngineParts) -> None:
        self._store = parts.store
        self._registry = parts.registry
        self._clock = parts.clock
        self._live = parts.live
        self._owners = parts.owners
        self._stats = parts.stats
        self._limit = parts.command_limit
        self._callbacks = parts.settings.callbacks
        self._effects = Effects(parts, self.reload_soon)
        if parts.matcher is not None:
            parts.matcher.bind(self.apply)
        #: Per-key concurrency: what a limited saga owes for its key, after each batch.
        self.keys = KeyGate(parts, self.apply)
        #: Sagas with a reload pending (``reload_soon``), and the delay of the reload in
        #: progress of each (the next one, asked for by it, waits twice as long).
        self._reloading: set[str] = set()
        self._reload_delays: dict[str, float] = {}
        self._closed = False

    def close(self) -> None:
        self._closed = True
        self.keys.close()

    async def apply(self, inputs: Sequence[Input]) -> list[InputOutcome]:
        """Applies ``inputs`` as one batch; each one's outcome, in their order."""
        # Outcomes made in the loop that groups the inputs by saga: a list comprehension
        # and a zip beside it were 19.7 k instructions per saga (engine_path).
        outcomes: list[InputOutcome] = []
        works: dict[str, Work] = {}
        for item in inputs:
            outcome = InputOutcome()
            outcomes.append(outcome)
            work = works.get(item.saga_id)
            if work is None:
                work = works[item.saga_id] = Work(item.saga_id)
            work.items.append((item, outcome))
        held: list[str] = []
        try:
            for saga_id in works:
                await self._live.locks.acquire(saga_id)
                held.append(saga_id)
            await self._passes(list(works.values()))
            if self._owners.shared or any(w.release_ended for w in works.values()):
                for work in works.values():
                    await self._let_go(work)
        except Exception as exc:
            # A bug on this path must not stop the inbox: every saga of the batch is let
            # go (rebuilt from the store by its next input) and its inputs answer with it.
            log.exception("applying a batch of %d inputs failed", len(inputs))
            for work in works.values():
                self._effects.fail(work, exc)
        except BaseException:
            # Cancelled mid-batch: what is in memory may be ahead of the store.
            for work in works.values():
                self._effects.forget(work)
            raise
        finally:
            for saga_id in held:
                self._live.locks.release(saga_id)
        # Outside the locks: asking for a key applies the answer through this path. Only
        # sagas whose pass went through: a copy whose write failed may be ahead of the
        # store (an end not recorded must not release the key).
        if self.keys.limited:
            await self.keys.after([w for w in works.values() if w.settles])
        refused = self._effects.take_refused()
        if refused:
            await self._answer_refused(refused)
        return outcomes

    async def _answer_refused(self, refused: list[tuple[OutboundCommand, Exception]]) -> None:
        """Commands the broker refused for good (too large for it) are answered as their
        participant answers a command it refuses: nothing was applied, the step fails
        (a compensation that cannot be sent leaves the saga for an operator)."""
        now = self._clock.now()
        for command, error in refused:
            log.error("command %s of saga %s: %s", command.command_id, command.saga_id, error)
        await self.apply(
            [
                Deliver(c.saga_id, Reply(c.command_id, "failure", now, {}, str(e), None))
                for c, e in refused
            ]
        )

    async def _passes(self, works: list[Work]) -> None:
        """Decide, write, send and settle, until no saga of the batch is to go again."""
        backoff = None  # made on the first conflict that waits: most batches have none
        pending = works
        while pending:
            # Those with events to write, collected as each is decided (a comprehension
            # after the loop was 6.3 k instructions per saga, engine_path).
            writing = []
            for work in pending:
                await self._decide(work)
                if work.events and work.failure is None:
                    writing.append(work)
            if writing:
                await self._write(writing)
            await self._effects.apply([w for w in pending if w.settles])
            again = []
            for work in pending:
                if work.conflict is None:
                    if work.again:
                        again.append(work)
                    continue
                work.conflicts += 1
                if work.conflicts == _CONFLICT_ATTEMPTS or not self._owners.shares_and_owns(
                    work.saga_id
                ):
                    # A stale owner, or another writer that keeps winning: let go.
                    self._effects.fail(work, work.conflict)
                    continue
                # Another engine wrote to this saga (an operator's action there): the copy
                # here was stale. Its inputs are decided again on the saga rebuilt from
                # history, its lock still held, so they keep their order; from the third
                # pass on, after a jittered back-off.
                self._stats.inc("reloaded_after_conflict")
                work.rebuild = True
                again.append(work)
            if again and any(w.rebuild and w.conflicts > 1 for w in again):
                if backoff is None:
                    backoff = CONFLICT.backoff()
                await backoff.sleep()
            pending = again

    # ------------------------------------------------------------------ 1. decide

    async def _decide(self, work: Work) -> None:
        rebuild = work.begin(self._live.get(work.saga_id))
        for _ in range(2):
            if rebuild:
                try:
                    await self._load(work, rebuild=True)
                except Exception as exc:  # nothing of the saga can apply
                    self._effects.fail(work, exc)
                    return
            for index in range(work.first, len(work.items)):
                if await self._decide_one(work, index):
                    break
            else:
                return
            # The copy held here may be stale (another engine changed the saga and
            # issued that command): the history says, rebuilt, what the inputs mean.
            self._stats.inc("reloaded_stale_copy")
            work.restart()
            rebuild = True

    async def _decide_one(self, work: Work, index: int) -> bool:
        """Decides one input; True when it shows the copy held may be stale."""
        item, outcome = work.items[index]
        try:
            if isinstance(item, Deliver):
                return await self._deliver(work, item, outcome)
            if isinstance(item, Start):
                await self._start(work, index, item, outcome)
            elif isinstance(item, FireTimers):
                self._timers(work, outcome)
            else:
                await self._load_input(work, item, outcome)
        except Exception as exc:  # this input's answer; the saga's other inputs go on
            outcome.error = exc
        return False

    async def _deliver(self, work: Work, item: Deliver, outcome: InputOutcome) -> bool:
        if type(item.inbound) is Resume:  # (isinstance of a struct's class is a slow path)
            await self._resume(work, item.inbound, outcome)
            return False
        if work.live is None:
            await self._load(work)
        assert work.live is not None
        decision = work.live.runtime.handle(item.inbound)
        if (
            decision.dropped is DropReason.UNKNOWN_COMMAND
            and not work.fresh_copy
            and work.created is None  # started by this batch: nothing to be stale
            and self._owners.shares_and_owns(work.saga_id)
        ):
            return True  # a reply to a command the copy held never issued
        outcome.decision = decision
        work.take(decision)
        return False

    async def _resume(self, work: Work, inbound: Resume, outcome: InputOutcome) -> None:
        """A parked saga goes on: a nondeterministic one is rebuilt with the code deployed
        now first, and one that was parked sends what it owes once resumed."""
        if work.live is None or work.live.runtime.status == SagaStatus.NONDETERMINISTIC:
            self._live.evict(work.saga_id)
            work.live = None
            await self._load(work)
        assert work.live is not None
        was_parked = work.live.runtime.dead
        outcome.decision = decision = work.live.runtime.handle(inbound)
        work.take(decision)
        if was_parked and self._owners.owns(work.saga_id):
            work.resend_owed(work.live)

    async def _start(self, work: Work, index: int, item: Start, outcome: InputOutcome) -> None:
        start = item.start if isinstance(item.start, PreparedStart) else await item.start()
        if start is None:
            return  # nothing to start (a child's start its parent withdrew, say)
        if work.live is not None:
            check_same_start(
                start.definition,
                work.live.runtime.started,
                start.payload,
                start.saga_id,
                start.idempotency_key,
                self._registry,
            )
            work.deduplicated += 1
            return
        runtime, decision = SagaRuntime.start(
            start.definition, start_input(start), limit=self._limit, callbacks=self._callbacks
        )
        work.live = LiveSaga(runtime, committed_seq=0, started_at=start.now)
        work.created = (index, start)
        outcome.decision = decision
        work.take(decision)

    def _timers(self, work: Work, outcome: InputOutcome) -> None:
        """The saga's due timers, in order, from the copy held (none: it was evicted or
        moved on, and recovery or the wake-up poll arms it again)."""
        live = work.live
        if live is None:
            return
        if not self._owners.owns(work.saga_id):
            self._live.evict(work.saga_id)  # its partition moved: its owner fires them
            work.live = None
            return
        work.rearm = True
        now = self._clock.now()
        timers = self._live.timers(work.saga_id, live)  # flow control may hold a timeout
        for _, timer_id in sorted((at, tid) for tid, at in timers.items() if at <= now):
            if live.runtime.status.is_terminal or live.runtime.dead:
                break
            outcome.decision = decision = live.runtime.handle(TimerDue(timer_id, now))
            if decision.dropped is None:
                work.take(decision)

    async def _load_input(self, work: Work, item: Load, outcome: InputOutcome) -> None:
        if item.mode is LoadMode.RELOAD:
            await self._load(work, rebuild=True)
            self._stats.inc("reloaded")
        elif work.live is None and (
            item.mode is LoadMode.RECOVER or self._owners.owns(work.saga_id)
        ):
            await self._load(work)
            if item.mode is LoadMode.WAKE_UP_DUE:
                self._stats.inc("sagas_woken")
        else:
            return  # held already, or (a wake-up) its partition moved away
        outcome.decision = work.replayed
        # A reload or a wake-up drives a saga this engine owns, and only until it ends.
        work.release_ended = item.mode is not LoadMode.RECOVER

    async def _load(self, work: Work, *, rebuild: bool = False) -> None:
        """Rebuilds the saga from its history and holds it (``rebuild``: in place of the
        copy held, whose spans of commands still in flight carry on)."""
        saga_id = work.saga_id
        loaded = await self._store.load_run(saga_id)
        events = [stored.event for stored in loaded.events]
        definition = self._registry.for_history(loaded.record.saga_type, events)
        # A saga the code deployed here cannot drive is parked now, not at its last event.
        runtime, decision = SagaRuntime.replay(
            definition,
            saga_id,
            events,
            now=self._clock.now(),
            limit=self._limit,
            callbacks=self._callbacks,
        )
        live = LiveSaga(
            runtime,
            committed_seq=loaded.record.last_seq,
            started_at=events[0].at if events else None,
        )
        # Loaded as its owner, it sends what it owes; another engine loads it just to
        # apply one input, and lets it go.
        live.driven = self._owners.owns(saga_id)
        if rebuild and saga_id in self._live:
            work.rebuilt = frozenset(c.command_id for c in runtime.outstanding_commands())
        self._live.put(saga_id, live)
        work.loaded(live, decision)
        if decision.nondeterminism is not None:
            log.error("%s", decision.nondeterminism)
            self._stats.inc("nondeterminism")

    # ------------------------------------------------------------------ 2. write

    async def _write(self, works: list[Work]) -> None:
        results: list[Any]
        if len(works) == 1:  # one saga: no task for the gather
            try:
                results = [await self._writing(works[0])]
            except Exception as exc:
                results = [exc]
        else:
            # Submitted together: the group commit writes them in one transaction.
            results = await asyncio.gather(*map(self._writing, works), return_exceptions=True)
        for work, result in zip(works, results, strict=True):
            if isinstance(result, ConcurrencyError):
                self._stats.inc("stale_owner")
                work.conflict = result  # someone else wrote to this saga: nothing is sent
            elif isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result
                # Whether it landed is unknown: the saga is rebuilt from the store next time.
                self._effects.fail(work, result)
            elif work.created is not None and result is False:
                await self._exists_already(work)
            else:
                work.written(len(work.events) if work.created is not None else int(result))
                if work.created is not None:
                    assert work.live is not None
                    self._live.put(work.saga_id, work.live)

    def _writing(self, work: Work) -> Awaitable[Any]:
        live, last = work.live, work.last
        assert live is not None
        assert last is not None
        events = work.events
        if work.created is None:
            return self._store.append(
                Append(work.saga_id, live.committed_seq, events, last.projection)
            )
        definition = live.runtime.state.definition
        return self._store.create(
            NewSaga(
                saga_id=work.saga_id,
                saga_type=live.runtime.saga_type,
                events=events,
                projection=last.projection,
                idempotency_key=live.runtime.started.idempotency_key,
                search=start_search(definition, live.runtime.started),
                saga_version=definition.version,
            )
        )

    async def _exists_already(self, work: Work) -> None:
        """The id of the saga a start created exists (not held here): the start is
        deduplicated if it asks for the same thing, and the inputs after it are decided
        again on the saga as stored."""
        assert work.created is not None
        assert work.live is not None
        index, start = work.created
        work.live.runtime.close()  # never held: release its coroutines now
        _, outcome = work.items[index]
        outcome.decision = None
        try:
            first = await self._store.first_event(work.saga_id)
            check_same_start(
                start.definition,
                first.event,
                start.payload,
                start.saga_id,
                start.idempotency_key,
                self._registry,
            )
            self._stats.inc("start_deduplicated")
        except Exception as exc:
            outcome.error = exc
        work.decide_after(index)

    # ------------------------------------------------------------------ 3. let go

    async def _let_go(self, work: Work) -> None:
        saga_id, owners = work.saga_id, self._owners
        live = self._live.get(saga_id)
        if (
            work.release_ended
            and live is not None
            and (live.runtime.status.is_terminal or not owners.owns(saga_id))
        ):
            self._live.evict(saga_id)
            live = None
        if not owners.shared:
            return
        if owners.owns(saga_id):
            if live is not None and not live.driven:
                # Its partition was assigned here while the input was applied, after
                # recovery skipped it as already loaded: drive it from now on.
                live.driven = True
                if not live.runtime.dead:
                    await self._effects.drive(work, live)
            return
        self._live.evict(saga_id)
        if work.changed:
            await owners.tell_owner(saga_id)

    # ------------------------------------------------------------------ reloads

    def reload_soon(self, saga_id: str, delay_s: float) -> None:
        """Rebuilds the saga after ``delay_s`` (doubling, up to 30 s, while the store or
        the broker stays away), as long as this engine still owns it. One chain per
        saga: asked again while one is pending (a timer's failed send is reported both
        by the send and by the timer), it is not started twice."""
        if saga_id in self._reloading:
            return
        # Asked again by the reload itself (its re-send failed too): it backs off.
        delay_s = min(max(delay_s, self._reload_delays.get(saga_id, 0.0) * 2), 30.0)
        self._reloading.add(saga_id)

        async def attempt() -> None:
            self._reloading.discard(saga_id)
            if self._closed or not self._owners.owns(saga_id):
                self._reload_delays.pop(saga_id, None)
                return
            self._reload_delays[saga_id] = delay_s
            try:
                (outcome,) = await self.apply([Load(saga_id, LoadMode.RELOAD)])
            finally:
                if saga_id not in self._reloading:  # went through: the next one starts over
                    self._reload_delays.pop(saga_id, None)
            if isinstance(outcome.error, TransientError):
                self.reload_soon(saga_id, min(delay_s * 2, 30.0))
            elif isinstance(outcome.error, SagaError):
                log.warning("reloading saga %s: %s", saga_id, outcome.error)
            elif outcome.error is not None:
                raise outcome.error

        self._clock.call_at(self._clock.now() + timedelta(seconds=delay_s), attempt)
