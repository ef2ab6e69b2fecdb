"""History events: every fact about a saga, immutable msgspec structs (``_structs``).

Events come in two families, and replay treats them differently:

- **Intents** are what the saga's code (or the engine's own lifecycle code running
  beside it) decided to do: issue a command, start a timer, record a side effect,
  begin compensating, finish. On replay the code runs again and each intent it
  produces is *matched* against the recorded one; a difference is nondeterminism.
- **Inputs** are what happened to the saga from outside: it was started, a reply
  arrived, a timer fired, a signal or a cancel request came in, an operator acted.
  On replay they are *delivered* again, in their recorded order.
"""

from __future__ import annotations

from datetime import datetime
from types import GenericAlias
from typing import Any, ClassVar, Final, Literal, Union

import msgspec
from pydantic import BaseModel, ConfigDict

from saga_engine.core.history._event_versions import UPCASTERS, VERSION_KEY, EventVersions
from saga_engine.core.history._policy import RetryPolicy
from saga_engine.core.history._structs import (
    RawJson,
    Record,
    decoder,
    encode,
    from_data,
    to_data,
    written,
    written_empty,
)
from saga_engine.kernel._errors import DefinitionError
from saga_engine.kernel._serde import JsonDict, canonical_hash, loads

# What events carry: an error as it is stored, a step's compensation, and the links a
# start records (its parent, the trigger record, the saga it re-runs). The links stay
# pydantic models: the wire's ``StartBody`` carries and validates them too.


class ErrorInfo(Record, frozen=True, kw_only=True):
    """An error as it is stored: enough to explain what happened, no traceback."""

    type: str
    message: str
    step: str | None = None
    details: JsonDict = msgspec.field(default_factory=dict)


class CompensationSpec(Record, frozen=True, kw_only=True):
    """The compensation a forward step carries, recorded with the step's command."""

    participant: str
    command_type: str
    payload: JsonDict
    retry: RetryPolicy
    timeout_s: float | None = None


class ParentLink(BaseModel):
    """The parent of a child saga: which saga started it, with which command (the child's
    end is that command's reply)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    saga_id: str
    command_id: str
    saga_type: str = ""


class RerunLink(BaseModel):
    """The saga an operator re-ran (``saga rerun``): a new saga of the same type, with
    the same or an edited input, linked to the original for the lineage."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    saga_id: str
    principal: str = "system"
    reason: str = ""


class TriggerOrigin(BaseModel):
    """The Kafka record a trigger started the saga from, to trace it back to its cause."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    topic: str
    partition: int
    offset: int


def absent(value: object) -> bool:
    """A field left out of the stored shape when it holds nothing (``exclude_if``)."""
    return value is None


class ReplyTimings(Record, frozen=True, kw_only=True, omit_defaults=True):
    """When a reply's command left the engine and what the participant did with it, as
    the reply's timing headers said (PROTOCOL.md section 7.4a): each figure optional (a
    kit may send none), each left out of the stored shape when absent. The engine's own
    figure is ``sent_at`` (echoed back); the others are the participant's clock."""

    #: The command left the engine (after any hold by flow control): ``ce_senttime``.
    sent_at: datetime | None = None
    #: The participant read the command: ``ce_receivedtime``.
    received_at: datetime | None = None
    #: Its handler started and ended: ``ce_handlerstarttime``, ``ce_handlerendtime``.
    handler_started_at: datetime | None = None
    handler_ended_at: datetime | None = None
    #: Its transaction committed: ``ce_committime``.
    committed_at: datetime | None = None
    #: The handler's CPU time in milliseconds: ``ce_handlercpums``.
    handler_cpu_ms: float | None = None


class _Event(Record, frozen=True, kw_only=True, tag_field="kind"):
    """An event: a record whose kind is its type's tag (``tag=``, written first, under
    ``"kind"``), which its ``kind`` class attribute says again for readers and mypy."""

    kind: ClassVar[str]
    #: The shape's version: raise it when the stored shape changes, and register an
    #: upcaster from the previous one in ``_event_versions.UPCASTERS``.
    version: ClassVar[int] = 1

    #: Whether the code produces it (an intent, matched on replay) rather than an input.
    #: A class attribute, not a property: the replay reads it per event.
    is_intent: ClassVar[bool] = False

    at: datetime

    def signature(self) -> tuple[Any, ...]:
        """What must be equal for a replayed intent to match the recorded one."""
        return (self.kind,)

    def describe(self) -> str:
        """A short human description, used in nondeterminism errors and the CLI."""
        return self.kind


class _Intent(_Event, frozen=True, kw_only=True):
    is_intent: ClassVar[bool] = True


# --------------------------------------------------------------------------- inputs


class SagaStarted(_Event, frozen=True, kw_only=True, tag="saga_started", omit_defaults=True):
    #: 2: records ``saga_version`` (version 1 starts are upcast to ``saga_version=1``).
    version: ClassVar[int] = 2

    kind: ClassVar[Literal["saga_started"]] = "saga_started"
    saga_type: str
    #: As the input model read it, defaults filled in once (so a default_factory's value
    #: is the same on every replay).
    input: JsonDict
    idempotency_key: str | None = written(None)
    deadline_at: datetime | None = written(None)
    #: W3C trace context of the caller, so a recovered saga continues the same trace.
    trace_context: dict[str, str] = written_empty(dict)
    #: A digest of the start request as it was sent (the input fields given, as the model
    #: reads them): a repeated start with the same key must match it. None in histories
    #: recorded before it existed.
    request_hash: str | None = written(None)
    #: Set when another saga started this one with ``ctx.child``: its end is the reply to
    #: the parent's command. None for a saga started by a client, a trigger or the API.
    parent: ParentLink | None = written(None)
    #: The trigger record that started it, when a trigger did.
    trigger: TriggerOrigin | None = written(None)
    #: The version of its saga type the start chose (``Saga.version``, by the rollout):
    #: the saga runs that class for its whole life, replay included.
    saga_version: int = written(1)
    #: Flow control (``_flow.py``): when a limit holds commands back, a higher priority
    #: goes first (aging lifts a waiting one); the fairness key (a tenant) takes turns
    #: with the others. Neither changes what the saga does, only when it is sent.
    priority: int = written(0)
    fairness_key: str | None = written(None)
    #: Set when an operator re-ran another saga (``saga rerun``): the saga re-run, for the
    #: lineage. Left out of the stored shape when None (every other start).
    rerun_of: RerunLink | None = None
    #: The flow policy its commands are sent under (``LimitsSettings.policies``), chosen
    #: at start by the flow-policy rollout; None: version 1 (and left out of the stored
    #: shape, as in every history before policies). Like priority, it changes only when
    #: a command is sent, never what the saga does.
    flow_policy: int | None = None


class ReplyReceived(_Event, frozen=True, kw_only=True, tag="reply_received", omit_defaults=True):
    kind: ClassVar[Literal["reply_received"]] = "reply_received"
    step: str
    command_id: str
    #: success: applied; failure: refused, nothing applied; retryable: not applied, try again.
    outcome: Literal["success", "failure", "retryable"]
    compensation: bool = written(False)
    payload: JsonDict = written_empty(dict)
    error: str | None = written(None)
    #: The reply's timing headers (the participant's figures, and when its command left
    #: the engine), for insights; left out of the stored shape when it had none.
    timings: ReplyTimings | None = None

    def describe(self) -> str:
        what = "compensation reply" if self.compensation else "reply"
        return f"{what} {self.outcome} for step {self.step!r}"


class InvalidReplyReceived(_Event, frozen=True, kw_only=True, tag="invalid_reply_received"):
    """A participant answered a forward step with success, but its payload does not match
    the step's reply model (``returns=``), or holds a value Postgres cannot store.

    The reply is kept here (``payload``; values Postgres cannot store written out as
    escapes, with ``unstorable`` set), the step keeps waiting and the saga parks as
    ``step_stuck``. Nothing is compensated because of it: an operator retries the step
    (the held reply is checked again against the code deployed now), skips it with a
    valid result, or cancels the saga (the step's compensation is then owed: the
    participant did apply it).
    """

    kind: ClassVar[Literal["invalid_reply_received"]] = "invalid_reply_received"
    step: str
    command_id: str
    payload: JsonDict = msgspec.field(default_factory=dict)
    #: The payload could not be stored as it came: ``payload`` is an escaped rendering,
    #: so only a skip (with a corrected result) can answer the step.
    unstorable: bool = False
    #: Why the reply was not accepted: its validation errors are in ``details``.
    error: ErrorInfo

    def describe(self) -> str:
        return f"invalid reply for step {self.step!r} held"


class AttemptTimedOut(_Event, frozen=True, kw_only=True, tag="attempt_timed_out"):
    kind: ClassVar[Literal["attempt_timed_out"]] = "attempt_timed_out"
    step: str
    command_id: str
    attempt: int
    compensation: bool = False

    def describe(self) -> str:
        return f"attempt {self.attempt} of step {self.step!r} timed out"


class TimerFired(_Event, frozen=True, kw_only=True, tag="timer_fired"):
    kind: ClassVar[Literal["timer_fired"]] = "timer_fired"
    timer_id: str

    def describe(self) -> str:
        return f"timer {self.timer_id!r} fired"


class SignalReceived(_Event, frozen=True, kw_only=True, tag="signal_received"):
    kind: ClassVar[Literal["signal_received"]] = "signal_received"
    signal_id: str
    name: str
    payload: JsonDict = msgspec.field(default_factory=dict)
    #: Who sent it and why (an operator's signal is audited like the other actions).
    principal: str = "system"
    reason: str = ""

    def describe(self) -> str:
        return f"signal {self.name!r} received"


class DomainEventReceived(_Event, frozen=True, kw_only=True, tag="domain_event_received"):
    """A domain event another service published (an ``EventSource``'s fact) answered
    the saga's wait ``wait_id`` for it; ``event_id`` keeps a fact from answering twice."""

    kind: ClassVar[Literal["domain_event_received"]] = "domain_event_received"
    wait_id: str
    source: str
    key: str
    event_id: str
    payload: JsonDict = msgspec.field(default_factory=dict)

    def describe(self) -> str:
        return f"event {self.source} key={self.key} received"


class CallbackReceived(_Event, frozen=True, kw_only=True, tag="callback_received"):
    """A third party answered the callback wait ``wait_id`` on its signed URL
    (``ctx.callback``): ``payload`` is its body, checked by the wait's model; ``failed``:
    it posted to the ``/fail`` URL. ``digest`` is the body's (and ``failed``'s) hash: the
    same call again gets the same answer, another one a conflict."""

    kind: ClassVar[Literal["callback_received"]] = "callback_received"
    wait_id: str
    payload: JsonDict = msgspec.field(default_factory=dict)
    failed: bool = False
    digest: str

    def describe(self) -> str:
        return f"callback {self.wait_id!r} {'failed' if self.failed else 'received'}"


class UpdateReceived(_Event, frozen=True, kw_only=True, tag="update_received"):
    """An update (``@update``) accepted by its input model and its validator: its handler
    runs on the saga's state right after it, and its result follows (``update_completed``)."""

    kind: ClassVar[Literal["update_received"]] = "update_received"
    update_id: str
    name: str
    payload: JsonDict = msgspec.field(default_factory=dict)
    principal: str = "system"
    reason: str = ""

    def describe(self) -> str:
        return f"update {self.name!r} received"


class CancelRequested(_Event, frozen=True, kw_only=True, tag="cancel_requested"):
    kind: ClassVar[Literal["cancel_requested"]] = "cancel_requested"
    reason: str
    principal: str = "system"


class UndoRequested(_Event, frozen=True, kw_only=True, tag="undo_requested"):
    """The parent saga compensates: this child undoes what it did. A running child is
    cancelled (it ends ``cancelled``); a completed one compensates its applied steps, last
    first (it ends ``compensated``). Its end answers the parent's compensation command."""

    kind: ClassVar[Literal["undo_requested"]] = "undo_requested"
    #: The parent's compensation command this undo answers.
    command_id: str
    parent_id: str
    reason: str = ""

    def describe(self) -> str:
        return f"undo requested by parent saga {self.parent_id}"


class CompensationForced(_Event, frozen=True, kw_only=True, tag="compensation_forced"):
    """An operator made the saga undo what it did so far (it ends compensated)."""

    kind: ClassVar[Literal["compensation_forced"]] = "compensation_forced"
    reason: str
    principal: str = "system"


class StepSkipped(_Event, frozen=True, kw_only=True, tag="step_skipped"):
    """An operator answered a step (or a stuck compensation) in the participant's place.

    A skipped forward step returns ``payload`` to the saga and is not compensated later:
    the operator took responsibility for its effect. A skipped compensation counts as done.
    """

    kind: ClassVar[Literal["step_skipped"]] = "step_skipped"
    step: str
    compensation: bool = False
    payload: JsonDict = msgspec.field(default_factory=dict)
    principal: str = "system"
    reason: str = ""

    def describe(self) -> str:
        what = "compensation of" if self.compensation else "step"
        return f"{what} {self.step!r} skipped by {self.principal}"


class RetryRequested(_Event, frozen=True, kw_only=True, tag="retry_requested", omit_defaults=True):
    """An operator asked a step waiting to retry (or a stuck compensation) to retry now."""

    kind: ClassVar[Literal["retry_requested"]] = "retry_requested"
    step: str
    principal: str = written("system")
    reason: str = written("")
    #: The operator's edited command for a parked step (checked against the step's
    #: command model), sent in place of the original, which stays in its command_issued.
    #: Left out of the stored shape when None.
    command: JsonDict | None = None

    def describe(self) -> str:
        edited = " with an edited command" if self.command is not None else ""
        return f"retry of {self.step!r}{edited} requested by {self.principal}"


class SagaParked(_Event, frozen=True, kw_only=True, tag="saga_parked"):
    """The engine stopped driving the saga because the code deployed cannot drive it: its
    history no longer matches (``nondeterministic``), or the code hit a definition error
    (``definition_error``: an undeclared signal, a step name used twice...). Either way
    the saga waits, untouched, for a fixed deploy and a resume."""

    kind: ClassVar[Literal["saga_parked"]] = "saga_parked"
    reason: Literal["nondeterministic", "definition_error"] = "nondeterministic"
    error: ErrorInfo


class SagaResumed(_Event, frozen=True, kw_only=True, tag="saga_resumed"):
    """An operator asked a parked saga to go on (after a fix, or to retry a compensation)."""

    kind: ClassVar[Literal["saga_resumed"]] = "saga_resumed"
    principal: str = "system"
    reason: str = ""


class KeyQueued(_Event, frozen=True, kw_only=True, tag="key_queued"):
    """The saga's concurrency key (``Saga.concurrency``) was at its limit when it asked:
    its run waits, FIFO per key, until the key is granted (docs/concurrency-keys.md)."""

    kind: ClassVar[Literal["key_queued"]] = "key_queued"
    key: str
    #: The sagas holding the key when it queued (what it is queued behind).
    behind: list[str] = msgspec.field(default_factory=list)
    #: Its place in the key's queue then (1: next to be granted).
    position: int = 1

    def describe(self) -> str:
        return f"queued for concurrency key {self.key!r}"


class KeyAcquired(_Event, frozen=True, kw_only=True, tag="key_acquired"):
    """The saga holds a slot of its concurrency key: its run begins now."""

    kind: ClassVar[Literal["key_acquired"]] = "key_acquired"
    key: str

    def describe(self) -> str:
        return f"concurrency key {self.key!r} acquired"


# --------------------------------------------------------------------------- intents


class _CommandIntent(_Intent, frozen=True, kw_only=True):
    """A command for a participant: a forward step's or a compensation's."""

    step: str
    participant: str
    command_type: str
    payload: JsonDict
    payload_hash: str
    command_id: str
    attempt: int
    #: Written even when None (``written``): ``CommandIssued`` leaves out only its own
    #: ``pivot`` and ``cost`` when they hold their defaults.
    timeout_at: datetime | None = written(None)

    def signature(self) -> tuple[Any, ...]:
        return (
            self.kind,
            self.step,
            self.participant,
            self.command_type,
            self.payload_hash,
            self.attempt,
        )


class CommandIssued(
    _CommandIntent, frozen=True, kw_only=True, tag="command_issued", omit_defaults=True
):
    """A forward step's command, committed before it is sent (the history is the outbox)."""

    kind: ClassVar[Literal["command_issued"]] = "command_issued"
    compensation: CompensationSpec | None = written(None)
    #: The saga's pivot step (``ctx.step(..., pivot=True)``); left out when False.
    pivot: bool = False
    #: What the command holds of its participant's budget while in flight (``Cost``'s
    #: amounts, a named class resolved); left out when it declares none.
    cost: dict[str, float] | None = None

    def describe(self) -> str:
        return (
            f"step {self.step!r} sending {self.command_type} to {self.participant!r} "
            f"(attempt {self.attempt}, payload {self.payload_hash[:8]})"
        )


class TimerStarted(_Intent, frozen=True, kw_only=True, tag="timer_started"):
    kind: ClassVar[Literal["timer_started"]] = "timer_started"
    timer_id: str
    purpose: Literal["sleep", "retry", "signal_timeout"]
    fire_at: datetime

    def signature(self) -> tuple[Any, ...]:
        return (self.kind, self.timer_id, self.purpose)

    def describe(self) -> str:
        return f"{self.purpose} timer {self.timer_id!r}"


class EventAwaited(_Intent, frozen=True, kw_only=True, tag="event_awaited"):
    """The code waits for a domain event of ``source`` whose correlation key is ``key``
    (``ctx.wait_event``), until ``timeout_at`` if it has one."""

    kind: ClassVar[Literal["event_awaited"]] = "event_awaited"
    wait_id: str
    source: str
    key: str
    timeout_at: datetime | None = None

    def signature(self) -> tuple[Any, ...]:
        return (self.kind, self.wait_id, self.source, self.key)

    def describe(self) -> str:
        return f"wait for event {self.source} key={self.key}"


class CallbackAwaited(_Intent, frozen=True, kw_only=True, tag="callback_awaited"):
    """The code made a callback URL (``ctx.callback``) and waits on it until
    ``expires_at`` (a durable timer named after the wait). ``key_id`` and ``base_url``
    are what the URL was signed with and where it points, recorded so that a replay
    derives the same URL; the URL's signature itself is never stored."""

    kind: ClassVar[Literal["callback_awaited"]] = "callback_awaited"
    wait_id: str
    name: str
    expires_at: datetime
    key_id: str
    base_url: str

    def signature(self) -> tuple[Any, ...]:
        return (self.kind, self.wait_id, self.name)

    def describe(self) -> str:
        return f"wait for callback {self.name!r}"


class SideEffectRecorded(_Intent, frozen=True, kw_only=True, tag="side_effect_recorded"):
    kind: ClassVar[Literal["side_effect_recorded"]] = "side_effect_recorded"
    op_id: str
    value: Any

    def signature(self) -> tuple[Any, ...]:
        return (self.kind, self.op_id)

    def describe(self) -> str:
        return f"side effect {self.op_id!r}"


class UpdateCompleted(_Intent, frozen=True, kw_only=True, tag="update_completed"):
    """What an update's handler returned (``result``), or the error it raised: the answer
    its caller gets, now and whenever it asks again with the same update id."""

    kind: ClassVar[Literal["update_completed"]] = "update_completed"
    update_id: str
    name: str
    result: Any = None
    error: ErrorInfo | None = None

    def signature(self) -> tuple[Any, ...]:
        return (self.kind, self.update_id, self.name)

    def describe(self) -> str:
        return f"update {self.name!r} {'failed' if self.error else 'completed'}"


class ProgressEmitted(_Intent, frozen=True, kw_only=True, tag="progress_emitted"):
    """A progress item the saga's code emitted (``ctx.emit``): ``number`` counts the
    saga's items from 1 with no gap, ``topic`` names the stream it belongs to and
    ``payload`` is what a client following the saga reads. Visible once committed;
    replay matches it and never records or publishes it again."""

    kind: ClassVar[Literal["progress_emitted"]] = "progress_emitted"
    number: int
    topic: str
    payload: Any

    def signature(self) -> tuple[Any, ...]:
        return (self.kind, self.number, self.topic)

    def describe(self) -> str:
        return f"progress #{self.number} on {self.topic!r}"


class PatchMarked(_Intent, frozen=True, kw_only=True, tag="patch_marked"):
    kind: ClassVar[Literal["patch_marked"]] = "patch_marked"
    patch_id: str

    def signature(self) -> tuple[Any, ...]:
        return (self.kind, self.patch_id)

    def describe(self) -> str:
        return f"patch marker {self.patch_id!r}"


class NodeSkipped(_Intent, frozen=True, kw_only=True, tag="node_skipped"):
    """A graph saga's node did not run: its ``when`` was false once the nodes it depends
    on were done. It owes nothing, and counts as done for the nodes that depend on it."""

    kind: ClassVar[Literal["node_skipped"]] = "node_skipped"
    node: str

    def signature(self) -> tuple[Any, ...]:
        return (self.kind, self.node)

    def describe(self) -> str:
        return f"node {self.node!r} skipped (its condition was false)"


class StepAbandoned(_Intent, frozen=True, kw_only=True, tag="step_abandoned"):
    """The saga's code gave up a forward step while going forward: the loser of
    ``ctx.first``, a step inside a ``ctx.timeout`` block whose timer fired, a task the code
    cancelled, or a step still running when ``run`` returned. Its commands are no longer
    waited for (a late reply is dropped). ``in_doubt``: a command was sent and may have
    been applied, so its compensation, if it has one, is issued at once (once, under its
    own retry policy); otherwise it owes nothing. A saga that is stopping (a failure, a
    cancel, its deadline) records none: its steps in flight join the compensation stack."""

    kind: ClassVar[Literal["step_abandoned"]] = "step_abandoned"
    step: str
    #: The forward command ids the step issued (what its compensation names).
    command_ids: list[str] = msgspec.field(default_factory=list)
    in_doubt: bool = False
    #: Why the code gave it up, as the canceller said (``lost to 'paid'``), or "".
    reason: str = ""

    def signature(self) -> tuple[Any, ...]:
        return (self.kind, self.step)

    def describe(self) -> str:
        why = f" ({self.reason})" if self.reason else ""
        undo = ", compensated" if self.in_doubt else ""
        return f"step {self.step!r} given up by the code{why}{undo}"


class CompensationStarted(
    _Intent, frozen=True, kw_only=True, tag="compensation_started", omit_defaults=True
):
    kind: ClassVar[Literal["compensation_started"]] = "compensation_started"
    #: ``undo``: the parent saga compensates, and this (completed) child undoes its steps.
    reason: Literal["failure", "cancel", "deadline", "operator", "undo"]
    error: ErrorInfo | None = written(None)
    #: Steps owed a compensation, in an order they may be compensated one by one.
    owed: list[str] = written_empty(list)
    #: Per owed step, the owed steps whose compensations complete before its own
    #: begins (the steps that came after it: that ran after it was applied, or that a
    #: graph declares depend on it); steps that wait for none of each other are undone
    #: in parallel. None (a history from before it): one at a time, in ``owed``'s order.
    after: dict[str, list[str]] | None = None

    def signature(self) -> tuple[Any, ...]:
        return (self.kind, self.reason, tuple(self.owed))

    def describe(self) -> str:
        return f"compensation begun ({self.reason}) for {self.owed}"


class CompensationIssued(_CommandIntent, frozen=True, kw_only=True, tag="compensation_issued"):
    kind: ClassVar[Literal["compensation_issued"]] = "compensation_issued"
    #: The forward command ids this compensation undoes (sent as ce_compensates).
    compensates: list[str] = msgspec.field(default_factory=list)

    def describe(self) -> str:
        return f"compensation of {self.step!r} sending {self.command_type} (attempt {self.attempt})"


class CompensationCompleted(_Intent, frozen=True, kw_only=True, tag="compensation_completed"):
    kind: ClassVar[Literal["compensation_completed"]] = "compensation_completed"
    step: str

    def signature(self) -> tuple[Any, ...]:
        return (self.kind, self.step)

    def describe(self) -> str:
        return f"compensation of {self.step!r} completed"


class CompensationStuck(_Intent, frozen=True, kw_only=True, tag="compensation_stuck"):
    """A compensation exhausted its retry policy: the saga parks until an operator acts."""

    kind: ClassVar[Literal["compensation_stuck"]] = "compensation_stuck"
    step: str
    error: ErrorInfo

    def signature(self) -> tuple[Any, ...]:
        return (self.kind, self.step)

    def describe(self) -> str:
        return f"compensation of {self.step!r} stuck"


class StepParked(_Intent, frozen=True, kw_only=True, tag="step_parked"):
    """A forward step could not succeed (its attempts ran out, or its participant refused
    it) and its retry policy says park, or the saga is past its pivot: the saga is
    step_stuck, its compensation stack held, until an operator retries the step (maybe
    with an edited command) or skips it with a result."""

    kind: ClassVar[Literal["step_parked"]] = "step_parked"
    step: str
    error: ErrorInfo
    #: Its outcome is unknown (the last attempt timed out): it may have been applied.
    in_doubt: bool = False
    #: Parked because the saga is past its pivot (its policy alone would compensate).
    past_pivot: bool = False

    def signature(self) -> tuple[Any, ...]:
        return (self.kind, self.step)

    def describe(self) -> str:
        return f"step {self.step!r} parked for an operator"


class PivotPassed(_Intent, frozen=True, kw_only=True, tag="pivot_passed"):
    """The saga's pivot step succeeded: from here on it only goes forward."""

    kind: ClassVar[Literal["pivot_passed"]] = "pivot_passed"
    step: str

    def signature(self) -> tuple[Any, ...]:
        return (self.kind, self.step)

    def describe(self) -> str:
        return f"pivot {self.step!r} passed"


class CarriedCompensation(Record, frozen=True, kw_only=True):
    """A compensation a run owed when it continued as new (``run_continued``), carried
    into the next run: undone, when the saga unwinds, in the order one long run would
    have undone it."""

    #: The step, named with the run that applied it (``charge@run1``), so a later run
    #: may use the same step name again.
    step: str
    spec: CompensationSpec
    #: The forward command ids the step issued (its compensation names them).
    forward_ids: list[str] = msgspec.field(default_factory=list)
    #: When it began and was owed, on the saga's count of these moments (kept across
    #: runs: ``run_continued.ticks``), which orders its undo.
    began: int = 0
    owed_at: int = 0
    #: The steps a graph node declared it depends on (None: not a graph node).
    after: list[str] | None = None
    #: The run that applied it: its compensation's command ids are that run's.
    run: int = 1


class RunContinued(_Intent, frozen=True, kw_only=True, tag="run_continued"):
    """The run ended by continuing as new (``ctx.continue_as_new``): this event closes
    it and opens the saga's next run, ``run``, whose code starts again with ``input``.
    It is the new run's first event: loading and replay read the saga from here (and its
    ``saga_started``), never the runs before. What the new run inherits is recorded
    here, once: the compensations still owed (``carried``; none with
    ``carry_compensations=False``, a commit point), the saga's counters (progress
    numbers, timer ids), signals received and not yet waited for, a passed pivot and a
    held concurrency key."""

    kind: ClassVar[Literal["run_continued"]] = "run_continued"
    #: The number of the run that begins here (the saga's first run is 1).
    run: int
    #: The sequence number of this event in the saga's history.
    first_seq: int
    input: JsonDict
    carry_compensations: bool = True
    carried: list[CarriedCompensation] = msgspec.field(default_factory=list)
    #: The saga's count of undo moments (``SagaState.ticks``) and its counters by kind.
    ticks: int = 0
    counters: dict[str, int] = msgspec.field(default_factory=dict)
    #: Signals received and not waited for yet, by name; the ids of the signals the
    #: ended run received (a late copy of one is still recognised).
    signals: dict[str, list[JsonDict]] = msgspec.field(default_factory=dict)
    seen_signals: list[str] = msgspec.field(default_factory=list)
    #: The pivot the saga passed (from there it only goes forward), if any.
    pivot_step: str | None = None
    #: The concurrency key the saga holds, if any.
    key: str | None = None

    def signature(self) -> tuple[Any, ...]:
        return (self.kind, self.run, canonical_hash(self.input), self.carry_compensations)

    def describe(self) -> str:
        carried = f", carrying {len(self.carried)} compensation(s)" if self.carried else ""
        return f"continued as new: run {self.run}{carried}"


class SagaCompleted(_Intent, frozen=True, kw_only=True, tag="saga_completed"):
    kind: ClassVar[Literal["saga_completed"]] = "saga_completed"
    output: JsonDict


class SagaFailed(_Intent, frozen=True, kw_only=True, tag="saga_failed"):
    """The run ended in error (a failure, or its deadline passed) and nothing needed
    undoing."""

    kind: ClassVar[Literal["saga_failed"]] = "saga_failed"
    error: ErrorInfo


class SagaCompensated(_Intent, frozen=True, kw_only=True, tag="saga_compensated"):
    """The run ended in error (a failure, its deadline, an operator's forced
    compensation) and every owed compensation completed."""

    kind: ClassVar[Literal["saga_compensated"]] = "saga_compensated"
    error: ErrorInfo | None = None


class SagaCancelled(_Intent, frozen=True, kw_only=True, tag="saga_cancelled"):
    """A cancel request ended the run, after every owed compensation completed (the
    only end a cancel leads to: a cancelled saga never reads as failed or compensated)."""

    kind: ClassVar[Literal["saga_cancelled"]] = "saga_cancelled"
    reason: str


Event = (
    SagaStarted
    | ReplyReceived
    | InvalidReplyReceived
    | AttemptTimedOut
    | TimerFired
    | SignalReceived
    | DomainEventReceived
    | CallbackReceived
    | CancelRequested
    | UndoRequested
    | CompensationForced
    | StepSkipped
    | RetryRequested
    | SagaParked
    | SagaResumed
    | KeyQueued
    | KeyAcquired
    | CommandIssued
    | TimerStarted
    | EventAwaited
    | CallbackAwaited
    | SideEffectRecorded
    | PatchMarked
    | NodeSkipped
    | StepAbandoned
    | CompensationStarted
    | CompensationIssued
    | CompensationCompleted
    | CompensationStuck
    | StepParked
    | PivotPassed
    | SagaCompleted
    | SagaFailed
    | SagaCompensated
    | SagaCancelled
    | UpdateReceived
    | UpdateCompleted
    | ProgressEmitted
    | RunContinued
)

EVENT_TYPES: tuple[type[_Event], ...] = (
    SagaStarted,
    ReplyReceived,
    InvalidReplyReceived,
    AttemptTimedOut,
    TimerFired,
    SignalReceived,
    CancelRequested,
    UndoRequested,
    CompensationForced,
    StepSkipped,
    RetryRequested,
    SagaParked,
    SagaResumed,
    KeyQueued,
    KeyAcquired,
    CommandIssued,
    TimerStarted,
    SideEffectRecorded,
    PatchMarked,
    NodeSkipped,
    CompensationStarted,
    CompensationIssued,
    CompensationCompleted,
    CompensationStuck,
    StepParked,
    PivotPassed,
    SagaCompleted,
    SagaFailed,
    SagaCompensated,
    SagaCancelled,
    EventAwaited,
    DomainEventReceived,
    UpdateReceived,
    UpdateCompleted,
    StepAbandoned,
    ProgressEmitted,
    CallbackAwaited,
    CallbackReceived,
    RunContinued,
)

TERMINAL_EVENTS = (SagaCompleted, SagaFailed, SagaCompensated, SagaCancelled)

#: Every type by its kind: its tag, which its ``kind`` class attribute says too.
_BY_KIND: Final[dict[str, type[Event]]] = {}
for _type in EVENT_TYPES:
    _kind = _type.__struct_config__.tag
    if not isinstance(_kind, str) or _kind in _BY_KIND:
        raise DefinitionError(f"event type {_type.__name__} needs a tag of its own, not {_kind!r}")
    if _type.kind != _kind:
        raise DefinitionError(f"event type {_type.__name__}'s kind is not its tag {_kind!r}")
    _BY_KIND[_kind] = _type  # type: ignore[assignment]


class _StartAsStored(SagaStarted, frozen=True, kw_only=True, tag="saga_started"):
    """A start as its text is stored: above version 1, it carries its version under
    ``_v`` (``_event_versions``), read here in the same pass as its fields (0: none, a
    start stored at version 1). Only read, never built or written: ``_as_read`` gives
    the ``SagaStarted`` it is."""

    stored_version: int = msgspec.field(default=0, name="_v")


#: The types a stored event's text is read into in one pass: each kind's own, or for a
#: kind above version 1 its stored shape (``_v`` a field), by the type it stands for.
_AS_STORED: Final[dict[type, type[Event]]] = {_StartAsStored: SagaStarted}
_READ_TYPES: Final = tuple(
    next((shape for shape, t in _AS_STORED.items() if t is kind), kind) for kind in EVENT_TYPES
)
_READ_AS: Final[Any] = Union[_READ_TYPES]  # noqa: UP007 (a union built of a tuple)
_DECODER: Final[msgspec.json.Decoder[Any]] = decoder(_READ_AS)
_LIST_DECODER: Final[msgspec.json.Decoder[list[Any]]] = decoder(GenericAlias(list, (_READ_AS,)))


def _as_read(event: Any) -> Event | None:
    """An event read in one pass, as its own type; None when it must be read again as
    JSON values (``event_from_dict``: a kind above version 1 stored at an older one is
    upcast, one stored by a newer engine refused)."""
    kind = type(event)
    if kind.version == 1:
        return event  # type: ignore[no-any-return]
    own = _AS_STORED.get(kind)
    if own is None or event.stored_version != own.version:
        return None
    fields = msgspec.structs.asdict(event)
    del fields["stored_version"]
    return own(**fields)


#: Each kind's current version and the upcasters to it: what this engine reads.
VERSIONS: EventVersions = EventVersions.of(((t.kind, t.version) for t in EVENT_TYPES), UPCASTERS)


def event_to_dict(event: Event) -> JsonDict:
    data: JsonDict = to_data(event)
    # Only an event above version 1 carries its version: version 1 is stored as it
    # always was (see _event_versions).
    if type(event).version > 1:
        data[VERSION_KEY] = type(event).version
    return data


def event_from_dict(data: JsonDict, versions: EventVersions | None = None) -> Event:
    """A stored event in the current shape (upcast if older); NewerEventError if it was
    written by a newer engine, ``InvalidRecord`` if it does not fit its type.
    ``versions``: what this engine reads (``VERSIONS``)."""
    data = (versions or VERSIONS).current_shape(data)
    # Converted to its own type (found by its kind) rather than to the union ``Event``,
    # which msgspec.convert would build its lookup for on every call.
    kind = data.get("kind") if isinstance(data, dict) else None
    target: Any = _BY_KIND.get(kind, Event) if isinstance(kind, str) else Event
    event: Event = from_data(target, data)
    return event


def event_to_json(event: Event) -> bytes:
    """``event_to_dict`` as JSON bytes: the same value, written in one pass (no dict
    built first), its version appended when it carries one."""
    raw = encode(event)
    if type(event).version > 1:  # every event has a field: raw ends with "...}"
        return b'%s,"%s":%d}' % (raw[:-1], VERSION_KEY.encode(), type(event).version)
    return raw


def event_from_json(raw: bytes | str | RawJson, versions: EventVersions | None = None) -> Event:
    """A stored event from its JSON text, read straight into its type when it can be; as
    ``event_from_dict`` says otherwise, with the same errors. ``raw``: the text, or an
    item of a stored array (``json_items``)."""
    if versions is None:
        # One pass when no upcaster applies: a version-1 kind stored without ``_v`` (a
        # stored ``_v`` is an unknown field here). Anything else, or anything refused,
        # goes the way of a dict (which says why, or upcasts).
        try:
            event = _as_read(_DECODER.decode(raw))
        except (msgspec.ValidationError, msgspec.DecodeError):
            pass
        else:
            if event is not None:
                return event
    return event_from_dict(loads(bytes(raw) if type(raw) is RawJson else raw), versions)


def events_from_json(raw: bytes) -> list[Event] | None:
    """The events of a stored JSON array, read straight into their types in one pass;
    None when one of them cannot be read so (an older shape, a kind above version 1,
    a sealed payload, a bad value...): each is then read alone (``event_from_json``
    and the others), which upcasts it or says why it is refused."""
    try:
        events = _LIST_DECODER.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    for i, event in enumerate(events):
        if type(event).version != 1:
            read = _as_read(event)
            if read is None:  # stored before its kind moved on: upcast alone
                return None
            events[i] = read
    return events


def events_from_list(items: list[JsonDict], versions: EventVersions | None = None) -> list[Event]:
    return [event_from_dict(item, versions) for item in items]
