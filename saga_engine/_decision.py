"""What goes into the decision core and what comes out of it: plain data, no behaviour."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Literal

from saga_engine._errors import PermanentError
from saga_engine._events import Event
from saga_engine._serde import JsonDict
from saga_engine._status import SagaStatus
from saga_engine._store import Projection

_COMMAND_NS = uuid.UUID("6f1c3f3e-9a51-4c1e-9c57-2d0f8a2b7e10")
_SAGA_ID_NS = uuid.UUID("0b8e2f5c-3d6a-4e0b-a1c2-7f9e8d6c5b4a")
DEADLINE_TIMER = "deadline"


def saga_id_for(saga_type: str, idempotency_key: str) -> str:
    """Starting twice with the same key yields the same id, so only one saga exists."""
    return str(uuid.uuid5(_SAGA_ID_NS, f"{saga_type}\x00{idempotency_key}"))


def command_id_for(saga_id: str, step: str, generation: int, *, compensation: bool) -> str:
    """Deterministic: a replay or a re-send after recovery produces the same id."""
    role = "compensate" if compensation else "forward"
    return str(uuid.uuid5(_COMMAND_NS, f"{saga_id}/{step}/{role}/{generation}"))


# --------------------------------------------------------------------------- inputs


@dataclass(frozen=True, slots=True)
class StartSaga:
    saga_id: str
    saga_type: str
    input: JsonDict
    at: datetime
    idempotency_key: str | None = None
    deadline_at: datetime | None = None
    trace_context: dict[str, str] = field(default_factory=dict)
    priority: int = 0
    fairness_key: str | None = None


@dataclass(frozen=True, slots=True)
class Reply:
    command_id: str
    outcome: Literal["success", "failure", "retryable"]
    at: datetime
    payload: JsonDict = field(default_factory=dict)
    error: str | None = None


@dataclass(frozen=True, slots=True)
class TimerDue:
    timer_id: str
    at: datetime


@dataclass(frozen=True, slots=True)
class SignalInput:
    signal_id: str
    name: str
    at: datetime
    payload: JsonDict = field(default_factory=dict)
    principal: str = "system"
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Cancel:
    reason: str
    at: datetime
    principal: str = "system"


@dataclass(frozen=True, slots=True)
class Resume:
    at: datetime
    principal: str = "system"
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ForceCompensate:
    reason: str
    at: datetime
    principal: str = "system"


@dataclass(frozen=True, slots=True)
class Skip:
    step: str
    at: datetime
    payload: JsonDict = field(default_factory=dict)
    principal: str = "system"
    reason: str = ""


@dataclass(frozen=True, slots=True)
class RetryStep:
    step: str
    at: datetime
    principal: str = "system"
    reason: str = ""


Inbound = Reply | TimerDue | SignalInput | Cancel | Resume | ForceCompensate | Skip | RetryStep


class DropReason(StrEnum):
    DUPLICATE_REPLY = "duplicate_reply"
    UNKNOWN_COMMAND = "unknown_command"
    STALE_TIMER = "stale_timer"
    DUPLICATE_SIGNAL = "duplicate_signal"
    PARKED = "parked"


@dataclass(frozen=True, slots=True)
class OutboundCommand:
    saga_id: str
    saga_type: str
    step: str
    participant: str
    command_type: str
    payload: JsonDict
    command_id: str
    attempt: int
    compensation: bool
    trace_context: dict[str, str] = field(default_factory=dict)
    #: For a compensation: the forward command ids it undoes...
    compensates: tuple[str, ...] = ()
    #: ...and the last attempt of each (their spans' ids derive from id and attempt).
    compensates_attempts: tuple[int, ...] = ()


@dataclass(slots=True)
class Decision:
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
