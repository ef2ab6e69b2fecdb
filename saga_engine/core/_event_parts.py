"""The models history events carry: an error as it is stored, a step's compensation, and
the links a start records (its parent, the trigger record, the saga it re-runs). Kept
beside ``_events`` (which re-exports them) so that module holds the events themselves."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from saga_engine.core._policy import RetryPolicy
from saga_engine.kernel._serde import JsonDict

__all__ = ["CompensationSpec", "ErrorInfo", "ParentLink", "RerunLink", "TriggerOrigin"]


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
