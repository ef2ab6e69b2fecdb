"""What goes into the decision core and what comes out of it: plain data, no behaviour.

Frozen msgspec structs, not frozen dataclasses: several are built per reply (the input,
the decision, its projection, each command), and a frozen dataclass sets each field
through ``object.__setattr__``. With these, the runtime's own data (``StepRequest``,
``OwedCompensation``, the fold's ``Sent`` and ``Timer``) as structs too, the decision core
went from 1,351,480 to 1,056,027 instructions per saga (``python -m bench.instructions``;
bench/README.md, "Decision core cuts"). Never encoded or decoded: they are not records."""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum
from typing import Literal

import msgspec
from pydantic import BaseModel, ConfigDict, Field

from saga_engine.core.history._cost import Cost
from saga_engine.core.history._events import (
    Event,
    ParentLink,
    ReplyTimings,
    RerunLink,
    TriggerOrigin,
    absent,
)
from saga_engine.core.history._status import SagaStatus
from saga_engine.kernel._errors import PermanentError
from saga_engine.kernel._ids import uuid5_text
from saga_engine.kernel._serde import JsonDict

_COMMAND_NS = uuid.UUID("6f1c3f3e-9a51-4c1e-9c57-2d0f8a2b7e10")
_SAGA_ID_NS = uuid.UUID("0b8e2f5c-3d6a-4e0b-a1c2-7f9e8d6c5b4a")
_CHILD_ID_NS = uuid.UUID("9d3c6a1e-52f4-4b8e-8f0d-1c7e2b9a4d36")
DEADLINE_TIMER = "deadline"
#: The participant name of a child saga's commands: the engine routes them to the saga
#: inbox (a start, or an undo, keyed by the child's id) instead of a participant's topic.
CHILD_PARTICIPANT = "saga.child"
#: The participant name of a child's end, sent to its parent: the engine routes it to the
#: saga inbox as the reply to the parent's command (keyed by the parent's id).
PARENT_PARTICIPANT = "saga.parent"
#: A child's step is named ``child:{key}``, its id derived from the parent's id and key.
CHILD_STEP_PREFIX = "child:"


class Projection(msgspec.Struct, frozen=True):
    """The listing row kept beside the events, written in the same transaction."""

    status: SagaStatus
    current_step: str | None = None
    next_wakeup: datetime | None = None
    error: JsonDict | None = None


def saga_id_for(saga_type: str, idempotency_key: str) -> str:
    """Starting twice with the same key yields the same id, so only one saga exists."""
    return uuid5_text(_SAGA_ID_NS, f"{saga_type}\x00{idempotency_key}")


def child_saga_id(parent_id: str, key: str) -> str:
    """A child's id, from its parent's id and the key of the ``ctx.child`` call: the same
    on every replay and every re-send, so the child is started once."""
    return uuid5_text(_CHILD_ID_NS, f"{parent_id}\x00{key}")


def command_id_for(saga_id: str, step: str, generation: int, *, compensation: bool) -> str:
    """Deterministic: a replay or a re-send after recovery produces the same id."""
    role = "compensate" if compensation else "forward"
    return uuid5_text(_COMMAND_NS, f"{saga_id}/{step}/{role}/{generation}")


class ChildStart(BaseModel):
    """The command of a ``ctx.child`` step: start this child saga (routed to the inbox)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    saga_id: str
    saga_type: str
    input: JsonDict
    #: The parent's flow-control priority and fairness key: a tenant's children take
    #: the tenant's turns, and an urgent parent's children are urgent too.
    priority: int = 0
    fairness_key: str | None = None
    #: The parent's flow policy: a child runs under its parent's (None: version 1).
    flow_policy: int | None = Field(default=None, exclude_if=absent)


class ChildUndo(BaseModel):
    """The compensation of a ``ctx.child`` step: undo what the child did."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    saga_id: str
    saga_type: str


# --------------------------------------------------------------------------- inputs


class StartSaga(msgspec.Struct, frozen=True):
    saga_id: str
    saga_type: str
    input: JsonDict
    at: datetime
    idempotency_key: str | None = None
    deadline_at: datetime | None = None
    trace_context: dict[str, str] = msgspec.field(default_factory=dict)
    parent: ParentLink | None = None
    trigger: TriggerOrigin | None = None
    priority: int = 0
    fairness_key: str | None = None
    rerun_of: RerunLink | None = None
    flow_policy: int | None = None


class Reply(msgspec.Struct, frozen=True):
    command_id: str
    outcome: Literal["success", "failure", "retryable"]
    at: datetime
    payload: JsonDict = msgspec.field(default_factory=dict)
    error: str | None = None
    #: The saga that answers, when a child's end comes through the inbox (its
    #: ``ce_causationid``): checked against the child the step started. None: not
    #: checked (a reply given through the API, or a participant's).
    sender: str | None = None
    #: The reply's timing headers, recorded on its event for insights (None: it had none).
    timings: ReplyTimings | None = None


class TimerDue(msgspec.Struct, frozen=True):
    timer_id: str
    at: datetime


class SignalInput(msgspec.Struct, frozen=True):
    signal_id: str
    name: str
    at: datetime
    payload: JsonDict = msgspec.field(default_factory=dict)
    principal: str = "system"
    reason: str = ""


class CallbackInput(msgspec.Struct, frozen=True):
    """A call of a callback URL whose token checked out (``runner/_engine``): it answers
    the wait ``wait_id``; ``digest`` tells a repeat from a conflict."""

    wait_id: str
    at: datetime
    payload: JsonDict
    failed: bool
    digest: str


class UpdateInput(msgspec.Struct, frozen=True):
    """A call of a saga's ``@update`` method (see ``core/authoring/_update``)."""

    update_id: str
    name: str
    at: datetime
    payload: JsonDict = msgspec.field(default_factory=dict)
    principal: str = "system"
    reason: str = ""


class Cancel(msgspec.Struct, frozen=True):
    reason: str
    at: datetime
    principal: str = "system"


class Resume(msgspec.Struct, frozen=True):
    at: datetime
    principal: str = "system"
    reason: str = ""


class ForceCompensate(msgspec.Struct, frozen=True):
    reason: str
    at: datetime
    principal: str = "system"


class Skip(msgspec.Struct, frozen=True):
    step: str
    at: datetime
    payload: JsonDict = msgspec.field(default_factory=dict)
    principal: str = "system"
    reason: str = ""


class RetryStep(msgspec.Struct, frozen=True):
    step: str
    at: datetime
    principal: str = "system"
    reason: str = ""
    #: An edited command for a step parked after it could not succeed (checked against
    #: the step's command model); None: the step's command as it was.
    command: JsonDict | None = None


class Undo(msgspec.Struct, frozen=True):
    """The parent compensates: a child undoes what it did (see ``UndoRequested``)."""

    command_id: str
    parent_id: str
    at: datetime
    reason: str = ""


class EventInput(msgspec.Struct, frozen=True):
    """A stored domain event (an ``EventSource``'s fact) offered to a saga that waits
    for its source and key: it answers the saga's first such wait, once."""

    source: str
    key: str
    event_id: str
    at: datetime
    payload: JsonDict = msgspec.field(default_factory=dict)


class KeyQueue(msgspec.Struct, frozen=True):
    """The saga's concurrency key is at its limit: it waits behind ``behind``."""

    key: str
    at: datetime
    behind: tuple[str, ...] = ()
    position: int = 1


class KeyGrant(msgspec.Struct, frozen=True):
    """The saga holds a slot of its concurrency key: its run may begin."""

    key: str
    at: datetime


Inbound = (
    Reply
    | TimerDue
    | SignalInput
    | Cancel
    | Resume
    | ForceCompensate
    | Skip
    | RetryStep
    | Undo
    | EventInput
    | CallbackInput
    | UpdateInput
    | KeyQueue
    | KeyGrant
)


class DropReason(StrEnum):
    DUPLICATE_REPLY = "duplicate_reply"
    UNKNOWN_COMMAND = "unknown_command"
    STALE_TIMER = "stale_timer"
    DUPLICATE_SIGNAL = "duplicate_signal"
    #: An update id recorded already: its recorded result is the answer.
    DUPLICATE_UPDATE = "duplicate_update"
    PARKED = "parked"
    #: An undo the child had already (the same command again), or a child that ended
    #: some other way (its end answers the undo: see ``SagaRuntime.parent_notices``).
    UNDO_ANSWERED = "undo_answered"
    #: An undo of a child past its pivot: it cannot be undone, and refuses (the reply is
    #: ``undo_refused``; the parent's compensation of the child fails, then is stuck).
    UNDO_PAST_PIVOT = "undo_past_pivot"
    #: A domain event this saga received already.
    DUPLICATE_EVENT = "duplicate_event"
    #: A domain event the saga does not (or no longer) wait for.
    NO_EVENT_WAIT = "no_event_wait"
    #: A concurrency key's grant (or queueing) the history records already, or that
    #: comes after the saga stopped waiting for its key.
    KEY_SETTLED = "key_settled"
    #: A callback answered already with the same body: the first answer stands.
    DUPLICATE_CALLBACK = "duplicate_callback"


class OutboundCommand(msgspec.Struct, frozen=True):
    saga_id: str
    saga_type: str
    step: str
    participant: str
    command_type: str
    payload: JsonDict
    command_id: str
    attempt: int
    compensation: bool
    trace_context: dict[str, str] = msgspec.field(default_factory=dict)
    #: For a compensation: the forward command ids it undoes...
    compensates: tuple[str, ...] = ()
    #: ...and the last attempt of each (their spans' ids derive from id and attempt).
    compensates_attempts: tuple[int, ...] = ()
    #: What it holds of its participant's budget while in flight (flow control).
    cost: Cost | None = None


class Decision(msgspec.Struct):
    events: list[Event]
    commands: list[OutboundCommand]
    projection: Projection
    dropped: DropReason | None = None
    #: Why the code deployed cannot drive the saga (it is parked): a NondeterminismError,
    #: or a DefinitionError its code hit.
    nondeterminism: PermanentError | None = None

    @property
    def status(self) -> SagaStatus:
        return self.projection.status


def parent_reply(
    parent: ParentLink,
    child_id: str,
    outcome: Literal["success", "failure"],
    payload: JsonDict,
    error: str | None,
    trace_context: dict[str, str] | None = None,
) -> OutboundCommand:
    """A child's answer to its parent, as a command the engine routes to the parent's
    inbox: the reply to the parent's ``command_id`` (see ``PARENT_PARTICIPANT``)."""
    return OutboundCommand(
        saga_id=parent.saga_id,
        saga_type=parent.saga_type,
        step=f"child:{child_id}",
        participant=PARENT_PARTICIPANT,
        command_type=outcome,
        payload={"outcome": outcome, "payload": payload, "error": error, "child": child_id},
        command_id=parent.command_id,
        attempt=1,
        compensation=False,
        trace_context=trace_context or {},
    )


def undo_refused(child_id: str, parent_id: str, command_id: str) -> OutboundCommand:
    """A child past its pivot refuses its parent's undo (``DropReason.UNDO_PAST_PIVOT``):
    the failure reply to the parent's compensation command ``command_id``."""
    message = (
        f"child saga {child_id} is past its pivot: it only goes forward and cannot be "
        "undone; compensate it by hand and skip this compensation, or resume to ask again"
    )
    details = {"child_id": child_id, "past_pivot": True}
    link = ParentLink(saga_id=parent_id, command_id=command_id)
    return parent_reply(link, child_id, "failure", details, message)
