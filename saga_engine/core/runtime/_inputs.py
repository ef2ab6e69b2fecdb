"""An input's way into a saga: checked into its event, then the code it wakes.

:func:`to_event` is the edge: an input that makes no sense where the saga stands, or
that holds what the saga cannot accept, raises (``InvalidTransition``,
``InvalidPayload``) before anything is recorded; one that changes nothing (a duplicate
reply, a stale timer) is dropped with its reason; anything else becomes the event to
record. Once recorded (or replayed) :func:`apply_input` folds the event into the saga's
state and resolves what the saga's code waits on: the reply or timer the event
settled, a signal, a cancel, an operator's skip or retry. The caller (``SagaRuntime``)
then runs the code until it waits.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from saga_engine.core.history._decision import (
    CHILD_PARTICIPANT,
    DEADLINE_TIMER,
    CallbackInput,
    Cancel,
    DropReason,
    EventInput,
    ForceCompensate,
    Inbound,
    KeyGrant,
    KeyQueue,
    Reply,
    Resume,
    RetryStep,
    SignalInput,
    Skip,
    TimerDue,
    Undo,
    UpdateInput,
)
from saga_engine.core.history._events import (
    AttemptTimedOut,
    CallbackReceived,
    CancelRequested,
    CommandIssued,
    CompensationForced,
    CompensationIssued,
    DomainEventReceived,
    ErrorInfo,
    Event,
    InvalidReplyReceived,
    KeyAcquired,
    KeyQueued,
    ReplyReceived,
    RetryRequested,
    SagaResumed,
    SagaStarted,
    SignalReceived,
    StepSkipped,
    TimerFired,
    UndoRequested,
    UpdateReceived,
)
from saga_engine.core.history._fold import (
    FOLD_HANDLERS,
    EventWait,
    ParkedStep,
    Sent,
    Settled,
    Timer,
    Unstuck,
    owned,
)
from saga_engine.core.history._status import SagaStatus
from saga_engine.core.runtime._callbacks import callback_event, callback_to_code
from saga_engine.core.runtime._lifecycle import (
    answer_waiting_step,
    request_cancel,
    request_undo,
    run_lifecycle,
)
from saga_engine.core.runtime._state import Halt, SagaState
from saga_engine.core.runtime._undo import unblock_compensation
from saga_engine.core.runtime._updating import update_event, update_to_code
from saga_engine.kernel._errors import (
    InvalidPayload,
    InvalidTransition,
    NotParent,
    PastPivot,
    TransientError,
    UnstorableValue,
)
from saga_engine.kernel._serde import (
    JsonDict,
    check_storable,
    model_payload,
    storable_copy,
    validate_payload,
)

_INPUT_NAMES = {
    SignalInput: "signal",
    Cancel: "cancel",
    ForceCompensate: "force-compensate",
    Skip: "skip",
    RetryStep: "retry",
    Resume: "resume",
    Reply: "reply",
    TimerDue: "timer",
    Undo: "undo",
    EventInput: "event",
    CallbackInput: "callback",
    UpdateInput: "update",
    KeyQueue: "key-queue",
    KeyGrant: "key-grant",
}


def input_name(inbound: Inbound) -> str:
    """An input's name in messages, as operators know the actions."""
    return _INPUT_NAMES.get(type(inbound), type(inbound).__name__.lower())


# --------------------------------------------------------------------------- input -> event


def check_parent(saga_id: str, started: Event, parent_id: str) -> None:
    """Only a child's own parent, as its first event records it, may undo it or start it
    again: anything else that can write to the inbox must not touch the saga."""
    assert isinstance(started, SagaStarted)
    recorded = started.parent.saga_id if started.parent is not None else None
    # A saga no parent started is no child of the sender either: not_parent (section 5a).
    if recorded != parent_id:
        raise NotParent(saga_id, parent_id, recorded)


def to_event(s: SagaState, inbound: Inbound) -> Event | DropReason:
    """The event that records ``inbound``, or why it is dropped; raises if it is refused."""
    if s.dead:
        return _while_parked(s, inbound)
    convert = _TO_EVENT.get(type(inbound))
    if convert is None:
        raise TypeError(f"unknown input {inbound!r}")
    return convert(s, inbound)


def _while_parked(s: SagaState, inbound: Inbound) -> Event | DropReason:
    """Replies and timers are dropped: on resume, outstanding commands are re-sent under
    the same ids (participants repeat their stored replies) and timers are re-armed.
    Signals and cancels are refused, so their sender knows; recording them here would
    put inputs in the history that no code reacted to."""
    if isinstance(inbound, Resume):
        if s.nondeterminism is not None:
            raise InvalidTransition(
                f"saga {s.saga_id} still cannot be driven by the code deployed here "
                f"({s.nondeterminism}); deploy code that replays its history, then resume"
            )
        _check_texts("resume", principal=inbound.principal, reason=inbound.reason)
        return SagaResumed(at=inbound.at, principal=inbound.principal, reason=inbound.reason)
    if isinstance(inbound, CallbackInput):
        # The caller is a third party's webhook, which retries on a 5xx: the saga takes
        # the callback once an operator has deployed a fix and resumed it.
        raise TransientError(
            f"saga {s.saga_id} is parked for an operator; the callback is not recorded, "
            "send it again later"
        )
    if isinstance(inbound, SignalInput | Cancel | ForceCompensate | Skip | RetryStep | UpdateInput):
        raise InvalidTransition(
            f"saga {s.saga_id} is parked as nondeterministic; resume it after "
            f"deploying a fix before sending it a {input_name(inbound)}"
        )
    return DropReason.PARKED


def _reply(s: SagaState, inbound: Reply) -> Event | DropReason:
    sent = s.inflight.get(inbound.command_id)
    if sent is None:
        if inbound.command_id in s.issued_ids:
            return DropReason.DUPLICATE_REPLY
        return DropReason.UNKNOWN_COMMAND
    if sent.held is not None:
        return DropReason.DUPLICATE_REPLY  # answered already; its reply is held
    if inbound.sender is not None and sent.event.participant == CHILD_PARTICIPANT:
        _check_child(s, inbound.sender, sent.event)
    return _reply_event(inbound, sent)


def _timer_due(s: SagaState, inbound: TimerDue) -> Event | DropReason:
    timer = s.timers.get(inbound.timer_id)
    if timer is None:
        return DropReason.STALE_TIMER
    if timer.command_id is not None:
        cmd = s.inflight[timer.command_id].event
        return AttemptTimedOut(
            at=inbound.at,
            step=cmd.step,
            command_id=cmd.command_id,
            attempt=cmd.attempt,
            compensation=isinstance(cmd, CompensationIssued),
        )
    return TimerFired(at=inbound.at, timer_id=inbound.timer_id)


def _signal(s: SagaState, inbound: SignalInput) -> Event | DropReason:
    if inbound.signal_id in s.seen_signals:
        return DropReason.DUPLICATE_SIGNAL
    if not s.going_forward or s.cancel_reason is not None:
        # Its code has stopped (it undoes its steps, or is parked doing so): no wait
        # can ever take the signal, and recording it would say it was accepted.
        raise InvalidTransition(
            f"saga {s.saga_id} is {s.status.value}: it is undoing its steps, so its "
            "code waits for no signal any more"
        )
    # Checked before anything is recorded: a signal the saga does not declare, or
    # a payload its model refuses, would only fail the saga's code later.
    s.definition.signal(inbound.name).validate(inbound.payload, "payload")
    _check_texts(
        "signal",
        signal_id=inbound.signal_id,
        principal=inbound.principal,
        reason=inbound.reason,
    )
    return SignalReceived(
        at=inbound.at,
        signal_id=inbound.signal_id,
        name=inbound.name,
        payload=inbound.payload,
        principal=inbound.principal,
        reason=inbound.reason,
    )


def _domain_event(s: SagaState, inbound: EventInput) -> Event | DropReason:
    """A stored fact answers the saga's first open wait for its source and key, once;
    anything else drops it (it stays stored for a later wait, within its retention)."""
    if inbound.event_id in s.seen_events:
        return DropReason.DUPLICATE_EVENT
    if not s.going_forward or s.cancel_reason is not None:
        return DropReason.NO_EVENT_WAIT
    wait = next(
        (
            w.event
            for w in s.event_waits.values()
            if w.event.source == inbound.source and w.event.key == inbound.key
        ),
        None,
    )
    if wait is None:
        return DropReason.NO_EVENT_WAIT
    check_storable(inbound.payload, f"event {inbound.source}", "payload")
    return DomainEventReceived(
        at=inbound.at,
        wait_id=wait.wait_id,
        source=inbound.source,
        key=inbound.key,
        event_id=inbound.event_id,
        payload=inbound.payload,
    )


def _undo(s: SagaState, inbound: Undo) -> Event | DropReason:
    if inbound.command_id in s.undo_ids:
        return DropReason.UNDO_ANSWERED
    if s.past_pivot:
        # The one rule for a parent's compensation and a child's pivot: a child past its
        # pivot cannot be undone (cancelled, or its steps compensated), so it refuses,
        # recording nothing. The refusal fails the parent's compensation of the child,
        # which ends compensation_stuck: the parent never compensates past the child's
        # pivot (nor the steps before it) unless an operator skips that compensation.
        return DropReason.UNDO_PAST_PIVOT
    _check_texts("undo", reason=inbound.reason, parent_id=inbound.parent_id)
    return UndoRequested(
        at=inbound.at,
        command_id=inbound.command_id,
        parent_id=inbound.parent_id,
        reason=inbound.reason,
    )


def _stop(s: SagaState, inbound: Cancel | ForceCompensate) -> Event:
    """A cancel, or a forced compensation: both stop a run still going forward."""
    if not s.going_forward or s.cancel_reason is not None:
        what = "cancel" if isinstance(inbound, Cancel) else "force"
        raise InvalidTransition(
            f"saga {s.saga_id} is {s.status.value}: it is already undoing its "
            f"steps, so there is nothing to {what}"
        )
    if s.closing:
        # Its run ended: the saga ends once the steps its code gave up are undone.
        raise InvalidTransition(
            f"saga {s.saga_id}'s run has ended; the saga ends as soon as the "
            "compensations of the steps its code gave up are done, so there is nothing "
            f"left to {'cancel' if isinstance(inbound, Cancel) else 'force'}"
        )
    if s.past_pivot:
        what = "cancel" if isinstance(inbound, Cancel) else "forced compensation"
        raise PastPivot(
            f"saga {s.saga_id} is past its pivot (step {s.pivot_step!r} succeeded): it can "
            f"only go forward, so a {what} is refused; retry or skip a parked step instead"
        )
    _check_texts(input_name(inbound), reason=inbound.reason, principal=inbound.principal)
    if isinstance(inbound, Cancel):
        return CancelRequested(at=inbound.at, reason=inbound.reason, principal=inbound.principal)
    return CompensationForced(at=inbound.at, reason=inbound.reason, principal=inbound.principal)


def _resume(s: SagaState, inbound: Resume) -> Event:
    if s.status == SagaStatus.STEP_STUCK and s.stuck_steps:
        raise InvalidTransition(
            f"saga {s.saga_id} is step_stuck: the compensation of step(s) "
            f"{', '.join(map(repr, s.stuck_steps))}, which its code gave up, is stuck; "
            "retry it, or skip it once you have undone the step by hand"
        )
    if s.status == SagaStatus.STEP_STUCK and s.parked_steps:
        raise InvalidTransition(
            f"saga {s.saga_id} is step_stuck: step(s) "
            f"{', '.join(map(repr, sorted(s.parked_steps)))} could not succeed and wait "
            "for an operator; retry the step (with an edited command if need be) or skip "
            "it with a result"
        )
    if s.status == SagaStatus.STEP_STUCK:
        raise InvalidTransition(
            f"saga {s.saga_id} is step_stuck: the reply of step(s) "
            f"{', '.join(map(repr, s.held_steps()))} did not match; retry the step "
            "(its reply is checked again against the code deployed now) or skip it "
            "with a valid result"
        )
    _check_texts("resume", principal=inbound.principal, reason=inbound.reason)
    if s.status != SagaStatus.COMPENSATION_STUCK:
        raise InvalidTransition(
            f"saga {s.saga_id} is {s.status.value}; only a saga whose "
            "compensation is stuck (or that is parked as nondeterministic) can be resumed"
        )
    return SagaResumed(at=inbound.at, principal=inbound.principal, reason=inbound.reason)


def _key_queue(s: SagaState, inbound: KeyQueue) -> Event | DropReason:
    if _key_settled(s, inbound.key):
        return DropReason.KEY_SETTLED
    behind = tuple(inbound.behind)
    if s.key is not None and s.key.behind == behind:
        return DropReason.KEY_SETTLED  # queued behind the same sagas: nothing new
    _check_texts("key-queue", key=inbound.key, behind=",".join(behind))
    return KeyQueued(at=inbound.at, key=inbound.key, behind=list(behind), position=inbound.position)


def _key_grant(s: SagaState, inbound: KeyGrant) -> Event | DropReason:
    if _key_settled(s, inbound.key):
        return DropReason.KEY_SETTLED
    _check_texts("key-grant", key=inbound.key)
    return KeyAcquired(at=inbound.at, key=inbound.key)


def _key_settled(s: SagaState, key: str) -> bool:
    """The saga no longer waits for ``key``: it holds it, or its run has stopped (a
    cancel while it queued), or it is not limited by it at all."""
    if s.definition.concurrency is None or (s.key is not None and s.key.key != key):
        return True
    return (s.key is not None and s.key.held) or not s.going_forward or s.cancel_reason is not None


def _check_texts(what: str, **texts: str | None) -> None:
    """An input's texts (reason, principal, ids) must be storable too."""
    check_storable(texts, what)


def _check_child(s: SagaState, sender: str, event: CommandIssued | CompensationIssued) -> None:
    """A child's end (or its answer to an undo) answers only the step that started that
    child: anything else that can write to the inbox must not settle the step."""
    child = event.payload.get("saga_id")
    if sender != child:
        raise NotParent(
            str(child),
            s.saga_id,
            None,
            f"an answer to step {event.step!r} of saga "
            f"{s.saga_id} came from {sender!r}, not from its child {child!r}",
        )


def _reply_event(inbound: Reply, inflight: Sent) -> Event:
    """A reply as its event: accepted, or held as invalid (a success reply whose
    payload its step's model refuses, or that Postgres cannot store)."""
    compensation = type(inflight.event) is CompensationIssued
    step = inflight.event.step
    error = storable_copy(inbound.error) if inbound.error is not None else None
    if compensation or inbound.outcome != "success":
        # A refusal's details and error text are kept for the record; what Postgres
        # cannot store is written out as escapes rather than losing the reply.
        return ReplyReceived(
            at=inbound.at,
            step=step,
            command_id=inbound.command_id,
            outcome=inbound.outcome,
            compensation=compensation,
            payload=storable_copy(inbound.payload),
            error=error,
            timings=inbound.timings,
        )
    what = f"the reply of step {step!r}"
    try:
        check_storable(inbound.payload, what, "payload")
        if inflight.returns is not None:
            validate_payload(inflight.returns, inbound.payload, what, "payload")
    except InvalidPayload as invalid:
        return InvalidReplyReceived(
            at=inbound.at,
            step=step,
            command_id=inbound.command_id,
            payload=storable_copy(inbound.payload),
            unstorable=isinstance(invalid, UnstorableValue),
            error=ErrorInfo(
                type="InvalidReply",
                message=f"{invalid}; the reply is held and the step waits: retry it "
                "after a fix, or skip it with a valid result",
                step=step,
                details={"errors": invalid.errors},
            ),
        )
    return ReplyReceived(
        at=inbound.at,
        step=step,
        command_id=inbound.command_id,
        outcome="success",
        payload=inbound.payload,
        error=error,
        timings=inbound.timings,
    )


def _skip_event(s: SagaState, inbound: Skip) -> Event:
    _check_texts("skip", step=inbound.step, principal=inbound.principal, reason=inbound.reason)
    what = f"the result for step {inbound.step!r}"
    check_storable(inbound.payload, what, "result")
    if inbound.step in s.stuck_steps:  # (compensation_stuck, or a given-up step's)
        return StepSkipped(
            at=inbound.at,
            step=inbound.step,
            compensation=True,
            payload=inbound.payload,
            principal=inbound.principal,
            reason=inbound.reason,
        )
    # A step parked for an operator, or waiting for its reply.
    forward: ParkedStep | Sent | None = s.parked_steps.get(inbound.step)
    if forward is None and s.going_forward:
        forward = s.waiting_forward(inbound.step)
    if forward is not None and s.cancel_reason is None:
        # The result stands in for the participant's reply: it must be what the
        # step's code would accept from the participant.
        if forward.returns is not None:
            validate_payload(forward.returns, inbound.payload, what, "result")
        return StepSkipped(
            at=inbound.at,
            step=inbound.step,
            payload=inbound.payload,
            principal=inbound.principal,
            reason=inbound.reason,
        )
    stuck = ", ".join(map(repr, s.stuck_steps))
    if stuck:
        stuck = f"; the stuck compensation{'s are' if len(s.stuck_steps) > 1 else ' is'} {stuck}"
    raise InvalidTransition(
        f"step {inbound.step!r} of saga {s.saga_id} ({s.status.value}) is neither "
        f"waiting for a reply nor a stuck compensation; steps waiting for a reply: "
        f"{s.steps_in_flight() or 'none'}{stuck}"
    )


def _retry_event(s: SagaState, inbound: RetryStep) -> Event:
    _check_texts("retry", step=inbound.step, principal=inbound.principal, reason=inbound.reason)
    parked = s.parked_steps.get(inbound.step)
    if parked is not None and s.cancel_reason is None:
        return RetryRequested(
            at=inbound.at,
            step=inbound.step,
            principal=inbound.principal,
            reason=inbound.reason,
            command=_edited(parked, inbound),
        )
    if inbound.command is not None:
        raise InvalidTransition(
            f"step {inbound.step!r} of saga {s.saga_id} ({s.status.value}) is not parked: "
            "an edited command is only for a step parked after it could not succeed; "
            f"parked steps: {sorted(s.parked_steps) or 'none'}"
        )
    held = s.waiting_forward(inbound.step)
    stuck = inbound.step in s.stuck_steps  # (compensation_stuck, or a given-up step's)
    if held is not None and held.held is not None and s.cancel_reason is None:
        problem = _held_problem(held)
        if problem is not None:
            raise InvalidTransition(problem)
    # A command awaiting its reply is re-sent, same id (the runtime's decision carries it).
    elif not (stuck or s.retry_timer(inbound.step) is not None or s.awaiting_reply(inbound.step)):
        raise InvalidTransition(
            f"step {inbound.step!r} of saga {s.saga_id} ({s.status.value}) can be neither "
            "retried nor re-sent (not in a back-off, parked, stuck or waiting for a reply); "
            f"retry or re-send one of {s.steps_in_flight() + sorted(s.parked_steps) or 'none'}"
            ", or skip the step with its result, or cancel the saga"
        )
    return RetryRequested(
        at=inbound.at, step=inbound.step, principal=inbound.principal, reason=inbound.reason
    )


def _edited(parked: ParkedStep, inbound: RetryStep) -> JsonDict | None:
    """The operator's edited command, as the step's command model reads it (defaults
    filled in), or None; InvalidPayload naming each wrong field."""
    if inbound.command is None:
        return None
    what = f"the edited command of step {inbound.step!r}"
    check_storable(inbound.command, what, "command")
    if parked.command_model is None:
        return inbound.command
    return model_payload(validate_payload(parked.command_model, inbound.command, what, "command"))


def _held_problem(inflight: Sent) -> str | None:
    """Why a held reply still cannot be accepted by the code deployed now, or None."""
    held = inflight.held
    assert held is not None
    step = held.step
    if held.unstorable:
        return (
            f"the reply of step {step!r} held a value Postgres cannot store, so it cannot "
            "be accepted as it came; skip the step with a corrected result"
        )
    if inflight.returns is None:
        return None
    try:
        validate_payload(
            inflight.returns, held.payload, f"the held reply of step {step!r} still", "payload"
        )
    except InvalidPayload as exc:
        return (
            f"{exc} (with the code deployed here); deploy a fix first, or skip the step "
            "with a valid result"
        )
    return None


_TO_EVENT: dict[type, Callable[[SagaState, Any], Event | DropReason]] = {
    Reply: _reply,
    TimerDue: _timer_due,
    SignalInput: _signal,
    Undo: _undo,
    Cancel: _stop,
    ForceCompensate: _stop,
    Skip: _skip_event,
    RetryStep: _retry_event,
    Resume: _resume,
    EventInput: _domain_event,
    CallbackInput: callback_event,
    UpdateInput: update_event,
    KeyQueue: _key_queue,
    KeyGrant: _key_grant,
}


# --------------------------------------------------------------------------- event -> code


def apply_input(s: SagaState, event: Event) -> None:
    """A recorded input (live or replayed) folded into the saga's state (``Fold.apply``'s
    handler), then what it does to the saga's code, given what the fold says it settled
    (the reply or timer it answered...). Raises Halt when the code deployed cannot take
    it (the saga is parked).

    Both looked up at once (``_WAYS``): one look-up and one call per input where the
    fold's ``apply`` and a function of its own for the code were two of each (replay's
    rebuild 44,369 -> 43,974 instructions per event, callgrind inside the replay loop:
    bench/README.md, "Replay cuts, second round")."""
    fold, to_code = _WAYS.get(type(event), _NEITHER)
    settled = fold(s, event) if fold is not None else None
    if to_code is not None:
        to_code(s, event, settled)


def _started_to_code(s: SagaState, event: SagaStarted, settled: Settled) -> None:
    s.trace_context = event.trace_context  # (the start's own: read, never written)
    s.lifecycle = s.loop.create_task(run_lifecycle(s, event))


def _answer_to_code(
    s: SagaState, event: ReplyReceived | AttemptTimedOut | InvalidReplyReceived, settled: Settled
) -> None:
    if not isinstance(settled, Sent) or settled.future is None or settled.future.done():
        s.nondeterministic(
            s.cursor - 1,
            event.describe(),
            f"no command {event.command_id} waiting ({s.describe_waiting()})",
        )
        raise Halt
    # A held reply answers nothing yet: the step waits for an operator. (``type() is``
    # rather than isinstance: see ``SagaRuntime.handle``.)
    if type(event) is not InvalidReplyReceived:
        settled.future.set_result(event if type(event) is ReplyReceived else None)


def _timer_to_code(s: SagaState, event: TimerFired, settled: Settled) -> None:
    if event.timer_id == DEADLINE_TIMER:
        request_cancel(s, "deadline", "the saga's deadline passed")
    else:
        _fire(settled)


def _fire(settled: Settled) -> None:
    if isinstance(settled, Timer) and settled.future is not None and not settled.future.done():
        settled.future.set_result(None)


def _signal_to_code(s: SagaState, event: SignalReceived, settled: Settled) -> None:
    waiter = s.signal_waiters.get(event.name)
    if waiter is not None and not waiter.done():
        waiter.set_result(event.payload)
    else:
        s.signals = owned(s.signals)
        s.signals.setdefault(event.name, deque()).append(event.payload)


def _event_to_code(s: SagaState, event: DomainEventReceived, settled: Settled) -> None:
    if not isinstance(settled, EventWait) or settled.future is None or settled.future.done():
        s.nondeterministic(
            s.cursor - 1, event.describe(), f"no wait for it ({s.describe_waiting()})"
        )
        raise Halt
    settled.future.set_result(event.payload)


def _skip_to_code(s: SagaState, event: StepSkipped, settled: Settled) -> None:
    if isinstance(settled, ParkedStep):
        _answer_parked(settled, event)
    elif event.compensation:
        unblock_compensation(s, "skip", event.step)
    elif isinstance(settled, Sent) and settled.future is not None and not settled.future.done():
        answer_waiting_step(s, settled, event.payload, by_operator=True)


def _answer_parked(parked: ParkedStep, event: RetryRequested | StepSkipped) -> None:
    """An operator's retry or skip of a parked step: the step's code goes on with it."""
    if parked.future is not None and not parked.future.done():
        parked.future.set_result(event)


def _retry_to_code(s: SagaState, event: RetryRequested, settled: Settled) -> None:
    if isinstance(settled, ParkedStep):
        _answer_parked(settled, event)
    elif isinstance(settled, Sent) and settled.held is not None:
        # Checked again against the code running now (live it passed, or it would not
        # have been recorded): a retry recorded under a fixed deploy does not replay
        # under the broken one, and says so.
        problem = _held_problem(settled)
        if problem is not None:
            s.nondeterministic(
                s.cursor - 1, f"{event.describe()}, accepting its held reply", problem
            )
            raise Halt
        answer_waiting_step(s, settled, settled.held.payload, by_operator=False)
    elif settled is Unstuck.COMPENSATION:
        unblock_compensation(s, "retry", event.step)
    else:
        _fire(settled)


_TO_CODE: dict[type[Event], Callable[[SagaState, Any, Settled], None]] = {
    SagaStarted: _started_to_code,
    ReplyReceived: _answer_to_code,
    AttemptTimedOut: _answer_to_code,
    InvalidReplyReceived: _answer_to_code,
    TimerFired: _timer_to_code,
    SignalReceived: _signal_to_code,
    DomainEventReceived: _event_to_code,
    CallbackReceived: callback_to_code,
    CancelRequested: lambda s, e, _: request_cancel(s, "cancel", e.reason),
    UndoRequested: lambda s, e, _: request_undo(s, e.parent_id, e.reason),
    CompensationForced: lambda s, e, _: request_cancel(
        s, "forced", f"forced by {e.principal}: {e.reason}"
    ),
    StepSkipped: _skip_to_code,
    RetryRequested: _retry_to_code,
    SagaResumed: lambda s, e, _: unblock_compensation(s, "retry"),
    UpdateReceived: update_to_code,
    KeyAcquired: lambda s, e, _: _key_to_code(s),
}


#: Each kind of event's fold and what it does to the code (None: nothing).
_WAYS: dict[
    type[Event],
    tuple[Callable[[Any, Any], Settled] | None, Callable[[SagaState, Any, Settled], None] | None],
] = {kind: (FOLD_HANDLERS.get(kind), _TO_CODE.get(kind)) for kind in {*FOLD_HANDLERS, *_TO_CODE}}
_NEITHER = (None, None)


def _key_to_code(s: SagaState) -> None:
    if s.key_waiter is not None and not s.key_waiter.done():
        s.key_waiter.set_result(None)
