"""The rollout store and saga versions, against every adapter (memory and Postgres): the
in-memory store behaves like the tables of migration 0008."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from saga_engine.core.history._events import SagaStarted
from saga_engine.core.history._status import SagaStatus
from saga_engine.core.planning._rollout import RolloutSpec, RolloutStore
from saga_engine.store._store import EventStore, NewSaga, Projection, SagaFilter
from tests.internal.contract.test_event_store import BACKENDS, Backend, backend_of, store

__all__ = ["store"]  # the fixture, shared with the event store's contract


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Backend:
    """The event store's backends; past one database (the sharded ones) the rollouts
    live in the control database, which the sharded store hands them to (issue 43)."""
    return backend_of(request)


AT = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _rollouts(store: EventStore) -> RolloutStore:
    assert isinstance(store, RolloutStore)
    return store


async def test_set_read_and_audit_a_rollout(store: EventStore) -> None:
    rollouts = _rollouts(store)
    assert await rollouts.rollouts() == []
    dark = RolloutSpec(version=2, percent=0)
    first = await rollouts.set_rollout(
        "order", dark, principal="olivia", reason="deploy v2 dark", at=AT
    )
    assert (first.before, first.after) == (None, dark)
    ten = RolloutSpec(version=2, percent=10, predicate="beta")
    second = await rollouts.set_rollout(
        "order", ten, principal="oscar", reason="canary", at=AT + timedelta(minutes=5)
    )
    assert (second.before, second.after) == (dark, ten)
    await rollouts.set_rollout("other", dark, principal="olivia", reason="x", at=AT)

    [row, _] = await rollouts.rollouts()
    assert (row.saga_type, row.version, row.percent, row.predicate) == ("order", 2, 10, "beta")
    assert (row.updated_by, row.updated_at) == ("oscar", AT + timedelta(minutes=5))

    trail = await rollouts.rollout_audit("order")
    assert [(c.principal, c.reason, c.before, c.after) for c in trail] == [
        ("oscar", "canary", dark, ten),
        ("olivia", "deploy v2 dark", None, dark),
    ]
    assert len(await rollouts.rollout_audit()) == 3
    assert len(await rollouts.rollout_audit("order", limit=1)) == 1

    removed = await rollouts.set_rollout("order", None, principal="olivia", reason="done", at=AT)
    assert (removed.before, removed.after) == (ten, None)
    assert [r.saga_type for r in await rollouts.rollouts()] == ["other"]


async def test_a_saga_keeps_its_version_in_its_record(store: EventStore) -> None:
    for saga_id, version in (("s-1", 1), ("s-2", 2), ("s-3", 3)):
        started = SagaStarted(at=AT, saga_type="order", input={}, saga_version=version)
        created = await store.create(
            NewSaga(
                saga_id, "order", [started], Projection(SagaStatus.RUNNING), saga_version=version
            )
        )
        assert created
    assert [(await store.get(i)).saga_version for i in ("s-1", "s-2", "s-3")] == [1, 2, 3]
    listed = await store.list_sagas(SagaFilter(saga_type="order"))
    assert [r.saga_version for r in listed] == [1, 2, 3]
    loaded = await store.load("s-2")
    assert loaded.record.saga_version == 2
    first = loaded.events[0].event
    assert isinstance(first, SagaStarted)
    assert first.saga_version == 2
