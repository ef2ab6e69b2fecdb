"""A saga's lineage: its parent, its children, the trigger record that started it, and
the whole tree it belongs to.

Histories hold it all: a child's ``saga_started`` names its parent, and a parent's
``command_issued`` to ``saga.child`` names each child's id. No table is kept for it; the
tree is read from the histories, bounded (``MAX_NODES``, ``MAX_DEPTH``), when asked for.
"""

from __future__ import annotations

from collections.abc import Sequence

from saga_engine.admin._schemas import (
    ChildRef,
    LineageNode,
    ParentRef,
    RerunRef,
    SagaRef,
    TriggerRef,
)
from saga_engine.core.history._codec import Undecodable
from saga_engine.core.history._decision import CHILD_PARTICIPANT, CHILD_STEP_PREFIX, child_saga_id
from saga_engine.core.history._events import CommandIssued, Event, RunContinued, SagaStarted
from saga_engine.core.runtime._start import RERUN_ATTRIBUTE
from saga_engine.core.runtime._state import id_scope
from saga_engine.kernel._errors import CodecError, SagaNotFound
from saga_engine.store._store import EventStore, SagaFilter

#: A tree is drawn with at most this many sagas, and this many levels above the saga.
MAX_NODES = 100
MAX_DEPTH = 16
#: A saga's page lists at most this many of its reruns.
MAX_RERUNS = 50


def children_of(saga_id: str, events: Sequence[Event]) -> list[tuple[str, str, str]]:
    """(child id, child type, step) for every child a history started, in order. The id
    derives from the parent's id and the step's key, so it is known even when the command's
    payload is encrypted and this process lacks the key (the type is then read from the
    child's own record)."""
    seen: dict[str, tuple[str, str, str]] = {}
    scope = saga_id
    for event in events:
        if isinstance(event, RunContinued):  # a later run's children derive from it
            scope = id_scope(saga_id, event.run)
        if isinstance(event, CommandIssued) and event.participant == CHILD_PARTICIPANT:
            child_id = child_saga_id(scope, event.step.removeprefix(CHILD_STEP_PREFIX))
            if child_id not in seen:
                saga_type = event.payload.get("saga_type")
                seen[child_id] = (
                    child_id,
                    saga_type if isinstance(saga_type, str) else "",
                    event.step,
                )
    return list(seen.values())


def parent_of(events: Sequence[Event]) -> ParentRef | None:
    started = events[0] if events else None
    if not isinstance(started, SagaStarted) or started.parent is None:
        return None
    return ParentRef.model_validate(started.parent, from_attributes=True)


def rerun_of(events: Sequence[Event]) -> RerunRef | None:
    """The saga an operator re-ran as this one (``saga rerun``), if one did."""
    started = events[0] if events else None
    if not isinstance(started, SagaStarted) or started.rerun_of is None:
        return None
    return RerunRef.model_validate(started.rerun_of, from_attributes=True)


def trigger_of(events: Sequence[Event]) -> TriggerRef | None:
    started = events[0] if events else None
    if not isinstance(started, SagaStarted) or started.trigger is None:
        return None
    return TriggerRef.model_validate(started.trigger, from_attributes=True)


async def children(store: EventStore, saga_id: str, events: Sequence[Event]) -> list[ChildRef]:
    """The children a history started, each with its status (None: not started yet)."""
    found = []
    for child_id, saga_type, step in children_of(saga_id, events):
        status = None
        try:
            record = await store.get(child_id)
        except SagaNotFound:
            pass
        else:
            status, saga_type = record.status, record.saga_type
        found.append(ChildRef(saga_id=child_id, saga_type=saga_type, step=step, status=status))
    return found


async def reruns(store: EventStore, saga_id: str) -> list[SagaRef]:
    """The sagas re-run from this one (found by their search attribute, not a scan)."""
    rerun = SagaFilter(attributes={RERUN_ATTRIBUTE: saga_id})
    found = await store.list_sagas(rerun, limit=MAX_RERUNS)
    return [SagaRef(saga_id=r.saga_id, status=r.status) for r in found]


async def tree(store: EventStore, saga_id: str) -> LineageNode:
    """The tree ``saga_id`` belongs to, from its root: each saga with its children."""
    root = saga_id
    for _ in range(MAX_DEPTH):
        first = await _started(store, root)
        if not isinstance(first, SagaStarted) or first.parent is None:
            break
        try:
            await store.get(first.parent.saga_id)
        except SagaNotFound:
            break  # its parent is gone (retention): the tree starts here
        root = first.parent.saga_id
    budget = [MAX_NODES]
    return await _node(store, root, "", budget)


async def _started(store: EventStore, saga_id: str) -> Event:
    try:
        return (await store.first_event(saga_id)).event
    except CodecError:
        # Its input is sealed and this process lacks the key: read it as operators do.
        loaded = await store.load(saga_id, undecodable=Undecodable.SHOW)
        return loaded.events[0].event


async def _node(store: EventStore, saga_id: str, step: str, budget: list[int]) -> LineageNode:
    budget[0] -= 1
    # Read as an operator reads: a payload this process cannot decode is shown as such.
    # Its current run only (the children it started in runs before are not listed): a
    # saga that loops for years keeps its lineage as small as one run.
    loaded = await store.load_run(saga_id, undecodable=Undecodable.SHOW)
    events = [stored.event for stored in loaded.events]
    node = LineageNode(
        saga_id=saga_id,
        saga_type=loaded.record.saga_type,
        status=loaded.record.status,
        step=step,
        children=[],
    )
    for child_id, child_type, child_step in children_of(saga_id, events):
        if budget[0] <= 0:
            node.truncated = True
            break
        try:
            node.children.append(await _node(store, child_id, child_step, budget))
        except SagaNotFound:
            node.children.append(
                LineageNode(saga_id=child_id, saga_type=child_type, step=child_step, children=[])
            )
    return node
