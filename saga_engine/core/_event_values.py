"""The value types history events carry: an error, a step's compensation, a child's
parent, a trigger's record. ``_events`` imports them; they import no event."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from saga_engine.core._policy import RetryPolicy
from saga_engine.kernel._serde import JsonDict


class ErrorInfo(BaseModel):
    """An error as it is stored: enough to explain what happened, no traceback."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: str
    message: str
    step: str | None = None
    details: JsonDict = Field(default_factory=dict)


class CompensationSpec(BaseModel):
    """The compensation a forward step carries, recorded with the step's command."""

    model_config = ConfigDict(frozen=True, extra="forbid")

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


class TriggerOrigin(BaseModel):
    """The Kafka record a trigger started the saga from, to trace it back to its cause."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    topic: str
    partition: int
    offset: int
