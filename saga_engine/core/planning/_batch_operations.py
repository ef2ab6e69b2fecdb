"""Batch operations: one operator action applied to every saga a filter matches.

Pure: what an operation is (its filter, action and reason), its states and their moves,
and how a saga's history shows that the operation already acted on it. The store keeps
the operation's row (``store/_batch_operation_store``), the runner works through it
(``runner/_batch_operations``).

An operation acts on a saga at most once, across crashes and engines: every action it
takes carries its id (the reason recorded in the saga's history starts with
:func:`reason_prefix`, a signal's id is :func:`signal_id_for`), and before acting the runner
reads the saga's history and skips a saga that already carries it (:func:`acted_on`).
A rerun leaves the original's history alone: the new saga's id derives from the
operation and the original (:func:`rerun_key_for`), so a repeat is the same start, and
the reruns the operation started are passed over if its filter matches them
(:func:`started_by`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from enum import StrEnum
from typing import Annotated, Any, Final

from pydantic import BaseModel, ConfigDict, Field

from saga_engine.core.authoring._definition import SagaRegistry
from saga_engine.core.history._status import SagaStatus
from saga_engine.kernel._errors import InvalidPayload, InvalidTransition, UnknownSagaType
from saga_engine.kernel._input_types import Instant, StorableText, Text, check_time_range
from saga_engine.kernel._serde import JsonDict

__all__ = [
    "BATCH_TRANSITIONS",
    "BatchAction",
    "BatchFilter",
    "BatchSpec",
    "BatchState",
    "acted_on",
    "check_batch_move",
    "check_spec",
    "reason_prefix",
    "rerun_key_for",
    "signal_id_for",
    "started_by",
]

_NAMESPACE: Final = uuid.UUID("6f1d3c1e-5b1a-4d7e-9a53-0c7a3e0b7b11")


class BatchAction(StrEnum):
    """What an operation does to each saga. A new action is a member here and an entry
    in ``runner/_batch_operations.ACTIONS``; nothing else changes."""

    CANCEL = "cancel"
    SIGNAL = "signal"
    #: Retries the saga's stuck step (a stuck compensation or a held reply).
    RETRY = "retry"
    RESUME = "resume"
    #: Starts a new saga of the same type with the same input, linked to the original
    #: (``rerun_of``), as ``POST /sagas/{id}/rerun`` does.
    RERUN = "rerun"


class BatchState(StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    #: An operator cancelled the operation: the sagas not reached yet are left alone.
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        return self is not BatchState.RUNNING


#: Every allowed move of an operation's state.
BATCH_TRANSITIONS: dict[BatchState, frozenset[BatchState]] = {
    BatchState.RUNNING: frozenset({BatchState.COMPLETED, BatchState.CANCELLED}),
    BatchState.COMPLETED: frozenset(),
    BatchState.CANCELLED: frozenset(),
}


def check_batch_move(before: BatchState, after: BatchState) -> None:
    if after not in BATCH_TRANSITIONS[before]:
        raise InvalidTransition(f"a batch operation cannot go from {before} to {after}")


class BatchFilter(BaseModel):
    """The saga list's filters (``GET /sagas``): every one given must match."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    statuses: list[SagaStatus] | None = None
    saga_type: Annotated[str, StorableText(min_length=1, max_length=100)] | None = None
    created_after: Instant | None = None
    created_before: Instant | None = None
    updated_after: Instant | None = None
    updated_before: Instant | None = None
    #: An id prefix, or an idempotency key.
    q: Annotated[str, StorableText(min_length=1, max_length=200)] | None = None
    #: Search attributes (``Saga.search_attributes``), all of which must match.
    attributes: dict[Text, Text] = Field(default_factory=dict)


class BatchSpec(BaseModel):
    """What an operation does: checked when it is created, stored with its row."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    filter: BatchFilter
    action: BatchAction
    #: Required, and recorded in every saga's history after the operation's id.
    reason: Annotated[str, StorableText(strip=True, min_length=1, max_length=1000)]
    #: The signal's name and payload (``action`` signal only).
    signal: Text | None = None
    payload: JsonDict = Field(default_factory=dict)


def reason_prefix(operation_id: str) -> str:
    """What starts the reason of every action the operation takes (``[batch <id>] ...``):
    the saga's history names the operation that acted on it."""
    return f"[batch {operation_id}]"


def signal_id_for(operation_id: str, saga_id: str) -> str:
    """The id of the signal an operation sends a saga: the same on every attempt, so the
    engine's signal dedupe makes a repeat a no-op."""
    return str(uuid.uuid5(_NAMESPACE, f"{operation_id}/{saga_id}"))


def rerun_key_for(operation_id: str, saga_id: str) -> str:
    """The idempotency key of the rerun an operation starts for a saga: the same on every
    attempt, so a repeat after a crash names the saga started the first time."""
    return f"batch-rerun:{operation_id}:{saga_id}"


def started_by(events: Iterable[Any], operation_id: str) -> bool:
    """Whether the saga is a rerun the operation started (its ``saga_started`` links the
    original with a reason that starts with the operation's :func:`reason_prefix`)."""
    first = next(iter(events), None)
    reason = getattr(getattr(first, "rerun_of", None), "reason", None)
    return isinstance(reason, str) and reason.startswith(reason_prefix(operation_id))


def acted_on(events: Iterable[Any], operation_id: str) -> bool:
    """Whether a history holds an action of the operation (an operator event whose
    reason starts with its :func:`reason_prefix`, or its signal)."""
    tag = reason_prefix(operation_id)
    for event in events:
        reason = getattr(event, "reason", None)
        principal = getattr(event, "principal", None)
        if principal is not None and isinstance(reason, str) and reason.startswith(tag):
            return True
    return False


def _problem(loc: list[str | int], msg: str, kind: str) -> InvalidPayload:
    return InvalidPayload("batch operation", [{"loc": loc, "msg": msg, "type": kind}])


def check_spec(spec: BatchSpec, registry: SagaRegistry) -> None:
    """What a model cannot check alone, against the saga types deployed: InvalidPayload
    naming the field (relative to the request: ``filter.saga_type``, ``signal``,
    ``payload.<field>``...). Every way in (the admin API, the client) checks this before
    recording anything."""
    where = spec.filter
    for low, high, what in (
        (where.created_after, where.created_before, "created"),
        (where.updated_after, where.updated_before, "updated"),
    ):
        problem = check_time_range(low, high, what)
        if problem is not None:
            raise _problem(["filter", f"{what}_after"], problem, "time_range")
    definition = None
    if where.saga_type is not None:
        try:
            definition = registry.get(where.saga_type)
        except UnknownSagaType as exc:
            raise _problem(["filter", "saga_type"], str(exc), "unknown_saga_type") from None
    declared = {name for d in registry for name in d.search_attributes}
    for name, value in where.attributes.items():
        if name not in declared:
            known = ", ".join(sorted(declared)) or "none are declared"
            msg = f"no saga type declares search attribute {name!r} ({known})"
            raise _problem(["filter", "attributes", name], msg, "unknown_attribute")
        if "\x00" in value or len(value) > 200:
            msg = "at most 200 characters, and no NUL"
            raise _problem(["filter", "attributes", name], msg, "value_error")
    if spec.action is not BatchAction.SIGNAL:
        if spec.signal is not None or spec.payload:
            raise _problem(["signal"], "only the signal action sends a signal", "extra_forbidden")
        return
    if spec.signal is None:
        raise _problem(["signal"], "the signal action needs the signal's name", "missing")
    if definition is None:
        msg = "the signal action needs the saga type (its signals are declared per type)"
        raise _problem(["filter", "saga_type"], msg, "missing")
    try:
        definition.signal(spec.signal).validate(spec.payload, "payload")
    except InvalidPayload as exc:
        raise InvalidPayload(
            "batch operation",
            [
                {**e, "loc": ["signal"] if e["type"] == "unknown_signal" else e["loc"]}
                for e in exc.errors
            ],
        ) from None
