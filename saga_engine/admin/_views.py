"""What the API shows about a saga: its record, and the fold of its history.

Every fact beyond the stored record (what it waits for, what is in flight, what is owed)
comes from :func:`saga_engine.core.views._view.saga_view_of`, the one fold the web page and the CLI use too.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from saga_engine.admin._lineage import parent_of, rerun_of, trigger_of
from saga_engine.admin._schemas import (
    ChildRef,
    InFlightCommand,
    PendingCompensation,
    RunInfo,
    SagaAction,
    SagaDetail,
    SagaListItem,
    SagaRef,
    SagaSummary,
    StepProgress,
    WaitingFor,
)
from saga_engine.admin._step_board import StepReport
from saga_engine.core.authoring._definition import SagaRegistry
from saga_engine.core.history._events import Event
from saga_engine.core.history._fold import Awaited
from saga_engine.core.runtime._runtime import SagaRuntime
from saga_engine.core.views._graph_view import GraphState, declared_graph, graph_state
from saga_engine.core.views._view import SagaView, Wait, saga_view_of
from saga_engine.kernel._errors import SagaError
from saga_engine.store._store import EventStore, SagaRecord


def summary(record: SagaRecord) -> SagaSummary:
    return SagaSummary(
        saga_id=record.saga_id,
        saga_type=record.saga_type,
        status=record.status,
        current_step=record.current_step,
        next_wakeup=record.next_wakeup,
        error=record.error,
        created_at=record.created_at,
        updated_at=record.updated_at,
        saga_version=record.saga_version,
    )


def list_item(record: SagaRecord, waits: Iterable[Wait] = ()) -> SagaListItem:
    """A row of the list: ``waits`` are the fold's (``_listing.waits_of``)."""
    return SagaListItem(
        **summary(record).model_dump(),
        activity_at=record.activity_at,
        ended_at=record.ended_at,
        waiting_for=[WaitingFor.model_validate(w, from_attributes=True) for w in waits],
        search_attributes=record.search or {},
        parent_id=record.parent_id,
    )


def awaited(registry: SagaRegistry, record: SagaRecord, events: Sequence[Event]) -> Awaited:
    """What the saga's code still waits for, which its history does not say (a wait for
    a signal without a deadline; a wait the code gave up, the loser of a race): the
    history replayed under the code deployed here says (``SagaRuntime.awaited``).
    Unknown (every wait the history leaves open counts) for an ended or parked saga, a
    type not deployed here, or a history the code cannot replay (the status says why)."""
    if not record.status.is_open or record.status.is_parked or not events:
        return Awaited()
    try:
        definition = registry.for_history(record.saga_type, events)
        runtime, _ = SagaRuntime.replay(definition, record.saga_id, list(events))
    except SagaError:
        return Awaited()
    try:
        return runtime.awaited() or Awaited()
    finally:
        runtime.close()


def view_of(
    record: SagaRecord, events: Sequence[Event], awaited: Awaited | None = None
) -> SagaView:
    return saga_view_of(events, saga_id=record.saga_id, awaited=awaited or Awaited())


def detail(
    record: SagaRecord,
    events: Sequence[Event],
    awaited: Awaited | None = None,
    children: Sequence[ChildRef] = (),
    reruns: Sequence[SagaRef] = (),
    reports: Sequence[StepReport] = (),
) -> SagaDetail:
    view = view_of(record, events, awaited)
    return detail_of(record, view, events, children, reruns, reports)


def detail_of(
    record: SagaRecord,
    view: SagaView,
    events: Sequence[Event] = (),
    children: Sequence[ChildRef] = (),
    reruns: Sequence[SagaRef] = (),
    reports: Sequence[StepReport] = (),
) -> SagaDetail:
    """``reports``: participants' reports on the commands in flight (``tx.progress``)."""
    return SagaDetail(
        **summary(record).model_dump(),
        input=view.input,
        output=view.output,
        # The view's dataclasses carry the schemas' fields by the same names.
        waiting_for=[WaitingFor.model_validate(w, from_attributes=True) for w in view.waiting_for],
        in_flight=[
            InFlightCommand(
                step=f.step,
                command_id=f.command_id,
                attempt=f.attempt,
                participant=f.participant,
                command_type=f.command_type,
                compensation=f.compensation,
                since=f.since,
                timeout_at=f.timeout_at,
                held=f.held.message if f.held is not None else None,
                progress=[
                    StepProgress(attempt=r.attempt, seq=r.seq, at=r.at, body=r.body)
                    for r in reports
                    if r.command_id == f.command_id
                ],
            )
            for f in view.in_flight
        ],
        actions=[SagaAction(name=a.name, steps=list(a.steps)) for a in view.actions],
        pending_compensations=[
            PendingCompensation.model_validate(o, from_attributes=True) for o in view.owed
        ],
        deadline_at=view.deadline_at,
        idempotency_key=record.idempotency_key,
        events=view.events,
        parent=parent_of(events),
        trigger=trigger_of(events),
        children=list(children),
        rerun_of=rerun_of(events),
        reruns=list(reruns),
        pivot_step=view.pivot_step,
        past_pivot=view.past_pivot,
        run=view.run,
        parked_steps=list(view.parked_steps),
    )


def graph_of(
    registry: SagaRegistry, record: SagaRecord, view: SagaView, events: Sequence[Event]
) -> GraphState | None:
    """A graph saga's declared graph (of the version it runs) with each node's state;
    None for a saga written as code (UnknownSagaType for a type not deployed here)."""
    graph = declared_graph(registry.for_history(record.saga_type, events))
    return None if graph is None else graph_state(graph, view, events)


async def with_runs(store: EventStore, detail: SagaDetail, bound: int) -> SagaDetail:
    """``detail`` with the saga's chain of runs, and a warning when its current run has
    passed ``bound`` events (``engine.continue_as_new_after``) without continuing."""
    runs = await store.runs(detail.saga_id)
    current = runs[-1].events if runs else detail.events
    warning = (
        f"its run {len(runs)} has {current} events, past engine.continue_as_new_after="
        f"{bound}: its memory and replay time grow with it; its code should call "
        "ctx.continue_as_new when ctx.should_continue_as_new() (docs/continue-as-new.md)"
        if current >= bound and not detail.status.is_terminal
        else None
    )
    return detail.model_copy(
        update={
            "runs": [RunInfo(run=r.run, first_seq=r.first_seq, events=r.events) for r in runs],
            "history_warning": warning,
        }
    )
