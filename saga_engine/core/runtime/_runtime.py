"""The decision core: feed a saga's inputs in, get the events to record and the commands to send.

No I/O happens here. A :class:`SagaRuntime` holds one saga's code running on a
:class:`DeterministicLoop`. The runner (the engine) gives it one input at a time
(a reply, a timer firing, a signal, a cancel request) and gets back a
:class:`Decision`: the events to append to the history — the input first, then every
intent the code produced in reaction — and the commands to send once they are
durable.

Rebuilding a saga (:meth:`SagaRuntime.replay`) re-runs its code against its
history: recorded inputs are delivered again in order, and every intent the code
produces must match the recorded one. A difference raises no exception into the
saga: the runtime stops, reports a :class:`NondeterminismError` and asks for a
``SagaParked`` event, leaving the history intact for a fixed deploy to resume.

``SagaRuntime`` is the façade over one :class:`~saga_engine.core.runtime._state.SagaState`: the
state (the fold of the history, ``_fold``, and the code's own) is in ``_state``, what the
saga's ``ctx`` does in ``_operations``, the run around it and its compensations in
``_lifecycle``, and how an input becomes an event and wakes the code in ``_inputs``. It
is the context's driver (``_context.SagaDriver``): ``ctx`` calls come in through it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Coroutine, Mapping
from contextlib import AbstractAsyncContextManager
from datetime import datetime, timedelta
from typing import Any, NoReturn, TypeVar

from pydantic import BaseModel

from saga_engine.core.authoring._context import ChildSaga, SagaContext, StepRequest, Winner
from saga_engine.core.authoring._definition import SagaDefinition
from saga_engine.core.authoring._domain_events import key_text
from saga_engine.core.authoring._signal import Signal
from saga_engine.core.authoring._update import run_query
from saga_engine.core.history._concurrency_keys import check_key, key_value
from saga_engine.core.history._cost import Cost
from saga_engine.core.history._decision import (
    CallbackInput,
    Decision,
    DropReason,
    Inbound,
    KeyGrant,
    KeyQueue,
    OutboundCommand,
    Projection,
    Reply,
    StartSaga,
    TimerDue,
    Undo,
    parent_reply,
)
from saga_engine.core.history._events import (
    TERMINAL_EVENTS,
    CallbackAwaited,
    CallbackReceived,
    CommandIssued,
    CompensationIssued,
    Event,
    EventAwaited,
    RetryRequested,
    RunContinued,
    SagaStarted,
    UndoRequested,
)
from saga_engine.core.history._fold import Awaited
from saga_engine.core.history._policy import RetryPolicy
from saga_engine.core.history._status import SagaStatus
from saga_engine.core.history._structs import to_data
from saga_engine.core.runtime import _awaits as awaits
from saga_engine.core.runtime import _callbacks as callback_ops
from saga_engine.core.runtime import _continuing as continuing
from saga_engine.core.runtime import _operations as operations
from saga_engine.core.runtime import _progress as progress
from saga_engine.core.runtime import _races as races
from saga_engine.core.runtime import _updating as updating
from saga_engine.core.runtime._inputs import apply_input, check_parent, input_name, to_event
from saga_engine.core.runtime._operations import CommandLimit
from saga_engine.core.runtime._state import POLL_PREFIX, Halt, SagaState
from saga_engine.kernel._errors import InvalidTransition, SerializationError
from saga_engine.kernel._serde import JsonDict, check_storable, unstorable
from saga_engine.kernel._settings import CallbackSettings

M = TypeVar("M", bound=BaseModel)
#: The events after which an ended child answers its parent.
_ANSWERS_PARENT = (*TERMINAL_EVENTS, UndoRequested)
T = TypeVar("T")


class SagaRuntime:
    """One saga's code and state, driven by inputs. Pure: no clock, no I/O."""

    __slots__ = ("limit", "state")

    def __init__(
        self,
        definition: SagaDefinition,
        saga_id: str,
        clock: datetime,
        limit: CommandLimit | None = None,
        callbacks: CallbackSettings | None = None,
    ) -> None:
        #: Everything about the saga that changes while it runs (read it, do not change it).
        self.state = SagaState(definition, saga_id, SagaContext(self), clock)
        self.state.callback_keys = callbacks
        #: The size a command may be (None: not measured, as a replay tool reads).
        self.limit = limit

    # ------------------------------------------------------------------ construction

    @classmethod
    def start(
        cls,
        definition: SagaDefinition,
        start: StartSaga,
        *,
        limit: CommandLimit | None = None,
        callbacks: CallbackSettings | None = None,
    ) -> tuple[SagaRuntime, Decision]:
        """A brand-new saga: validates the input, records SagaStarted, runs to its first wait.
        ``limit``: the size of the commands its steps may issue; ``callbacks``: the keys
        its callback URLs are signed with.

        Raises InvalidPayload (UnstorableValue) naming each wrong field; nothing is recorded.
        """
        value = definition.validate_input(start.input)
        # Defaults filled in now, once: the code reads this input on every replay.
        payload = value.model_dump(mode="json", by_alias=True)
        check_key(definition.concurrency, payload)
        check_storable(
            {
                "saga_id": start.saga_id,
                "idempotency_key": start.idempotency_key,
                "fairness_key": start.fairness_key,
                "rerun_of": start.rerun_of.model_dump() if start.rerun_of else None,
            },
            "the start",
        )
        rt = cls(definition, start.saga_id, start.at, limit, callbacks)
        started = SagaStarted(
            at=start.at,
            saga_type=definition.name,
            input=payload,
            idempotency_key=start.idempotency_key,
            deadline_at=start.deadline_at,
            # Only telemetry: a header no one can store is dropped, not the start.
            trace_context={k: v for k, v in start.trace_context.items() if not unstorable({k: v})},
            request_hash=definition.fingerprint(value),
            parent=start.parent,
            trigger=start.trigger,
            saga_version=definition.version,
            priority=start.priority,
            fairness_key=start.fairness_key,
            rerun_of=start.rerun_of,
            flow_policy=start.flow_policy,
        )
        rt._record(started)
        return rt, rt._decision()

    @classmethod
    def replay(
        cls,
        definition: SagaDefinition,
        saga_id: str,
        history: list[Event],
        *,
        now: datetime | None = None,
        limit: CommandLimit | None = None,
        callbacks: CallbackSettings | None = None,
    ) -> tuple[SagaRuntime, Decision]:
        """Rebuilds a saga from its history. The decision holds anything owed past the end.
        ``limit`` and ``callbacks``: as ``start``'s, for what it does past its history
        (without ``callbacks``, code that reads a callback's URL parks the saga).

        ``now`` is the runner's clock: a saga parked while it is rebuilt (the code
        deployed no longer matches its history) is parked at that time, never before its
        last event. Without it, at its last event's time (a replay check records nothing).
        """
        if not history or not isinstance(history[0], SagaStarted):
            raise SerializationError(f"saga {saga_id}: a history must begin with saga_started")
        rt = cls(definition, saga_id, history[-1].at if now is None else now, limit, callbacks)
        s = rt.state
        s.history = list(history)
        if len(history) > 1 and isinstance(history[1], RunContinued):
            # A run that continued as new: it is read from its own beginning.
            s.cursor, s.continued = 2, history[1]
            rt._next_run()
        while (s := rt.state).cursor < len(s.history) and s.nondeterminism is None:
            event = s.history[s.cursor]
            if event.is_intent:
                s.nondeterministic(s.cursor, event.describe(), s.describe_waiting())
                break
            s.cursor += 1
            rt._deliver(event)
        if now is not None:  # loaded, it sends what it owes: its next poll is a period on
            for poll in s.polls.values():
                poll.due = max(poll.due, now + poll.every)
        return rt, rt._decision()

    # ------------------------------------------------------------------ the runner's API

    @property
    def saga_id(self) -> str:
        return self.state.saga_id

    @property
    def saga_type(self) -> str:
        return self.state.saga_type

    @property
    def trace_context(self) -> dict[str, str]:
        """The caller's trace context from the start, for the saga's spans."""
        return self.state.trace_context

    @property
    def output(self) -> JsonDict | None:
        """What the run returned, once the saga completed."""
        return self.state.output

    @property
    def status(self) -> SagaStatus:
        return self.state.shown_status

    @property
    def last_seq(self) -> int:
        """The sequence number of the newest event, committed or not."""
        return len(self.state.history) + self.state.offset

    @property
    def run(self) -> int:
        """The run the saga is in: 1, and one more each time it continued as new."""
        return self.state.run

    @property
    def run_events(self) -> int:
        """How many events its current run has recorded."""
        return continuing.run_events(self.state)

    @property
    def replaying(self) -> bool:
        return self.state.replaying

    @property
    def dead(self) -> bool:
        """Parked as nondeterministic: the code cannot go on until a fixed deploy."""
        return self.state.dead

    @property
    def history(self) -> list[Event]:
        return list(self.state.history)

    def pending_timers(self) -> dict[str, datetime]:
        """Its timers by id, with when they are due: the recorded ones and its polls."""
        s = self.state
        timers = {tid: t.fire_at for tid, t in s.timers.items()}
        timers.update((f"{POLL_PREFIX}{cid}", poll.due) for cid, poll in s.polls.items())
        return timers

    def next_wakeup(self) -> datetime | None:
        """When its next timer or poll is due (an engine holding it wakes it then)."""
        s = self.state
        if not s.timers and not s.polls:
            return None  # most sagas, most of the time: no dict of them built to find out
        return min(self.pending_timers().values())

    def recorded_wakeup(self) -> datetime | None:
        """When its next recorded timer is due: the store's wake-up, which a poll, never
        recorded, does not move (it would fall behind after the first one)."""
        timers = self.state.timers
        return min(t.fire_at for t in timers.values()) if timers else None

    @property
    def awaits_reply(self) -> bool:
        """A command it sent is not answered yet (``outstanding_commands`` is not empty)."""
        return any(f.held is None for f in self.state.inflight.values())

    def outstanding_commands(self) -> list[OutboundCommand]:
        """Commands sent but not answered: a recovering owner sends them again, same ids.
        (A step whose reply is held as invalid was answered: it is not sent again.)"""
        return [self._outbound(f.event) for f in self.state.inflight.values() if f.held is None]

    def messages_to_resend(self) -> list[OutboundCommand]:
        """Everything this saga owes others, derived from its history alone: its commands
        not answered yet (a step's, a child's start or undo) and, once a child has ended,
        its answers to its parent. Whoever loads the saga to drive it (recovery, a reload,
        a wake-up) sends them again under the same ids; the other side deduplicates. The
        one rule for what is owed: no message between sagas is sent only once."""
        return self.outstanding_commands() + self.parent_notices()

    @property
    def started(self) -> SagaStarted:
        """The saga's first event: its input, key and request hash."""
        first = self.state.history[0]
        assert isinstance(first, SagaStarted)
        return first

    def held_steps(self) -> list[str]:
        """Steps whose success reply was held as invalid, waiting for an operator."""
        return self.state.held_steps()

    def owed_compensations(self) -> list[str]:
        """The steps whose compensation is owed, in the order they would run: first those
        of the steps its code gave up, under way already (even past the pivot: a path
        not taken is undone), then its stack's (none once they cannot run:
        ``Fold.may_compensate``, the rule the view lists them by)."""
        s = self.state
        undoing = [o.step for o, task in s.given_up if not task.done()]
        return undoing + ([o.step for o in reversed(s.owed)] if s.may_compensate else [])

    def event_waits(self) -> list[EventAwaited]:
        """The domain events the saga waits for now (none for most sagas)."""
        return [w.event for w in self.state.event_waits.values()]

    def concurrency_key(self) -> str | None:
        """The value of its concurrency key (``Saga.concurrency``), or None: not limited."""
        limit = self.state.definition.concurrency
        return None if limit is None else key_value(limit, self.started.input)

    @property
    def awaits_key(self) -> bool:
        """Its run waits for its concurrency key (the history records no grant yet)."""
        s = self.state
        return s.key_waiter is not None and not s.key_waiter.done() and not s.dead

    def awaited(self) -> Awaited | None:
        """What the code waits for now (see ``Awaited``); None once it is parked (dead):
        its code holds nothing, and its history says what was open."""
        return None if self.state.dead else self.state.awaited()

    def query(self, name: str, args: JsonDict | None = None) -> Any:
        """Asks the saga's ``@query`` method ``name`` (its answer as JSON); nothing is
        recorded. Raises InvalidPayload (unknown query, bad arguments) or QueryFailed."""
        return run_query(self.state.saga, self.state.definition.cls, name, args or {})

    def handle(self, inbound: Inbound) -> Decision:
        """Applies one input and returns what to record and send.

        Raises InvalidTransition when the input makes no sense in the current status.
        """
        s = self.state
        s.new = []
        s.clock = inbound.at
        # ``type(...) is``, not isinstance: no input or event is subclassed, and isinstance
        # asked about a class with a metaclass of its own (msgspec's structs, enums, ABCs)
        # takes a slow path: with the same in ``_decision`` and ``_inputs``, 958,613 ->
        # 924,929 instructions per saga in the decision core (``python -m
        # bench.instructions``); for the drop reason and a step's cost, 894,701 -> 884,482.
        if type(inbound) is Undo:
            check_parent(s.saga_id, s.history[0], inbound.parent_id)  # the link decides
        if s.status.is_terminal and not (
            type(inbound) is Undo and s.status == SagaStatus.COMPLETED and not s.undo_ids
        ):
            if isinstance(inbound, Undo):
                # It ended another way, or is undone already: its end answers the undo.
                return self._decision(dropped=DropReason.UNDO_ANSWERED)
            if isinstance(inbound, Reply):
                known = inbound.command_id in s.issued_ids
                return self._decision(
                    dropped=DropReason.DUPLICATE_REPLY if known else DropReason.UNKNOWN_COMMAND
                )
            if isinstance(inbound, TimerDue):
                return self._decision(dropped=DropReason.STALE_TIMER)
            if isinstance(inbound, KeyQueue | KeyGrant):
                return self._decision(dropped=DropReason.KEY_SETTLED)
            if isinstance(inbound, CallbackInput):
                # A repeat still gets its answer; anything else is gone with the saga.
                return self._decision(dropped=callback_ops.after_the_end(s, inbound))
            raise InvalidTransition(
                f"saga {s.saga_id} is {s.status.value}; it accepts no "
                f"{input_name(inbound)} any more"
            )
        if type(inbound) is TimerDue and inbound.timer_id.startswith(POLL_PREFIX):
            return self._poll(inbound)
        event = to_event(s, inbound)
        if isinstance(event, str):  # a DropReason (isinstance of an enum's class: see above)
            return self._decision(dropped=event)
        self._record(event)
        return self._decision()

    def close(self) -> None:
        """Releases the saga's code (its coroutines) without running any more of it.

        The runtime is unusable afterwards. Its cycles are broken here (runtime, state and
        context, tasks and the futures they wait on), so that an evicted saga is freed
        when its last reference goes rather than at the next full garbage collection,
        which a tuned service runs rarely: the engine's memory then follows its cache
        size, not the number of sagas it has evicted."""
        _release(self.state)

    # ------------------------------------------------------------------ the context's door

    # SagaContext calls these; each runs in the saga's code on its deterministic loop.

    def op_step(self, request: StepRequest) -> Coroutine[Any, Any, JsonDict]:
        return operations.step(self.state, request, self.limit)

    def op_child(
        self,
        saga: type[ChildSaga[Any]],
        input: BaseModel | JsonDict,
        *,
        key: str | None,
        poll: timedelta | None,
        retry: RetryPolicy | None,
        pivot: bool = False,
    ) -> Coroutine[Any, Any, JsonDict]:
        return operations.child(
            self.state,
            saga,
            input,
            key=key,
            poll=poll,
            retry=retry,
            pivot=pivot,
            limit=self.limit,
        )

    def op_sleep(self, delay: timedelta) -> Coroutine[Any, Any, None]:
        return operations.sleep(self.state, delay)

    def op_wait_signal(self, name: str, timeout: timedelta | None) -> Coroutine[Any, Any, JsonDict]:
        return operations.wait_signal(self.state, name, timeout)

    def op_wait_event(
        self, source: str, key: Any, timeout: timedelta | None
    ) -> Coroutine[Any, Any, JsonDict]:
        try:
            text = key_text(key)
        except (TypeError, ValueError) as exc:
            self.state.definition_error(f"ctx.wait_event({source}): {exc}")
        return awaits.wait_event(self.state, source, text, timeout)

    def op_callback(
        self, name: str, model: type[BaseModel] | None, timeout: timedelta
    ) -> CallbackAwaited:
        return callback_ops.make_callback(self.state, name, model, timeout)

    def callback_url(self, event: CallbackAwaited) -> str:
        return callback_ops.url_of(self.state, event)

    def op_wait_callback(self, event: CallbackAwaited) -> Coroutine[Any, Any, CallbackReceived]:
        return callback_ops.wait_callback(self.state, event)

    def op_callback_step(
        self, request: StepRequest, event: CallbackAwaited
    ) -> Coroutine[Any, Any, CallbackReceived]:
        return callback_ops.callback_step(self.state, request, event, self.limit)

    def op_side_effect(self, fn: Callable[[], T]) -> Coroutine[Any, Any, T]:
        return operations.side_effect(self.state, fn)

    def op_emit(self, topic: str, payload: Any) -> Coroutine[Any, Any, int]:
        if self.limit is None:
            return progress.emit_progress(self.state, topic, payload)
        return progress.emit_progress(self.state, topic, payload, self.limit.limit)

    def op_wait_update(self, name: str) -> Coroutine[Any, Any, Any]:
        return updating.wait_update(self.state, name)

    def op_first(self, racers: Mapping[str, object]) -> Coroutine[Any, Any, Winner[Any]]:
        return races.first(self.state, racers)

    def op_timeout(self, delta: timedelta) -> AbstractAsyncContextManager[None]:
        return races.TimeoutScope(self.state, delta)

    def op_continue_as_new(
        self, state: BaseModel | JsonDict, carry: bool
    ) -> Coroutine[Any, Any, NoReturn]:
        return continuing.continue_as_new(self.state, state, carry=carry)

    def op_should_continue_as_new(self) -> bool:
        bound = None if self.limit is None else self.limit.run_events
        return continuing.should_continue(self.state, bound)

    def op_patched(self, patch_id: str) -> bool:
        return operations.patched(self.state, patch_id)

    def op_skip_node(self, node: str) -> None:
        operations.skip_node(self.state, node)

    def parse(self, model: type[M], payload: JsonDict, what: str, step: str | None = None) -> M:
        return operations.parse(model, payload, what, step)

    def declared_signal(
        self, signal: Signal[Any] | str, model: type[BaseModel] | None
    ) -> Signal[Any]:
        return operations.declared_signal(self.state, signal, model)

    @property
    def now(self) -> datetime:
        """The saga's time: the time of the input its code reacts to."""
        return self.state.now

    def deterministic_uuid(self) -> uuid.UUID:
        return operations.deterministic_uuid(self.state)

    def deterministic_random(self) -> float:
        return operations.deterministic_random(self.state)

    # ------------------------------------------------------------------ internals

    def _record(self, event: Event) -> None:
        """Records a new input event and delivers it."""
        s = self.state
        s.history.append(event)
        s.new.append(event)
        s.cursor += 1
        self._deliver(event)

    def _deliver(self, event: Event) -> None:
        """Applies an input event (live or replayed) and runs the code until it waits."""
        s = self.state
        s.now = event.at
        try:
            apply_input(s, event)
        except Halt:
            return
        self._run()
        if s.status is SagaStatus.STEP_STUCK:  # (settle_held moves nothing otherwise)
            s.settle_held()
        if s.continued is not None:
            self._next_run()

    def _next_run(self) -> None:
        """The run continued as new: its state is dropped and the next run's begins, from
        the ``run_continued`` event (the events of this decision so far, and any recorded
        after it, go with it)."""
        old = self.state
        continued, started = old.continued, old.history[0]
        assert continued is not None
        assert isinstance(started, SagaStarted)
        s = self.state = SagaState(old.definition, old.saga_id, SagaContext(self), old.clock)
        s.callback_keys = old.callback_keys
        s.history = [started, continued, *old.history[old.cursor :]]
        s.cursor = 2
        s.new = old.new
        _release(old)
        continuing.begin_run(s, started, continued)
        self._run()
        s.settle_held()
        if s.continued is not None:
            self._next_run()

    def _run(self) -> None:
        s = self.state
        s.loop.run_until_quiescent()
        lifecycle = s.lifecycle
        if (
            s.nondeterminism is None
            and lifecycle is not None
            and lifecycle.done()
            and not lifecycle.cancelled()
            and lifecycle.exception() is not None
            and not isinstance(lifecycle.exception(), Halt)
        ):
            raise RuntimeError("saga lifecycle crashed") from lifecycle.exception()

    def _decision(self, dropped: DropReason | None = None) -> Decision:
        s = self.state
        commands: list[OutboundCommand] = []
        retried: list[str] = []  # steps an operator retried
        for e in s.new:
            if type(e) is CommandIssued or type(e) is CompensationIssued:
                commands.append(self._outbound(e))
            elif type(e) is RetryRequested:
                retried.append(e.step)
        if retried:
            commands += self._resent(commands, retried)
        terminal = s.status.is_terminal
        # A child's end (or an undo it answers) goes to its parent; a saga without a
        # parent pays one attribute read, once, when it ends.
        if (
            terminal
            and s.history[0].parent is not None  # type: ignore[union-attr]
            and any(isinstance(e, _ANSWERS_PARENT) for e in s.new)
        ):
            commands += self.parent_notices()
        events, s.new = s.new, []
        ended = terminal or s.dead
        projection = Projection(
            status=s.shown_status,
            current_step=s.current_step,
            next_wakeup=None if ended else self.recorded_wakeup(),
            error=to_data(s.error) if s.error else None,
        )
        return Decision(events, commands, projection, dropped, s.nondeterminism)

    def _poll(self, due: TimerDue) -> Decision:
        """A poll is due: the command goes again under its id, and nothing is recorded."""
        s = self.state
        command_id = due.timer_id.removeprefix(POLL_PREFIX)
        poll, sent = s.polls.get(command_id), s.inflight.get(command_id)
        if poll is None or sent is None or sent.held is not None:
            return self._decision(dropped=DropReason.STALE_TIMER)
        poll.due = due.at + poll.every
        decision = self._decision()
        decision.commands.append(self._outbound(sent.event))
        return decision

    def _resent(self, sending: list[OutboundCommand], steps: list[str]) -> list[OutboundCommand]:
        """An operator's retry of ``steps`` waiting for their replies: their commands
        again, same ids (unless the code has just issued one anew, e.g. a parked step
        retried)."""
        s = self.state
        ids = {c.command_id for c in sending}
        return [
            self._outbound(f.event)
            for step in steps
            for f in s.awaiting_reply(step)
            if f.event.command_id not in ids
        ]

    def parent_notices(self, undo: str | None = None) -> list[OutboundCommand]:
        """What an ended child tells its parent (nothing for a saga without one, or one
        still open), as commands for the engine to route to the parent's inbox: the
        reply to each undo it was asked for, else its end as the reply to the command
        that started it (success with its output, or failure with its error). Sending
        them again is harmless: the parent drops a second reply to a command.

        ``undo``: the command id of an undo that reached the child after it had ended
        (see ``DropReason.UNDO_ANSWERED``). It is answered under its own id, or the
        parent's compensation would wait for ever: a child that ended failed,
        compensated or cancelled, or was undone already, has nothing left to undo."""
        s = self.state
        parent = self.started.parent
        if parent is None or not s.status.is_terminal:
            return []
        trace = s.trace_context
        undos = s.undo_ids if undo is None else {*s.undo_ids, undo}
        if undos:
            return [
                parent_reply(
                    parent.model_copy(update={"command_id": cid}),
                    s.saga_id,
                    "success",
                    {},
                    None,
                    trace,
                )
                for cid in sorted(undos)
            ]
        if s.status == SagaStatus.COMPLETED:
            return [parent_reply(parent, s.saga_id, "success", s.output or {}, None, trace)]
        error = s.error.message if s.error else f"child saga {s.saga_id} {s.status.value}"
        details = {"child_id": s.saga_id, "status": s.status.value}
        return [parent_reply(parent, s.saga_id, "failure", details, error, trace)]

    def _outbound(self, event: CommandIssued | CompensationIssued) -> OutboundCommand:
        s = self.state
        if type(event) is CommandIssued:
            return OutboundCommand(
                saga_id=s.saga_id,
                saga_type=s.saga_type,
                step=event.step,
                participant=event.participant,
                command_type=event.command_type,
                payload=event.payload,
                command_id=event.command_id,
                attempt=event.attempt,
                compensation=False,
                trace_context=s.trace_context,
                cost=Cost(event.cost) if event.cost else None,
            )
        assert isinstance(event, CompensationIssued)
        return OutboundCommand(
            saga_id=s.saga_id,
            saga_type=s.saga_type,
            step=event.step,
            participant=event.participant,
            command_type=event.command_type,
            payload=event.payload,
            command_id=event.command_id,
            attempt=event.attempt,
            compensation=True,
            trace_context=s.trace_context,
            compensates=tuple(event.compensates),
            compensates_attempts=tuple(s.last_attempt.get(c, 1) for c in event.compensates),
        )


def _release(s: SagaState) -> None:
    """Releases a state's code (see ``SagaRuntime.close``)."""
    if s.loop.is_closed():
        return  # closed already (the batch path may drop a saga twice)
    s.closing = True
    s.loop.discard()
    s.signal_waiters.clear()
    s.resume_waiters.clear()
    s.undo_waiter = None
    s.given_up = ()
    s.lifecycle = None
    s.user_running = False
    s.saga = None  # the user's object may hold the context (a cycle through it)
    s.ctx.detach()
