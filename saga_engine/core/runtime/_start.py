"""A start's pieces that take no I/O: the request every edge makes (``StartRequest``),
what it asks for once resolved (``PreparedStart``), and whether a repeated start asks for
the same saga."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import NamedTuple

from saga_engine.core.authoring._definition import SagaDefinition, SagaRegistry
from saga_engine.core.history._decision import StartSaga, saga_id_for
from saga_engine.core.history._events import (
    Event,
    ParentLink,
    RerunLink,
    SagaStarted,
    TriggerOrigin,
)
from saga_engine.kernel._errors import IdempotencyConflict, InvalidTransition
from saga_engine.kernel._serde import JsonDict, canonical_hash


@dataclass(frozen=True, slots=True)
class StartRequest:
    """A request to start a saga, the same from every edge: the admin API, ``SagaClient``,
    a trigger, a schedule and a parent's ``ctx.child`` all make one, the inbox carries it
    (``StartBody``), and the engine resolves it (``PreparedStart``)."""

    saga_type: str
    input: JsonDict
    #: None: derived from the idempotency key (``saga_id_for``), or a new UUID.
    saga_id: str | None = None
    #: Starting twice with the same key yields one saga.
    idempotency_key: str | None = None
    #: Overrides the saga type's default deadline.
    deadline: timedelta | None = None
    #: W3C trace context (``traceparent``, ``tracestate``): the saga joins that trace.
    trace_context: dict[str, str] = field(default_factory=dict)
    #: The saga that started this one with ``ctx.child`` (its end answers that parent).
    parent: ParentLink | None = None
    #: The trigger record it was started from.
    trigger: TriggerOrigin | None = None
    #: Flow control: a higher priority is sent first when a limit holds commands back;
    #: the fairness key (a tenant) takes turns with the others.
    priority: int = 0
    fairness_key: str | None = None
    #: The saga an operator re-ran as this one (``saga rerun``).
    rerun_of: RerunLink | None = None
    #: The flow policy it runs under, given (a child takes its parent's); None: the
    #: flow-policy rollout chooses (``RolloutTable.flow_policy``).
    flow_policy: int | None = None

    def with_saga_id(self) -> StartRequest:
        """This request with its saga id decided: the one given, the one its idempotency
        key derives, or a new UUID (so a re-sent request names the same saga)."""
        if self.saga_id is not None:
            return self
        if self.idempotency_key:
            return replace(self, saga_id=saga_id_for(self.saga_type, self.idempotency_key))
        return replace(self, saga_id=str(uuid.uuid4()))


#: The search attribute a rerun records its original under (a dotted name: no input
#: field can take it), so the original's page finds its reruns through the index on
#: ``sagas.search`` instead of reading histories.
RERUN_ATTRIBUTE = "saga.rerun_of"


def start_search(definition: SagaDefinition, started: SagaStarted) -> dict[str, str] | None:
    """What the saga's listing row is searched by: its declared search attributes, and
    the saga it re-runs (``RERUN_ATTRIBUTE``) if an operator re-ran one as it."""
    values = definition.search_values(started.input)
    if started.rerun_of is None:
        return values
    return {**(values or {}), RERUN_ATTRIBUTE: started.rerun_of.saga_id}


def rerun_key(original_id: str, input: JsonDict) -> str:
    """The idempotency key of a rerun asked without one: the same original and the same
    input (as its model reads it, defaults filled in) start one saga, from every edge."""
    return f"rerun:{original_id}:{canonical_hash(input)}"


def check_same_start(
    definition: SagaDefinition,
    started: Event,
    payload: JsonDict,
    saga_id: str,
    idempotency_key: str | None,
    registry: SagaRegistry | None = None,
) -> None:
    """A repeated start is the same saga only if it asks for the same thing: reusing a
    key with another input is refused (IdempotencyConflict), as payment APIs do. It is
    compared as the version the saga started on reads it (``registry``), not the version
    today's rollout would pick: a repeat after a rollout change is the same request."""
    if not isinstance(started, SagaStarted):
        raise InvalidTransition(f"saga {saga_id} has no saga_started event")
    if started.saga_type != definition.name:
        raise InvalidTransition(
            f"saga id {saga_id} already belongs to a {started.saga_type!r} saga"
        )
    if registry is not None and started.saga_version != definition.version:
        definition = registry.for_history(started.saga_type, [started])
    if not definition.same_request(started.input, started.request_hash, payload):
        raise IdempotencyConflict(saga_id, idempotency_key)


class PreparedStart(NamedTuple):
    definition: SagaDefinition
    payload: JsonDict
    saga_id: str
    now: datetime
    deadline_at: datetime | None
    idempotency_key: str | None
    trace_context: dict[str, str]
    #: The saga that started this one with ``ctx.child`` (its end answers that parent).
    parent: ParentLink | None = None
    #: The trigger record it was started from.
    trigger: TriggerOrigin | None = None
    #: Flow control: a higher priority is sent first when a limit holds commands back;
    #: the fairness key (a tenant) takes turns with the others.
    priority: int = 0
    fairness_key: str | None = None
    #: The saga an operator re-ran as this one (``saga rerun``).
    rerun_of: RerunLink | None = None
    #: The flow policy it runs under (None: version 1).
    flow_policy: int | None = None


def start_input(start: PreparedStart) -> StartSaga:
    """The runtime's start input for a prepared start."""
    return StartSaga(
        saga_id=start.saga_id,
        saga_type=start.definition.name,
        input=start.payload,
        at=start.now,
        idempotency_key=start.idempotency_key,
        deadline_at=start.deadline_at,
        trace_context=start.trace_context,
        parent=start.parent,
        trigger=start.trigger,
        priority=start.priority,
        fairness_key=start.fairness_key,
        rerun_of=start.rerun_of,
        flow_policy=start.flow_policy,
    )
