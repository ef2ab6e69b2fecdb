"""The engine: the runner around the pure decision core.

For each input it takes the saga's lock, lets the runtime decide, appends the
decision's events to the store (write-ahead: nothing leaves the process before its
event is durable), then sends the decision's commands and re-arms the saga's timer.

Live sagas stay in memory. A saga that is not in memory is rebuilt from its history
by replay, and its outstanding commands are sent again under the same ids: the
participants deduplicate them.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel

from saga_engine.core._decision import (
    Cancel,
    Decision,
    DropReason,
    ForceCompensate,
    Inbound,
    Reply,
    Resume,
    RetryStep,
    SignalInput,
    Skip,
    TimerDue,
    saga_id_for,
)
from saga_engine.core._definition import Saga, SagaRegistry
from saga_engine.core._events import Event, ParentLink, TriggerOrigin
from saga_engine.core._rollout import RolloutTable
from saga_engine.core._runtime import SagaRuntime
from saga_engine.core._start import PreparedStart, check_same_start, start_input
from saga_engine.core._status import SagaStatus
from saga_engine.kernel._crash import CrashHook
from saga_engine.kernel._errors import (
    ConcurrencyError,
    InvalidPayload,
    PayloadTooLarge,
    SagaError,
    SerializationError,
    TransientError,
)
from saga_engine.kernel._retry import Backoff
from saga_engine.kernel._serde import JsonDict, check_storable, dumps, storable_copy
from saga_engine.kernel._settings import Settings
from saga_engine.runner._cache import LiveSaga, LiveSagas
from saga_engine.runner._children import ChildLinks
from saga_engine.runner._clock import Clock, SystemClock
from saga_engine.runner._engine_batch import BatchApplier, BatchInput, BatchResult
from saga_engine.runner._flow_sender import install_flow
from saga_engine.runner._observer import EngineObserver
from saga_engine.store._store import Append, EventStore, NewSaga, SagaRecord
from saga_engine.telemetry._telemetry import Telemetry, default_telemetry
from saga_engine.transport._bus import CommandSender, Ownership

log = logging.getLogger("saga_engine.engine")

#: Attempts at an input whose append keeps conflicting with another writer (rebuilt from
#: history between them), and the back-off before the third and later ones.
_CONFLICT_ATTEMPTS = 5
_CONFLICT_BACKOFF_S = 0.05
#: The longest wait between those attempts: the first retry is at once, then 3 waits.
_CONFLICT_BACKOFF_MAX_S = _CONFLICT_BACKOFF_S * 2 ** (_CONFLICT_ATTEMPTS - 3)
#: How far recovery lets the cache run past its size before evicting back down to it.
_EVICT_SLACK = 256


class Engine:
    """Drives sagas. Build one per process from a Settings object and its adapters."""

    def __init__(
        self,
        settings: Settings,
        *,
        sagas: Sequence[type[Saga[Any, Any]]],
        store: EventStore,
        sender: CommandSender,
        clock: Clock | None = None,
        crash_hook: CrashHook | None = None,
        telemetry: Telemetry | None = None,
        ownership: Ownership | None = None,
    ) -> None:
        self.settings = settings
        #: Which sagas this engine drives, when several share them (None: all of them). A
        #: saga it does not drive may still be acted on here (an admin action, a late
        #: HTTP reply): the input is applied (appends are fenced), the saga is let go at
        #: once and its owner is told to reload it, so only the owner keeps it live.
        self._ownership = ownership
        #: Spans and metrics; the global OpenTelemetry providers unless one is given.
        self.telemetry = telemetry or default_telemetry()
        #: Spans, counters and crash points: everything the engine reports.
        self.observer = EngineObserver(self.telemetry, crash_hook)
        self.stats = self.observer.stats
        self.telemetry.watch(self)
        self.registry = SagaRegistry(sagas)
        #: Which version of its type a new saga runs (refreshed from the store).
        self.rollouts = RolloutTable()
        self.store = store
        self.sender = sender
        self.clock: Clock = clock or SystemClock()
        #: The sagas held in memory, with their locks (one per saga serialises its
        #: inputs; different sagas proceed in parallel) and timers.
        self.live = LiveSagas(
            self.clock, self.observer.spans, self._fire_timers, lambda: self._closed
        )
        self._watchers: dict[str, list[asyncio.Future[None]]] = {}
        #: Sagas with a reload pending (``_reload_soon``).
        self._reloading: set[str] = set()
        self._closed = False
        self._batch = BatchApplier(self)
        #: Child sagas: starting and undoing them, and their ends back to their parents.
        self.children = ChildLinks(self)
        self.flow = install_flow(self)  # None (sender untouched) unless a limit is set

    # ------------------------------------------------------------------ starting

    async def start(
        self,
        saga: str | type[Saga[Any, Any]],
        input: BaseModel | JsonDict,
        *,
        saga_id: str | None = None,
        idempotency_key: str | None = None,
        deadline: timedelta | None = None,
        trace_context: dict[str, str] | None = None,
        trigger: TriggerOrigin | None = None,
        parent: ParentLink | None = None,
        priority: int = 0,
        fairness_key: str | None = None,
    ) -> str:
        """Starts a saga and returns its id. With the same idempotency key, the same saga."""
        prepared = self.prepare_start(
            saga, input, saga_id=saga_id, idempotency_key=idempotency_key, deadline=deadline,
            trace_context=trace_context, trigger=trigger, parent=parent, priority=priority,
            fairness_key=fairness_key,
        )  # fmt: skip
        return await self._start(prepared)

    def prepare_start(
        self,
        saga: str | type[Saga[Any, Any]],
        input: BaseModel | JsonDict,
        *,
        saga_id: str | None = None,
        idempotency_key: str | None = None,
        deadline: timedelta | None = None,
        trace_context: dict[str, str] | None = None,
        trigger: TriggerOrigin | None = None,
        parent: ParentLink | None = None,
        priority: int = 0,
        fairness_key: str | None = None,
    ) -> PreparedStart:
        """Everything a start needs that takes no I/O: the definition, the input as sent,
        the id, the deadline and the saga span's context. Raises what a bad start raises."""
        definition = self.registry.resolve(saga)
        # The fields the caller set: the runtime fills in the defaults once, and a repeat
        # with a fresh default_factory value is still the same request.
        payload = (
            input.model_dump(mode="json", by_alias=True, exclude_unset=True)
            if isinstance(input, BaseModel)
            else dict(input)
        )
        self._check_size(payload, f"input of saga {definition.name!r}")
        if saga_id is None:
            saga_id = (
                saga_id_for(definition.name, idempotency_key)
                if idempotency_key
                else str(uuid.uuid4())
            )
        definition = self.rollouts.choose(self.registry, definition, saga_id, payload)
        now = self.clock.now()
        limit = deadline or definition.deadline
        try:
            deadline_at = now + limit if limit else None
        except OverflowError:
            raise InvalidPayload(
                f"the deadline of saga {definition.name!r}",
                [{"loc": ["deadline_s"], "msg": "is too far in the future", "type": "too_large"}],
            ) from None
        # The saga span's context (a child of the caller's when a traceparent came with
        # the start, else the root of a new trace) is what history stores, so every step
        # span (and, through Kafka, every participant span) is its descendant. The span
        # itself is emitted when the saga ends (SagaSpans.saga_finished).
        stored = self.observer.spans.saga_context(definition.name, saga_id, trace_context or {})
        return PreparedStart(
            definition, payload, saga_id, now, deadline_at, idempotency_key, stored, parent,
            trigger, priority, fairness_key,
        )  # fmt: skip

    async def _start(self, start: PreparedStart) -> str:
        async with self.live.lock(start.saga_id):
            return await self.start_held(start)

    async def start_held(self, start: PreparedStart) -> str:
        """``start`` for a caller that holds the saga's lock already (``live.lock``): a
        child's start, checked against its parent's history under the same lock as an
        undo that may race it."""
        definition, payload, saga_id, idempotency_key = (
            start.definition, start.payload, start.saga_id, start.idempotency_key
        )  # fmt: skip
        live = self.live.get(saga_id)
        if live is not None:
            check_same_start(
                definition, live.runtime.started, payload, saga_id, idempotency_key,
                self.registry,
            )  # fmt: skip
            self.stats.inc("start_deduplicated")
            return saga_id
        runtime, decision = SagaRuntime.start(definition, start_input(start))
        created = await self.store.create(
            NewSaga(
                saga_id=saga_id,
                saga_type=definition.name,
                events=decision.events,
                projection=decision.projection,
                idempotency_key=idempotency_key,
                search=definition.search_values(runtime.started.input),
                saga_version=definition.version,
            )
        )
        if not created:
            runtime.close()  # never held: release its coroutines now
            first = await self.store.first_event(saga_id)
            check_same_start(
                definition, first.event, payload, saga_id, idempotency_key, self.registry
            )
            self.stats.inc("start_deduplicated")
            return saga_id
        self.observer.stat("sagas_started", definition.name)
        live = LiveSaga(runtime, committed_seq=len(decision.events), started_at=start.now)
        self.live.put(saga_id, live)
        await self._effects(saga_id, live, decision)
        return saga_id

    # ------------------------------------------------------------------ inputs

    async def apply_batch(self, inputs: Sequence[BatchInput]) -> BatchResult:
        """Applies a batch of starts and replies as one unit (see ``_engine_batch``): one
        group-committed append, then every command sent and awaited together. Returns
        what the caller must still apply one input at a time, with ``start``/``deliver``
        (after ``reload`` for the sagas it names)."""
        return await self._batch.apply(inputs)

    async def deliver(self, saga_id: str, inbound: Inbound) -> Decision:
        """Applies one input to a saga. Raises SagaNotFound or InvalidTransition."""
        async with self.live.lock(saga_id):
            changed = False
            try:
                backoff = Backoff(_CONFLICT_BACKOFF_S, _CONFLICT_BACKOFF_MAX_S)
                for attempt in range(1, _CONFLICT_ATTEMPTS + 1):
                    try:
                        live, decision = await self._decide(saga_id, inbound, fresh=attempt > 1)
                        await self._commit_unless_dropped(saga_id, live, decision)
                        break
                    except ConcurrencyError:
                        if attempt == _CONFLICT_ATTEMPTS or not self._shares_and_owns(saga_id):
                            raise  # a stale owner, or another writer that keeps winning
                    # Another engine wrote to this saga (an operator's action there): the
                    # copy here was stale (or loading it conflicted). Apply the input again
                    # to the saga rebuilt from history, still holding its lock, so its
                    # inputs keep their order. The one place conflicts are retried; a
                    # writer that keeps winning is let go after a few attempts, with
                    # jittered back-off between them.
                    self.stats.inc("reloaded_after_conflict")
                    if attempt > 1:
                        await backoff.sleep()
                changed = decision.dropped is None and bool(decision.events)
                return decision
            finally:
                await self._let_go_unless_owned(saga_id, changed)

    async def _decide(
        self, saga_id: str, inbound: Inbound, *, fresh: bool
    ) -> tuple[LiveSaga, Decision]:
        """The saga (held, loaded, or ``fresh``: rebuilt from history) and its decision on
        ``inbound``, its lock held."""
        if fresh:
            live = await self._rebuild(saga_id)
            return live, live.runtime.handle(inbound)
        cached = saga_id in self.live
        live = await self._ensure_live(saga_id)
        decision = live.runtime.handle(inbound)
        if (
            decision.dropped is DropReason.UNKNOWN_COMMAND
            and cached
            and self._shares_and_owns(saga_id)
        ):
            # The copy held here may be stale (another engine changed the saga and issued
            # that command): ask the history before calling it unknown.
            self.stats.inc("reloaded_stale_copy")
            live = await self._rebuild(saga_id)
            decision = live.runtime.handle(inbound)
        return live, decision

    async def reply(
        self,
        saga_id: str,
        command_id: str,
        outcome: str,
        payload: JsonDict | None = None,
        error: str | None = None,
        *,
        sender: str | None = None,
    ) -> Decision:
        """Applies a participant's reply (or a child's end: ``sender`` names the saga that
        answers, checked against the child the step started)."""
        if outcome not in ("success", "failure", "retryable"):
            raise ValueError(
                f"reply outcome must be success, failure or retryable, not {outcome!r}"
            )
        body = payload or {}
        self.check_reply_size(body)
        return await self.deliver(
            saga_id,
            Reply(command_id, outcome, self.clock.now(), body, error, sender),  # type: ignore[arg-type]
        )

    def check_reply_size(self, body: JsonDict) -> None:
        # A reply the store cannot hold as it came is still taken in: the runtime keeps
        # an escaped copy and holds it for an operator (it is the participant's answer).
        self._check_size(body, "the reply", exact=False)

    async def signal(
        self,
        saga_id: str,
        name: str,
        payload: BaseModel | JsonDict | None = None,
        *,
        signal_id: str | None = None,
        principal: str = "system",
        reason: str = "",
    ) -> Decision:
        body: JsonDict = (
            payload.model_dump(mode="json")
            if isinstance(payload, BaseModel)
            else dict(payload or {})
        )
        self._check_size(body, f"signal {name!r}", "payload")
        sid = signal_id or str(uuid.uuid4())
        return await self.deliver(
            saga_id, SignalInput(sid, name, self.clock.now(), body, principal, reason)
        )

    async def cancel(self, saga_id: str, reason: str, *, principal: str = "system") -> Decision:
        return await self.deliver(saga_id, Cancel(reason, self.clock.now(), principal))

    async def force_compensate(
        self, saga_id: str, reason: str, *, principal: str = "system"
    ) -> Decision:
        """Makes a running saga undo what it did so far; it ends compensated."""
        return await self.deliver(saga_id, ForceCompensate(reason, self.clock.now(), principal))

    async def skip_step(
        self,
        saga_id: str,
        step: str,
        result: BaseModel | JsonDict | None = None,
        *,
        reason: str = "",
        principal: str = "system",
    ) -> Decision:
        """Answers a step waiting for its reply with ``result`` (it will not be compensated),
        or marks a stuck compensation as done by hand."""
        payload = (
            result.model_dump(mode="json") if isinstance(result, BaseModel) else dict(result or {})
        )
        self._check_size(payload, f"the result for step {step!r}")
        return await self.deliver(saga_id, Skip(step, self.clock.now(), payload, principal, reason))

    async def retry_step(
        self, saga_id: str, step: str, *, reason: str = "", principal: str = "system"
    ) -> Decision:
        """Retries now a step waiting out its back-off, or a stuck compensation."""
        return await self.deliver(saga_id, RetryStep(step, self.clock.now(), principal, reason))

    async def resume(
        self, saga_id: str, *, principal: str = "system", reason: str = ""
    ) -> Decision:
        """Resumes a parked saga: a stuck compensation is retried; a nondeterministic
        saga is rebuilt with the code deployed now and goes on if it replays cleanly."""
        async with self.live.lock(saga_id):
            changed = False
            try:
                live = self.live.get(saga_id)
                if live is None or live.runtime.status == SagaStatus.NONDETERMINISTIC:
                    self.live.evict(saga_id)
                    live = await self._ensure_live(saga_id)
                was_parked = live.runtime.dead
                decision = live.runtime.handle(Resume(self.clock.now(), principal, reason))
                await self._commit(saga_id, live, decision)
                changed = bool(decision.events)
                if was_parked and self.live.get(saga_id) is live and self._owns(saga_id):
                    await self._resend_outstanding(live)
                return decision
            finally:
                await self._let_go_unless_owned(saga_id, changed)

    # ------------------------------------------------------------------ reading

    async def get(self, saga_id: str) -> SagaRecord:
        return await self.store.get(saga_id)

    async def history(self, saga_id: str) -> list[Event]:
        loaded = await self.store.load(saga_id)
        return [stored.event for stored in loaded.events]

    async def wait(self, saga_id: str, *, timeout: float = 30.0) -> SagaRecord:  # noqa: ASYNC109
        """Waits until the saga is terminal or parked; returns its record.

        Raises TimeoutError (the builtin) if it is still moving after ``timeout`` seconds.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            record = await self.store.get(saga_id)
            if record.status.is_terminal or record.status.is_parked:
                return record
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"saga {saga_id} is still {record.status.value}")
            future: asyncio.Future[None] = loop.create_future()
            self._watchers.setdefault(saga_id, []).append(future)
            try:
                # Woken early when this engine finishes the saga; otherwise poll the
                # store, because the saga may be driven by another instance.
                await asyncio.wait_for(future, min(remaining, self.settings.engine.wait_poll_s))
            except TimeoutError:
                pass
            finally:
                watchers = self._watchers.get(saga_id, [])
                if future in watchers:
                    watchers.remove(future)
                if not watchers:
                    self._watchers.pop(saga_id, None)  # nothing per saga outlives its use

    def live_saga_ids(self) -> list[str]:
        """Sagas held in memory by this engine."""
        return self.live.ids()

    def runtime_of(self, saga_id: str) -> SagaRuntime | None:
        live = self.live.get(saga_id)
        return live.runtime if live else None

    # ------------------------------------------------------------------ recovery

    async def recover(self, saga_ids: Sequence[str] | None = None) -> int:
        """Rebuilds open sagas from the store, re-sends their outstanding commands under
        the same ids and re-arms their timers. Returns how many were recovered.

        Memory stays within ``engine.cache_size``: past it the least recently changed
        sagas are evicted as recovery goes (what they had in flight was re-sent; their
        timers are due from the store)."""
        ids = list(saga_ids) if saga_ids is not None else await self.store.open_saga_ids()
        limit = asyncio.Semaphore(self.settings.engine.recovery_concurrency)
        bound = self.settings.engine.cache_size

        async def one(saga_id: str) -> bool:
            async with limit:
                async with self.live.lock(saga_id):
                    if saga_id in self.live:
                        return False
                    try:
                        await self._ensure_live(saga_id)
                    except TransientError:
                        raise  # the caller retries: the store or the broker is away
                    except SagaError as exc:
                        log.error("saga %s could not be recovered: %s", saga_id, exc)
                        self.stats.inc("recovery_failed")
                        return False
                if len(self.live) > bound + _EVICT_SLACK:
                    # In chunks: a sweep walks the cache, so once per load would be
                    # quadratic in a large recovery.
                    self.evict_idle(float("inf"), bound)
                return True

        results = await asyncio.gather(*(one(i) for i in ids))
        return sum(results)

    def evict(self, saga_id: str) -> None:
        """Forgets the in-memory copy; the next input rebuilds it from the store."""
        self.live.evict(saga_id)

    def evict_idle(
        self, idle_s: float, max_size: int, keep_due_before: datetime | None = None
    ) -> int:
        """See ``LiveSagas.evict_idle``; counted in the ``sagas_evicted`` stat."""
        evicted = self.live.evict_idle(idle_s, max_size, keep_due_before)
        if evicted:
            self.stats.inc("sagas_evicted", evicted)
        return evicted

    async def wake(self, saga_id: str) -> None:
        """Loads a saga whose wake-up is due (the store says so) and is not in memory:
        loading arms its timers, and a due one fires at once."""
        async with self.live.lock(saga_id):
            if saga_id in self.live or not self._owns(saga_id):
                return  # loaded meanwhile, or its partition moved away
            live = await self._ensure_live(saga_id)
            self.stats.inc("sagas_woken")
            if live.runtime.status.is_terminal or not self._owns(saga_id):
                self.live.evict(saga_id)

    async def close(self) -> None:
        self._closed = True
        self.live.clear()
        if self.flow is not None:
            await self.flow.close()

    # ------------------------------------------------------------------ internals

    def _check_size(self, payload: JsonDict, what: str, *loc: str, exact: bool = True) -> None:
        try:
            size = len(dumps(payload))
        except SerializationError:
            if exact:
                check_storable(payload, what, *loc)  # names the value JSON cannot carry
                raise
            size = len(dumps(storable_copy(payload)))
        if size > self.settings.engine.max_payload_bytes:
            raise PayloadTooLarge(size, self.settings.engine.max_payload_bytes)

    async def _ensure_live(self, saga_id: str) -> LiveSaga:
        live = self.live.get(saga_id)
        if live is not None:
            return live
        loaded = await self.store.load(saga_id)
        events = [stored.event for stored in loaded.events]
        definition = self.registry.for_history(loaded.record.saga_type, events)
        # A saga the code deployed here cannot drive is parked now, not at its last event.
        runtime, decision = SagaRuntime.replay(definition, saga_id, events, now=self.clock.now())
        live = LiveSaga(
            runtime,
            committed_seq=loaded.record.last_seq,
            started_at=events[0].at if events else None,
        )
        self.live.put(saga_id, live)
        try:
            if decision.nondeterminism is not None:
                log.error("%s", decision.nondeterminism)
                self.stats.inc("nondeterminism")
            if decision.events:
                await self._commit(saga_id, live, decision)
            live.driven = self._owns(saga_id)
            if not runtime.dead and live.driven:
                # Only the owner re-sends: another engine loads it just to apply one input.
                await self._resend_outstanding(live)
        except BaseException:
            # Half loaded (a re-send failed, say): not kept, so that the next attempt (an
            # input, a poll, recovery) loads it again and re-sends what it owes.
            if self.live.get(saga_id) is live:
                self.live.evict(saga_id, keep_spans=True)
            raise
        self.live.arm(saga_id, live)
        return live

    async def _resend_outstanding(self, live: LiveSaga) -> None:
        # Whatever it owes (in flight when the previous owner stopped, or while the saga
        # was parked; an ended child's answer to its parent) goes out again under the
        # same ids; participants and parents deduplicate.
        for command in live.runtime.owed():
            # A new span for this send: the first one died with the previous owner.
            sent = self.observer.spans.sent(command, resent=True)
            try:
                await self.sender.send_command(sent)
            except BaseException as exc:
                self.observer.spans.not_sent(command.command_id, exc)
                raise
            self.stats.inc("commands_resent")
        if self.flow is not None:
            self.flow.settle(live.runtime.saga_id, live.runtime)

    async def _commit_unless_dropped(
        self, saga_id: str, live: LiveSaga, decision: Decision
    ) -> None:
        if decision.dropped is not None:
            self.stats.inc(f"dropped_{decision.dropped.value}")
            return
        await self._commit(saga_id, live, decision)

    async def _commit(self, saga_id: str, live: LiveSaga, decision: Decision) -> None:
        if decision.events:
            try:
                live.committed_seq = await self.store.append(
                    Append(saga_id, live.committed_seq, decision.events, decision.projection)
                )
            except ConcurrencyError:
                # Someone else wrote to this saga: forget the copy and send nothing. Its
                # open spans stay, for the commands a rebuilt copy re-sends (_rebuild).
                self.stats.inc("stale_owner")
                self.live.evict(saga_id, keep_spans=True)
                raise
            except BaseException:
                # We do not know whether the append landed: rebuild from the store next time.
                self.live.evict(saga_id)
                raise
        self.observer.checkpoint("after_append")
        await self._effects(saga_id, live, decision)

    async def _effects(self, saga_id: str, live: LiveSaga, decision: Decision) -> None:
        # Live inputs only: a saga rebuilt from history never passes here for what it
        # replays, so no span is emitted twice.
        self.observer.spans.applied(saga_id, decision.events)
        if decision.commands:
            # Crash points for fault-injection tests: the events are durable, the
            # commands not yet sent.
            self.observer.checkpoint("before_send")
            if any(c.compensation for c in decision.commands):
                self.observer.checkpoint("before_send_compensation")
        for command in decision.commands:
            sent = self.observer.spans.sent(command)
            try:
                await self.sender.send_command(sent)
            except BaseException as exc:
                # The command is recorded; rebuilding the saga sends it again.
                self.observer.spans.not_sent(command.command_id, exc)
                self.live.evict(saga_id)
                if decision.status.is_terminal and isinstance(exc, TransientError):
                    # An open saga is woken by its next timeout, which re-sends; nothing
                    # wakes an ended one, so a child's answer to its parent is re-sent
                    # from history by a reload (until the broker takes it).
                    self._reload_soon(saga_id, 0.5)
                raise
            self.observer.checkpoint("after_send")
        if self.flow is not None:
            self.flow.settle(saga_id, live.runtime)  # permits of attempts now over
        status = decision.status
        for event in decision.events:
            self.observer.counted(event, live)
        if status.is_terminal or status.is_parked:
            self._notify(saga_id)
        if status.is_terminal:
            self.observer.ended(saga_id, live, status, decision.projection.error)
            self.live.evict(saga_id)
        else:
            self.live.arm(saga_id, live)

    def open_saga_counts(self) -> dict[str, int]:
        """Sagas held in memory by this engine, by type (the ``saga.open`` gauge)."""
        return self.live.counts_by_type()

    def _notify(self, saga_id: str) -> None:
        for future in self._watchers.pop(saga_id, []):
            if not future.done():
                future.set_result(None)  # the waiter re-reads the store

    async def _fire_timers(self, saga_id: str) -> None:
        try:
            async with self.live.lock(saga_id):
                live = self.live.get(saga_id)
                if live is None:
                    return  # evicted or moved on; recovery re-arms it
                if not self._owns(saga_id):
                    self.live.evict(saga_id)  # its partition moved: its owner fires it
                    return
                now = self.clock.now()
                timers = self.live.timers(saga_id, live)  # flow control may hold a timeout
                due = sorted((at, tid) for tid, at in timers.items() if at <= now)
                for _, timer_id in due:
                    if live.runtime.status.is_terminal or live.runtime.dead:
                        break
                    decision = live.runtime.handle(TimerDue(timer_id, now))
                    if decision.dropped is None:
                        await self._commit(saga_id, live, decision)
                    if self.live.get(saga_id) is not live:
                        return
                self.live.arm(saga_id, live)
        except ConcurrencyError:
            # Another engine wrote to this saga (an operator acted on it there): the copy
            # here was stale and is evicted. Reload it from history, which re-arms its
            # timers; otherwise a saga waiting only on a timer would wait for recovery.
            if self._closed or not self._shares_and_owns(saga_id):
                self.observer.spans.evicted(saga_id)
                return
            self.stats.inc("reloaded_after_conflict")
            try:
                async with self.live.lock(saga_id):
                    if saga_id not in self.live:
                        await self._rebuild(saga_id)
            except SagaError as exc:
                log.warning("reloading saga %s after a conflict: %s", saga_id, exc)
        except TransientError as exc:
            # Its events may be durable and its commands unsent (the copy was dropped):
            # nothing else would re-send them until an input or a partition move, so
            # the saga is rebuilt from history (re-sending what it owes) a moment later.
            log.warning("timer of saga %s: %s; reloading it shortly", saga_id, exc)
            self._reload_soon(saga_id, 0.5)
        except SagaError as exc:
            log.warning("timer of saga %s: %s", saga_id, exc)

    def _reload_soon(self, saga_id: str, delay_s: float) -> None:
        """Rebuilds the saga after ``delay_s`` (doubling, up to 30 s, while the store or
        the broker stays away), as long as this engine still owns it. One chain per
        saga: asked again while one is pending (a timer's failed send is reported both
        by the send and by the timer), it is not started twice."""
        if saga_id in self._reloading:
            return
        self._reloading.add(saga_id)

        async def attempt() -> None:
            self._reloading.discard(saga_id)
            if self._closed or not self._owns(saga_id):
                return
            try:
                await self.reload(saga_id)
            except TransientError:
                self._reload_soon(saga_id, min(delay_s * 2, 30.0))
            except SagaError as exc:
                log.warning("reloading saga %s: %s", saga_id, exc)

        self.clock.call_at(self.clock.now() + timedelta(seconds=delay_s), attempt)

    def _owns(self, saga_id: str) -> bool:
        return self._ownership is None or self._ownership.owns(saga_id)

    def _shares_and_owns(self, saga_id: str) -> bool:
        """Sagas are shared between engines and this one owns the saga: a conflicting
        write means another engine acted on it (and the owner should rebuild its copy),
        not that this engine is the stale one. Without an Ownership there is no way to
        tell, so a conflict is the caller's to handle."""
        return self._ownership is not None and self._ownership.owns(saga_id)

    async def _let_go_unless_owned(self, saga_id: str, changed: bool) -> None:
        if self._ownership is None:
            return
        live = self.live.get(saga_id)
        if self._ownership.owns(saga_id):
            if live is not None and not live.driven:
                # Its partition was assigned here while the input was applied, after
                # recovery skipped it as already loaded: drive it from now on.
                live.driven = True
                if not live.runtime.dead:
                    await self._resend_outstanding(live)
            return
        self.live.evict(saga_id)
        if changed:
            await self._notify_owner(saga_id)

    async def _notify_owner(self, saga_id: str) -> None:
        assert self._ownership is not None
        backoff = Backoff(0.2, 0.4)
        for attempt in (1, 2, 3):
            try:
                await self._ownership.notify_owner(saga_id)
                return
            except SagaError as exc:
                if attempt == 3:
                    # The change is durable. The owner still catches up at its next write
                    # or reply for the saga (a conflict or an unknown command makes it
                    # reload), or when the partition is next assigned; a saga waiting only
                    # on a timer this change created waits until then.
                    self.stats.inc("reload_notice_lost")
                    log.error("could not tell the owner of saga %s to reload it: %s", saga_id, exc)
                    return
                await backoff.sleep()

    async def reload(self, saga_id: str) -> None:
        """Rebuilds a saga from its history (another engine changed it): what is in
        flight is re-sent under the same ids and its timers are re-armed."""
        async with self.live.lock(saga_id):
            live = await self._rebuild(saga_id)
            if live.runtime.status.is_terminal or not self._owns(saga_id):
                self.live.evict(saga_id)
            self.stats.inc("reloaded")

    async def _rebuild(self, saga_id: str) -> LiveSaga:
        """Rebuilds a stale copy from history (its lock held). The spans of commands
        still in flight carry on (re-sent under the same ids, they reuse them); the others
        were answered elsewhere and end."""
        self.live.evict(saga_id, keep_spans=True)
        live = await self._ensure_live(saga_id)
        in_flight = {c.command_id for c in live.runtime.outstanding_commands()}
        self.observer.spans.superseded(saga_id, keep=in_flight)
        return live
