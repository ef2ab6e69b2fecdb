"""The engine: the runner around the pure decision core.

Every input reaches a saga through one path (``_path``): the saga's lock, the runtime's
decision, the decision's events appended to the store (write-ahead: nothing leaves the
process before its event is durable), then its commands sent and the saga's timer armed.
A batch of inputs from the inbox goes through it at once; any single input (an operator's
action, a timer, a start from a script) is a batch of one.

Live sagas stay in memory. A saga that is not in memory is rebuilt from its history
by replay, and its outstanding commands are sent again under the same ids: the
participants deduplicate them.

The engine's collaborators (the store, the sender, the clock, the live sagas, flow
control, the observer...) are built by the composition root (``EngineParts``) and
handed to it; nothing reads them back from the engine.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, overload

from pydantic import BaseModel

from saga_engine.core.authoring._definition import Saga
from saga_engine.core.history._decision import (
    CallbackInput,
    Cancel,
    Decision,
    ForceCompensate,
    Inbound,
    Reply,
    Resume,
    RetryStep,
    SignalInput,
    Skip,
    UpdateInput,
)
from saga_engine.core.history._events import (
    Event,
    ParentLink,
    ReplyTimings,
    RerunLink,
    TriggerOrigin,
    UpdateCompleted,
)
from saga_engine.core.runtime._callbacks import body_digest
from saga_engine.core.runtime._runtime import SagaRuntime
from saga_engine.core.runtime._start import PreparedStart, StartRequest
from saga_engine.kernel._callback_tokens import verify
from saga_engine.kernel._crash import CrashHook
from saga_engine.kernel._errors import (
    CallbackGone,
    ConcurrencyError,
    InvalidPayload,
    InvalidTransition,
    SagaError,
    SagaNotFound,
    SerializationError,
    TransientError,
    UpdateRefused,
)
from saga_engine.kernel._serde import JsonDict, check_storable, dumps, storable_copy
from saga_engine.kernel._settings import Settings, check_message_size, payload_limit
from saga_engine.runner._clock import Clock
from saga_engine.runner._input_path import InputPath
from saga_engine.runner._parts import EngineParts
from saga_engine.runner._path_inputs import (
    Deliver,
    FireTimers,
    Input,
    InputOutcome,
    Load,
    LoadMode,
    Start,
)
from saga_engine.runner._updates import answer_of, ask
from saga_engine.store._store import EventStore, SagaRecord
from saga_engine.telemetry._telemetry import Telemetry
from saga_engine.transport._bus import CommandSender, Ownership

log = logging.getLogger("saga_engine.engine")

#: How far recovery lets the cache run past its size before evicting back down to it.
_EVICT_SLACK = 256


@dataclass(frozen=True, slots=True)
class CallbackAnswer:
    """What a callback's call completed (the same for a repeat of it)."""

    saga_id: str
    wait_id: str
    failed: bool


class Engine:
    """Drives sagas. Build one per process from a Settings object and its adapters
    (``Engine(settings, sagas=..., store=..., sender=...)``), or from the collaborators a
    composition root built (``Engine(parts)``)."""

    @overload
    def __init__(self, parts: EngineParts, /) -> None: ...

    @overload
    def __init__(
        self,
        settings: Settings,
        /,
        *,
        sagas: Sequence[type[Saga[Any, Any]]],
        store: EventStore,
        sender: CommandSender,
        clock: Clock | None = None,
        crash_hook: CrashHook | None = None,
        telemetry: Telemetry | None = None,
        ownership: Ownership | None = None,
    ) -> None: ...

    def __init__(self, parts: EngineParts | Settings, /, **adapters: Any) -> None:
        if not isinstance(parts, EngineParts):
            parts = EngineParts.build(parts, **adapters)
        self._settings = parts.settings
        #: The largest payload taken directly (a start's input, a signal, a reply):
        #: worked out once, not for every reply.
        self._payload_limit = payload_limit(parts.settings)
        self._registry = parts.registry
        self._rollouts = parts.rollouts
        #: The flow policies configured (1 first): a start chooses among them.
        self._policies = parts.settings.limits.versions
        self._store = parts.store
        self._clock = parts.clock
        self._live = parts.live
        self._flow = parts.flow
        self._observer = parts.observer
        self._owners = parts.owners
        self._waiters = parts.waiters
        self._path = InputPath(parts)
        self._live.when_due(self._fire_timers)

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
        rerun_of: RerunLink | None = None,
    ) -> str:
        """Starts a saga and returns its id. With the same idempotency key, the same saga.
        ``rerun_of``: the saga an operator re-runs as this one (recorded, for the lineage)."""
        definition = self._registry.resolve(saga)  # a class must be one deployed here
        # The fields the caller set: the runtime fills in the defaults once, and a repeat
        # with a fresh default_factory value is still the same request.
        payload = (
            input.model_dump(mode="json", by_alias=True, exclude_unset=True)
            if isinstance(input, BaseModel)
            else dict(input)
        )
        prepared = self.prepare(
            StartRequest(
                definition.name,
                payload,
                saga_id,
                idempotency_key,
                deadline,
                trace_context or {},
                parent,
                trigger,
                priority,
                fairness_key,
                rerun_of,
            )
        )
        await self._one(Start(prepared.saga_id, prepared))
        return prepared.saga_id

    def prepare(self, request: StartRequest) -> PreparedStart:
        """Everything a start needs that takes no I/O: the definition (the version its
        type's rollout picks), the id, the deadline and the saga span's context. Raises
        what a bad start raises."""
        definition = self._registry.get(request.saga_type)
        self._check_size(request.input, f"input of saga {definition.name!r}")
        saga_id = request.with_saga_id().saga_id
        assert saga_id is not None
        definition = self._rollouts.choose(self._registry, definition, saga_id, request.input)
        flow_policy = request.flow_policy
        if flow_policy is None:
            flow_policy = self._rollouts.flow_policy(
                self._registry, definition, self._policies, saga_id, request.input
            )
        now = self._clock.now()
        limit = request.deadline or definition.deadline
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
        stored = self._observer.trace_context(definition.name, saga_id, request.trace_context)
        return PreparedStart(
            definition,
            request.input,
            saga_id,
            now,
            deadline_at,
            request.idempotency_key,
            stored,
            request.parent,
            request.trigger,
            request.priority,
            request.fairness_key,
            request.rerun_of,
            flow_policy,
        )

    # ------------------------------------------------------------------ inputs

    async def apply(self, inputs: Sequence[Input]) -> list[InputOutcome]:
        """Applies ``inputs`` as one batch (see ``_path``): one group-committed write,
        then every command sent and awaited together. Each input's outcome, in order: its
        decision, or the error that stopped it (the saga's other inputs go on)."""
        return await self._path.apply(inputs)

    async def deliver(self, saga_id: str, inbound: Inbound) -> Decision:
        """Applies one input to a saga. Raises SagaNotFound or InvalidTransition."""
        decision = await self._one(Deliver(saga_id, inbound))
        assert decision is not None
        return decision

    async def _one(self, item: Input) -> Decision | None:
        (outcome,) = await self._path.apply([item])
        return outcome.result()

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
        return await self.deliver(
            saga_id, self.reply_input(command_id, outcome, payload, error, sender=sender)
        )

    def reply_input(
        self,
        command_id: str,
        outcome: str,
        payload: JsonDict | None = None,
        error: str | None = None,
        *,
        sender: str | None = None,
        timings: ReplyTimings | None = None,
    ) -> Reply:
        """A reply as the engine takes it (``reply``'s checks, no I/O); ``timings``: what
        its timing headers said, recorded on its event."""
        if outcome not in ("success", "failure", "retryable"):
            raise ValueError(
                f"reply outcome must be success, failure or retryable, not {outcome!r}"
            )
        body = payload or {}
        # A reply the store cannot hold as it came is still taken in: the runtime keeps
        # an escaped copy and holds it for an operator (it is the participant's answer).
        self._check_size(body, "the reply", exact=False)
        return Reply(command_id, outcome, self._clock.now(), body, error, sender, timings)  # type: ignore[arg-type]

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
        return await self.deliver(
            saga_id,
            self.signal_input(
                name, payload, signal_id=signal_id, principal=principal, reason=reason
            ),
        )

    def signal_input(
        self,
        name: str,
        payload: BaseModel | JsonDict | None = None,
        *,
        signal_id: str | None = None,
        principal: str = "system",
        reason: str = "",
    ) -> SignalInput:
        """A signal as the engine takes it (``signal``'s checks, no I/O)."""
        body: JsonDict = (
            payload.model_dump(mode="json")
            if isinstance(payload, BaseModel)
            else dict(payload or {})
        )
        self._check_size(body, f"signal {name!r}", "payload")
        sid = signal_id or str(uuid.uuid4())
        return SignalInput(sid, name, self._clock.now(), body, principal, reason)

    async def callback(
        self, token: str, payload: JsonDict, *, failed: bool = False
    ) -> CallbackAnswer:
        """Completes the wait a callback URL's ``token`` names (``ctx.callback``) with
        ``payload`` (its ``/fail`` URL: ``failed``). The one write path a third party takes
        without an operator's token, so everything is checked before anything is
        recorded: CallbackTokenInvalid (a token not signed here), CallbackGone (expired,
        the wait over, the saga gone), CallbackConflict (answered with another body),
        InvalidPayload (naming each field its model refuses), PayloadTooLarge. The same
        body again gets the same answer and records nothing."""
        now = self._clock.now()
        claims = verify(self._settings.callbacks, token, now)
        self._check_size(payload, "the callback", "body")
        inbound = CallbackInput(
            claims.wait_id, now, dict(payload), failed, body_digest(payload, failed)
        )
        try:
            await self.deliver(claims.saga_id, inbound)
        except SagaNotFound:
            raise CallbackGone(
                f"the saga of this callback ({claims.saga_id}) no longer exists"
            ) from None
        return CallbackAnswer(claims.saga_id, claims.wait_id, failed)

    async def update(
        self,
        saga_id: str,
        name: str,
        payload: BaseModel | JsonDict | None = None,
        *,
        update_id: str | None = None,
        principal: str = "system",
        reason: str = "",
    ) -> UpdateCompleted:
        """Calls the saga's ``@update`` method ``name`` and returns its recorded answer
        (``result``, or ``error`` if the handler raised). The same ``update_id`` twice is
        applied once: the second call gets the first one's answer. Raises UpdateRefused
        (its validator, or the saga's state, refuses it: nothing is recorded),
        InvalidPayload (no such update, a bad input) or InvalidTransition (it ended)."""
        inbound = self.update_input(
            name, payload, update_id=update_id, principal=principal, reason=reason
        )
        try:
            decision = await self.deliver(saga_id, inbound)
            events = decision.events
        except InvalidTransition:
            events = []  # ended since? an update it recorded still has its answer
            if (await answer_of(self._store, saga_id, inbound.update_id, events)) is None:
                raise
        answer = await answer_of(self._store, saga_id, inbound.update_id, events)
        if answer is None:
            raise UpdateRefused(
                f"update {name!r} ({inbound.update_id}) of saga {saga_id} has no answer: "
                "the saga was parked before its handler ran"
            )
        return answer

    def update_input(
        self,
        name: str,
        payload: BaseModel | JsonDict | None = None,
        *,
        update_id: str | None = None,
        principal: str = "system",
        reason: str = "",
    ) -> UpdateInput:
        """An update as the engine takes it (``update``'s checks, no I/O)."""
        body: JsonDict = (
            payload.model_dump(mode="json", by_alias=True)
            if isinstance(payload, BaseModel)
            else dict(payload or {})
        )
        self._check_size(body, f"update {name!r}", "payload")
        uid = update_id or str(uuid.uuid4())
        return UpdateInput(uid, name, self._clock.now(), body, principal, reason)

    async def query(self, saga_id: str, name: str, args: BaseModel | JsonDict | None = None) -> Any:
        """Asks the saga's ``@query`` method ``name``; its answer as JSON. Nothing is
        written, whether the saga is in memory or replayed from its history for this.
        Raises SagaNotFound, InvalidPayload (no such query, bad arguments) or QueryFailed."""
        body = args.model_dump(mode="json") if isinstance(args, BaseModel) else dict(args or {})
        return await ask(self._store, self._registry, self._live, self._clock, saga_id, name, body)

    def cancel_input(self, reason: str, *, principal: str = "system") -> Cancel:
        return Cancel(reason, self._clock.now(), principal)

    async def cancel(self, saga_id: str, reason: str, *, principal: str = "system") -> Decision:
        return await self.deliver(saga_id, self.cancel_input(reason, principal=principal))

    async def force_compensate(
        self, saga_id: str, reason: str, *, principal: str = "system"
    ) -> Decision:
        """Makes a running saga undo what it did so far; it ends compensated."""
        return await self.deliver(saga_id, ForceCompensate(reason, self._clock.now(), principal))

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
        return await self.deliver(
            saga_id, Skip(step, self._clock.now(), payload, principal, reason)
        )

    async def retry_step(
        self,
        saga_id: str,
        step: str,
        *,
        reason: str = "",
        principal: str = "system",
        command: BaseModel | JsonDict | None = None,
    ) -> Decision:
        """Retries now a step waiting out its back-off, a stuck compensation, or a step
        parked after it could not succeed, with ``command`` in place of its command if
        given (checked against the step's command model: InvalidPayload if it does not
        match; InvalidTransition for a step that is not parked)."""
        body = command.model_dump(mode="json") if isinstance(command, BaseModel) else command
        if body is not None:
            self._check_size(body, f"the edited command of step {step!r}", "command")
        return await self.deliver(
            saga_id, RetryStep(step, self._clock.now(), principal, reason, body)
        )

    async def resume(
        self, saga_id: str, *, principal: str = "system", reason: str = ""
    ) -> Decision:
        """Resumes a parked saga: a stuck compensation is retried; a nondeterministic
        saga is rebuilt with the code deployed now and goes on if it replays cleanly."""
        return await self.deliver(saga_id, Resume(self._clock.now(), principal, reason))

    # ------------------------------------------------------------------ reading

    async def get(self, saga_id: str) -> SagaRecord:
        return await self._store.get(saga_id)

    async def history(self, saga_id: str) -> list[Event]:
        loaded = await self._store.load(saga_id)
        return [stored.event for stored in loaded.events]

    async def wait(self, saga_id: str, *, timeout: float = 30.0) -> SagaRecord:  # noqa: ASYNC109
        """Waits until the saga is terminal or parked; returns its record.

        Raises TimeoutError (the builtin) if it is still moving after ``timeout`` seconds.
        """
        return await self._waiters.wait(
            saga_id,
            lambda: self._store.get(saga_id),
            timeout=timeout,
            poll_s=self._settings.engine.wait_poll_s,
        )

    def live_saga_ids(self) -> list[str]:
        """Sagas held in memory by this engine."""
        return self._live.ids()

    def runtime_of(self, saga_id: str) -> SagaRuntime | None:
        live = self._live.get(saga_id)
        return live.runtime if live else None

    def open_saga_counts(self) -> dict[str, int]:
        """Sagas held in memory by this engine, by type (the ``saga.open`` gauge)."""
        return self._live.open_saga_counts()

    # ------------------------------------------------------------------ recovery

    async def recover(self, saga_ids: Sequence[str] | None = None) -> int:
        """Rebuilds open sagas from the store, re-sends their outstanding commands under
        the same ids and re-arms their timers. Returns how many are recovered: held here
        now, whether this pass loaded them or another input did first (the wake-up poll
        loads a new partition's due sagas as soon as it is owned).

        Memory stays within ``engine.cache_size``: past it the least recently changed
        sagas are evicted as recovery goes (what they had in flight was re-sent; their
        timers are due from the store)."""
        ids = list(saga_ids) if saga_ids is not None else await self._store.open_saga_ids()
        limit = asyncio.Semaphore(self._settings.engine.recovery_concurrency)
        bound = self._settings.engine.cache_size

        async def one(saga_id: str) -> bool:
            async with limit:
                (outcome,) = await self._path.apply([Load(saga_id, LoadMode.RECOVER)])
            if isinstance(outcome.error, TransientError):
                raise outcome.error  # the caller retries: the store or the broker is away
            if isinstance(outcome.error, SagaError):
                log.error("saga %s could not be recovered: %s", saga_id, outcome.error)
                self._observer.stats.inc("recovery_failed")
                return False
            outcome.result()
            if len(self._live) > bound + _EVICT_SLACK:
                # In chunks: a sweep walks the cache, so once per load would be
                # quadratic in a large recovery.
                self.evict_idle(float("inf"), bound)
            return outcome.decision is not None or saga_id in self._live

        results = await asyncio.gather(*(one(i) for i in ids))
        return sum(results)

    def evict(self, saga_id: str) -> None:
        """Forgets the in-memory copy; the next input rebuilds it from the store."""
        self._live.evict(saga_id)

    def evict_idle(
        self, idle_s: float, max_size: int, keep_due_before: datetime | None = None
    ) -> int:
        """See ``LiveSagas.evict_idle``; counted in the ``sagas_evicted`` stat."""
        evicted = self._live.evict_idle(idle_s, max_size, keep_due_before)
        if evicted:
            self._observer.stats.inc("sagas_evicted", evicted)
        return evicted

    async def load_due(self, saga_id: str) -> None:
        """Loads a saga whose wake-up is due (the store says so) and is not in memory:
        loading arms its timers, and a due one fires at once."""
        await self._one(Load(saga_id, LoadMode.WAKE_UP_DUE))

    async def sweep_keys(self) -> int:
        """Releases the concurrency-key slots of sagas that ended without releasing
        them, and wakes those that get them (housekeeping); how many got one."""
        return await self._path.keys.sweep()

    async def reload(self, saga_id: str) -> None:
        """Rebuilds a saga from its history (another engine changed it): what is in
        flight is re-sent under the same ids and its timers are re-armed."""
        await self._one(Load(saga_id, LoadMode.RELOAD))

    async def close(self) -> None:
        self._path.close()
        self._live.close()
        if self._flow is not None:
            await self._flow.close()

    # ------------------------------------------------------------------ internals

    async def _fire_timers(self, saga_id: str) -> None:
        (outcome,) = await self._path.apply([FireTimers(saga_id)])
        error = outcome.error
        if error is None or isinstance(error, ConcurrencyError):
            return  # a conflict was retried on the saga rebuilt, or the saga let go
        if isinstance(error, TransientError):
            # Its events may be durable and its commands unsent (the copy was dropped):
            # nothing else would re-send them until an input or a partition move, so
            # the saga is rebuilt from history (re-sending what it owes) a moment later.
            log.warning("timer of saga %s: %s; reloading it shortly", saga_id, error)
            self._path.reload_soon(saga_id, 0.5)
        elif isinstance(error, SagaError):
            log.warning("timer of saga %s: %s", saga_id, error)
        else:
            raise error

    def check_reply_size(self, body: JsonDict) -> None:
        # A reply the store cannot hold as it came is still taken in: the runtime keeps
        # an escaped copy and holds it for an operator (it is the participant's answer).
        self._check_size(body, "the reply", exact=False)

    def _check_size(self, payload: JsonDict, what: str, *loc: str, exact: bool = True) -> None:
        try:
            size = len(dumps(payload))
        except SerializationError:
            if exact:
                check_storable(payload, what, *loc)  # names the value JSON cannot carry
                raise
            size = len(dumps(storable_copy(payload)))
        check_message_size(size, self._payload_limit, what)
