"""An input's way into a saga: checked into its event, then applied to the saga's state.

:func:`to_event` is the edge: an input that makes no sense where the saga stands, or
that holds what the saga cannot accept, raises (``InvalidTransition``,
``InvalidPayload``) before anything is recorded; one that changes nothing (a duplicate
reply, a stale timer) is dropped with its reason; anything else becomes the event to
record. :func:`apply` is what a recorded input does to the state, live or replayed: the
futures the code waits on resolved, timers fired, a cancel requested, an operator's
skip or retry. The caller (``SagaRuntime``) then runs the code until it waits.
"""

from __future__ import annotations

from collections import deque

from saga_engine.core._decision import (
    CHILD_PARTICIPANT,
    DEADLINE_TIMER,
    Cancel,
    DropReason,
    ForceCompensate,
    Inbound,
    Reply,
    Resume,
    RetryStep,
    SignalInput,
    Skip,
    TimerDue,
    Undo,
)
from saga_engine.core._events import (
    AttemptTimedOut,
    CancelRequested,
    CommandIssued,
    CompensationForced,
    CompensationIssued,
    ErrorInfo,
    Event,
    InvalidReplyReceived,
    ReplyReceived,
    RetryRequested,
    SagaResumed,
    SagaStarted,
    SignalReceived,
    StepSkipped,
    TimerFired,
    UndoRequested,
)
from saga_engine.core._operations import (
    release,
    request_cancel,
    request_undo,
    run_lifecycle,
    unblock_compensation,
)
from saga_engine.core._state import (
    Halt,
    InFlight,
    PendingTimer,
    SagaState,
    timeout_timer_id,
    with_id,
)
from saga_engine.core._status import SagaStatus
from saga_engine.kernel._errors import InvalidPayload, InvalidTransition, NotParent, UnstorableValue
from saga_engine.kernel._serde import check_storable, storable_copy, validate_payload

_INPUT_NAMES = {
    SignalInput: "signal", Cancel: "cancel", ForceCompensate: "force-compensate",
    Skip: "skip", RetryStep: "retry", Resume: "resume", Reply: "reply", TimerDue: "timer",
    Undo: "undo",
}  # fmt: skip


def input_name(inbound: Inbound) -> str:
    """An input's name in messages, as operators know the actions."""
    return _INPUT_NAMES.get(type(inbound), type(inbound).__name__.lower())


# --------------------------------------------------------------------------- input -> event


def check_parent(saga_id: str, started: Event, parent_id: str, *, undo: bool) -> None:
    """Only a child's own parent, as its first event records it, may undo it or start it
    again: anything else that can write to the inbox must not touch the saga."""
    assert isinstance(started, SagaStarted)
    recorded = started.parent.saga_id if started.parent is not None else None
    if recorded is None and undo:
        raise InvalidTransition(
            f"saga {saga_id} was not started by another saga: only a child is "
            "undone by its parent (cancel it instead)"
        )
    if recorded != parent_id:
        raise NotParent(saga_id, parent_id, recorded)


def to_event(s: SagaState, inbound: Inbound) -> Event | DropReason:
    """The event that records ``inbound``, or why it is dropped; raises if it is refused."""
    at = inbound.at
    if s.dead:
        # Replies and timers are dropped: on resume, outstanding commands are re-sent
        # under the same ids (participants repeat their stored replies) and timers are
        # re-armed. Signals and cancels are refused, so their sender knows; recording
        # them here would put inputs in the history that no code reacted to.
        if isinstance(inbound, Resume):
            if s.nondeterminism is not None:
                raise InvalidTransition(
                    f"saga {s.saga_id} still cannot be driven by the code deployed here "
                    f"({s.nondeterminism}); deploy code that replays its history, then resume"
                )
            _check_texts("resume", principal=inbound.principal, reason=inbound.reason)
            return SagaResumed(at=at, principal=inbound.principal, reason=inbound.reason)
        if isinstance(inbound, SignalInput | Cancel | ForceCompensate | Skip | RetryStep):
            raise InvalidTransition(
                f"saga {s.saga_id} is parked as nondeterministic; resume it after "
                f"deploying a fix before sending it a {input_name(inbound)}"
            )
        return DropReason.PARKED
    if isinstance(inbound, Reply):
        inflight = s.inflight.get(inbound.command_id)
        if inflight is None:
            if inbound.command_id in s.issued_ids:
                return DropReason.DUPLICATE_REPLY
            return DropReason.UNKNOWN_COMMAND
        if inflight.held is not None:
            return DropReason.DUPLICATE_REPLY  # answered already; its reply is held
        if inbound.sender is not None and inflight.event.participant == CHILD_PARTICIPANT:
            _check_child(s, inbound.sender, inflight.event)
        return _reply_event(inbound, inflight)
    if isinstance(inbound, TimerDue):
        timer = s.timers.get(inbound.timer_id)
        if timer is None:
            return DropReason.STALE_TIMER
        if timer.command_id is not None:
            cmd = s.inflight[timer.command_id].event
            return AttemptTimedOut(
                at=at,
                step=cmd.step,
                command_id=cmd.command_id,
                attempt=cmd.attempt,
                compensation=isinstance(cmd, CompensationIssued),
            )
        return TimerFired(at=at, timer_id=inbound.timer_id)
    if isinstance(inbound, SignalInput):
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
            "signal", signal_id=inbound.signal_id, principal=inbound.principal,
            reason=inbound.reason,
        )  # fmt: skip
        return SignalReceived(
            at=at,
            signal_id=inbound.signal_id,
            name=inbound.name,
            payload=inbound.payload,
            principal=inbound.principal,
            reason=inbound.reason,
        )
    if isinstance(inbound, Undo):
        if inbound.command_id in s.undo_ids:
            return DropReason.UNDO_ANSWERED
        _check_texts("undo", reason=inbound.reason, parent_id=inbound.parent_id)
        return UndoRequested(
            at=at, command_id=inbound.command_id, parent_id=inbound.parent_id,
            reason=inbound.reason,
        )  # fmt: skip
    if isinstance(inbound, Cancel):
        if not s.going_forward or s.cancel_reason is not None:
            raise InvalidTransition(
                f"saga {s.saga_id} is {s.status.value}: it is already undoing its "
                "steps, so there is nothing to cancel"
            )
        _check_texts("cancel", reason=inbound.reason, principal=inbound.principal)
        return CancelRequested(at=at, reason=inbound.reason, principal=inbound.principal)
    if isinstance(inbound, ForceCompensate):
        if not s.going_forward or s.cancel_reason is not None:
            raise InvalidTransition(
                f"saga {s.saga_id} is {s.status.value}: it is already undoing its "
                "steps, so there is nothing to force"
            )
        _check_texts("force-compensate", reason=inbound.reason, principal=inbound.principal)
        return CompensationForced(at=at, reason=inbound.reason, principal=inbound.principal)
    if isinstance(inbound, Skip):
        return _skip_event(s, inbound)
    if isinstance(inbound, RetryStep):
        return _retry_event(s, inbound)
    if isinstance(inbound, Resume):
        if s.status == SagaStatus.STEP_STUCK:
            raise InvalidTransition(
                f"saga {s.saga_id} is step_stuck: the reply of step(s) "
                f"{', '.join(map(repr, held_steps(s)))} did not match; retry the step "
                "(its reply is checked again against the code deployed now) or skip it "
                "with a valid result"
            )
        _check_texts("resume", principal=inbound.principal, reason=inbound.reason)
        if s.status != SagaStatus.COMPENSATION_STUCK:
            raise InvalidTransition(
                f"saga {s.saga_id} is {s.status.value}; only a saga whose "
                "compensation is stuck (or that is parked as nondeterministic) can be resumed"
            )
        return SagaResumed(at=at, principal=inbound.principal, reason=inbound.reason)
    raise TypeError(f"unknown input {inbound!r}")


def held_steps(s: SagaState) -> list[str]:
    """Steps whose success reply was held as invalid, waiting for an operator."""
    return sorted({f.event.step for f in s.inflight.values() if f.held is not None})


def _check_texts(what: str, **texts: str | None) -> None:
    """An input's texts (reason, principal, ids) must be storable too."""
    check_storable(texts, what)


def _check_child(s: SagaState, sender: str, event: CommandIssued | CompensationIssued) -> None:
    """A child's end (or its answer to an undo) answers only the step that started that
    child: anything else that can write to the inbox must not settle the step."""
    child = event.payload.get("saga_id")
    if sender != child:
        raise NotParent(
            str(child), s.saga_id, None, f"an answer to step {event.step!r} of saga "
            f"{s.saga_id} came from {sender!r}, not from its child {child!r}",
        )  # fmt: skip


def _reply_event(inbound: Reply, inflight: InFlight) -> Event:
    """A reply as its event: accepted, or held as invalid (a success reply whose
    payload its step's model refuses, or that Postgres cannot store)."""
    compensation = isinstance(inflight.event, CompensationIssued)
    step = inflight.event.step
    error = storable_copy(inbound.error) if inbound.error is not None else None
    if compensation or inbound.outcome != "success":
        # A refusal's details and error text are kept for the record; what Postgres
        # cannot store is written out as escapes rather than losing the reply.
        return ReplyReceived(
            at=inbound.at, step=step, command_id=inbound.command_id,
            outcome=inbound.outcome, compensation=compensation,
            payload=storable_copy(inbound.payload), error=error,
        )  # fmt: skip
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
        at=inbound.at, step=step, command_id=inbound.command_id, outcome="success",
        payload=inbound.payload, error=error,
    )  # fmt: skip


def _skip_event(s: SagaState, inbound: Skip) -> Event:
    _check_texts("skip", step=inbound.step, principal=inbound.principal, reason=inbound.reason)
    what = f"the result for step {inbound.step!r}"
    check_storable(inbound.payload, what, "result")
    if s.status == SagaStatus.COMPENSATION_STUCK and s.stuck_step == inbound.step:
        return StepSkipped(
            at=inbound.at, step=inbound.step, compensation=True, payload=inbound.payload,
            principal=inbound.principal, reason=inbound.reason,
        )  # fmt: skip
    forward = s.waiting_forward(inbound.step)
    if s.going_forward and forward is not None and s.cancel_reason is None:
        # The result stands in for the participant's reply: it must be what the
        # step's code would accept from the participant.
        if forward.returns is not None:
            validate_payload(forward.returns, inbound.payload, what, "result")
        return StepSkipped(
            at=inbound.at, step=inbound.step, payload=inbound.payload,
            principal=inbound.principal, reason=inbound.reason,
        )  # fmt: skip
    stuck = f"; the stuck compensation is {s.stuck_step!r}" if s.stuck_step else ""
    raise InvalidTransition(
        f"step {inbound.step!r} of saga {s.saga_id} ({s.status.value}) is neither "
        f"waiting for a reply nor a stuck compensation; steps waiting for a reply: "
        f"{s.steps_in_flight() or 'none'}{stuck}"
    )


def _retry_event(s: SagaState, inbound: RetryStep) -> Event:
    _check_texts("retry", step=inbound.step, principal=inbound.principal, reason=inbound.reason)
    held = s.waiting_forward(inbound.step)
    if held is not None and held.held is not None and s.cancel_reason is None:
        problem = _held_problem(held)
        if problem is not None:
            raise InvalidTransition(problem)
        return RetryRequested(
            at=inbound.at, step=inbound.step, principal=inbound.principal,
            reason=inbound.reason,
        )  # fmt: skip
    waiting = s.status == SagaStatus.COMPENSATION_STUCK and s.stuck_step == inbound.step
    if waiting or s.retry_timer(inbound.step) is not None:
        return RetryRequested(
            at=inbound.at, step=inbound.step, principal=inbound.principal,
            reason=inbound.reason,
        )  # fmt: skip
    raise InvalidTransition(
        f"step {inbound.step!r} of saga {s.saga_id} ({s.status.value}) is not waiting "
        f"to retry; steps waiting for a reply: {s.steps_in_flight() or 'none'}"
    )


def _held_problem(inflight: InFlight) -> str | None:
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


# --------------------------------------------------------------------------- event -> state


def apply(s: SagaState, event: Event) -> None:
    """What a recorded input does to the state (live or replayed). Raises Halt when the
    code deployed cannot take it (the saga is parked)."""
    if isinstance(event, SagaStarted):
        s.trace_context = dict(event.trace_context)
        if event.deadline_at is not None:
            s.timers[DEADLINE_TIMER] = PendingTimer(fire_at=event.deadline_at)
        s.lifecycle = s.loop.create_task(run_lifecycle(s, event))
    elif isinstance(event, ReplyReceived | AttemptTimedOut | InvalidReplyReceived):
        inflight = s.inflight.get(event.command_id)
        if inflight is None or inflight.future.done():
            s.nondeterministic(
                s.cursor - 1,
                event.describe(),
                f"no command {event.command_id} waiting ({s.describe_waiting()})",
            )
            raise Halt
        if isinstance(event, InvalidReplyReceived):
            # The step keeps waiting, for an operator now: its attempt no longer times
            # out (the participant did answer), and nothing re-sends it.
            inflight.held = event
            s.timers.pop(timeout_timer_id(event.command_id, inflight.event.attempt), None)
        else:
            inflight.future.set_result(event if isinstance(event, ReplyReceived) else None)
    elif isinstance(event, TimerFired):
        timer = s.timers.pop(event.timer_id, None)
        if event.timer_id == DEADLINE_TIMER:
            request_cancel(s, "deadline", "the saga's deadline passed")
        elif timer is not None and timer.future is not None and not timer.future.done():
            timer.future.set_result(None)
    elif isinstance(event, SignalReceived):
        s.seen_signals = with_id(s.seen_signals, event.signal_id)
        waiter = s.signal_waiters.get(event.name)
        if waiter is not None and not waiter.done():
            waiter.set_result(event.payload)
        else:
            s.signals.setdefault(event.name, deque()).append(event.payload)
    elif isinstance(event, CancelRequested):
        request_cancel(s, "cancel", event.reason)
    elif isinstance(event, UndoRequested):
        request_undo(s, event.parent_id, event.reason)
    elif isinstance(event, CompensationForced):
        request_cancel(s, "forced", f"forced by {event.principal}: {event.reason}")
    elif isinstance(event, StepSkipped):
        _apply_skip(s, event)
    elif isinstance(event, RetryRequested):
        held = s.waiting_forward(event.step)
        if held is not None and held.held is not None:
            # Checked again against the code running now (live it passed, or it would
            # not have been recorded): a retry recorded under a fixed deploy does not
            # replay under the broken one, and says so.
            problem = _held_problem(held)
            if problem is not None:
                s.nondeterministic(
                    s.cursor - 1, f"{event.describe()}, accepting its held reply", problem
                )
                raise Halt
            release(s, held, held.held.payload, by_operator=False)
        elif s.stuck_step == event.step and s.resume_waiter is not None:
            unblock_compensation(s, "retry")
        else:
            timer_id = s.retry_timer(event.step)
            timer = s.timers.pop(timer_id) if timer_id else None
            if timer is not None and timer.future is not None and not timer.future.done():
                timer.future.set_result(None)
    elif isinstance(event, SagaResumed):
        unblock_compensation(s, "retry")


def _apply_skip(s: SagaState, event: StepSkipped) -> None:
    if event.compensation:
        unblock_compensation(s, "skip")
        return
    for inflight in list(s.inflight.values()):
        if inflight.event.step == event.step and not inflight.future.done():
            release(s, inflight, event.payload, by_operator=True)
            return
