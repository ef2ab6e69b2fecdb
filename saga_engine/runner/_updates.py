"""What the engine needs beyond the one path for updates and queries: an update's
answer as recorded, and a query answered from a saga's replayed state.

An update goes through the one path like a signal (a batch of one); its answer is the
``update_completed`` its decision recorded, or, asked again with the same update id, the
one in its history. A query writes nothing: a saga in memory is asked under its lock (so
it never sees a decision whose write is still under way); any other is replayed from its
history into a copy that is asked and dropped.
"""

from __future__ import annotations

from typing import Any

from saga_engine.core.authoring._definition import SagaRegistry
from saga_engine.core.history._events import Event, UpdateCompleted
from saga_engine.core.runtime._runtime import SagaRuntime
from saga_engine.core.runtime._updating import recorded_answer
from saga_engine.kernel._serde import JsonDict
from saga_engine.runner._cache import LiveSagas
from saga_engine.runner._clock import Clock
from saga_engine.store._store import EventStore


async def answer_of(
    store: EventStore, saga_id: str, update_id: str, events: list[Event]
) -> UpdateCompleted | None:
    """The update's recorded answer: in ``events`` (a decision's), else in its history."""
    found = recorded_answer(events, update_id)
    if found is not None:
        return found
    loaded = await store.load_run(saga_id)
    return recorded_answer((stored.event for stored in loaded.events), update_id)


async def ask(
    store: EventStore,
    registry: SagaRegistry,
    live: LiveSagas,
    clock: Clock,
    saga_id: str,
    name: str,
    args: JsonDict,
) -> Any:
    """The answer of query ``name`` from the saga's state; nothing is written."""
    async with live.locks.hold(saga_id):
        held = live.get(saga_id)
        if held is not None and not held.runtime.dead:
            # Another engine may have written since (an update it took): the copy in
            # memory answers only while it is as far as the store.
            record = await store.get(saga_id)
            if record.last_seq == held.committed_seq == held.runtime.last_seq:
                return held.runtime.query(name, args)
    loaded = await store.load_run(saga_id)
    events = [stored.event for stored in loaded.events]
    definition = registry.for_history(loaded.record.saga_type, events)
    # A copy: what its replay would record (a park) is dropped, never written.
    runtime, _ = SagaRuntime.replay(definition, saga_id, events, now=clock.now())
    try:
        return runtime.query(name, args)
    finally:
        runtime.close()
