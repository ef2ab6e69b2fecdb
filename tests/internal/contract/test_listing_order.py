"""The listing by last activity and the counts per status, on both adapters: the same
order (ties included), the same pages, the same counts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from saga_engine.core.history._events import ParentLink, SagaStarted, TimerFired
from saga_engine.core.history._status import SagaStatus
from saga_engine.store._store import (
    Append,
    EventStore,
    NewSaga,
    Projection,
    SagaFilter,
    SagaRecord,
)
from tests.internal.contract.test_event_store import backend, store  # noqa: F401

T = datetime(2030, 1, 1, tzinfo=UTC)
S = SagaStatus


def _at(minutes: int) -> datetime:
    return T + timedelta(minutes=minutes)


async def _saga(
    store: EventStore,  # noqa: F811
    saga_id: str,
    status: SagaStatus,
    at: int,
    *,
    saga_type: str = "order",
    parent: str | None = None,
    moved: int | None = None,
) -> None:
    link = ParentLink(saga_id=parent, command_id="c-1") if parent else None
    started = SagaStarted(at=_at(at), saga_type=saga_type, input={}, parent=link)
    assert await store.create(
        NewSaga(saga_id, saga_type, [started], Projection(status), search={"region": "eu"})
    )
    if moved is not None:  # a later event: updated_at moves, an ended saga's end does not
        fired = TimerFired(at=_at(moved), timer_id="t")
        await store.append(Append(saga_id, 1, [fired], Projection(status)))


async def _world(store: EventStore) -> list[str]:  # noqa: F811
    """Sagas open and ended, with a tie of three (two open, one ended) at minute 6; the
    order by activity they must come in."""
    await _saga(store, "e-1", S.COMPLETED, 2, moved=9)  # ended at 2, changed at 9
    await _saga(store, "o-2", S.STEP_STUCK, 3)
    await _saga(store, "e-2", S.FAILED, 4, saga_type="payment")
    await _saga(store, "o-1", S.RUNNING, 1, moved=5)
    await _saga(store, "t-a", S.RUNNING, 6)
    await _saga(store, "t-c", S.CANCELLED, 6)
    await _saga(store, "t-b", S.COMPENSATING, 6)
    await _saga(store, "c-1", S.RUNNING, 7, parent="o-1")
    return ["c-1", "t-c", "t-b", "t-a", "o-1", "e-2", "o-2", "e-1"]


def _ids(rows: list[SagaRecord]) -> list[str]:
    return [r.saga_id for r in rows]


async def test_listing_by_activity_is_newest_first_ties_by_id(store: EventStore) -> None:  # noqa: F811
    expected = await _world(store)
    rows = await store.list_sagas(order="activity")
    assert _ids(rows) == expected
    # Last activity: the end of an ended saga, the last change of an open one.
    by_id = {r.saga_id: r for r in rows}
    assert by_id["e-1"].activity_at == _at(2)
    assert by_id["e-1"].ended_at == _at(2)
    assert by_id["o-1"].activity_at == _at(5)
    assert by_id["o-1"].ended_at is None
    assert by_id["c-1"].parent_id == "o-1"
    assert by_id["o-1"].parent_id is None
    # The id order is still there, and unchanged.
    assert _ids(await store.list_sagas()) == sorted(expected)


async def test_activity_pages_cut_through_ties(store: EventStore) -> None:  # noqa: F811
    expected = await _world(store)
    for size in (1, 2, 3, 5):
        seen: list[str] = []
        after: tuple[datetime, str] | None = None
        while True:
            page = await store.list_sagas(order="activity", limit=size, after_activity=after)
            seen += _ids(page)
            if len(page) < size:
                break
            after = (page[-1].activity_at, page[-1].saga_id)
        assert seen == expected, size


async def test_activity_order_with_filters(store: EventStore) -> None:  # noqa: F811
    await _world(store)

    async def ids(
        limit: int = 100, after_activity: tuple[datetime, str] | None = None, **filters: Any
    ) -> list[str]:
        where = SagaFilter(**filters)
        return _ids(
            await store.list_sagas(
                where, order="activity", limit=limit, after_activity=after_activity
            )
        )

    assert await ids(statuses=[S.RUNNING, S.COMPLETED]) == ["c-1", "t-a", "o-1", "e-1"]
    assert await ids(statuses=[S.CANCELLED]) == ["t-c"]  # the ended branch alone
    assert await ids(statuses=[S.STEP_STUCK]) == ["o-2"]  # the open branch alone
    assert await ids(statuses=[]) == []
    assert await ids(saga_type="payment") == ["e-2"]
    assert await ids(roots_only=True) == ["t-c", "t-b", "t-a", "o-1", "e-2", "o-2", "e-1"]
    assert await ids(search="t-", limit=2) == ["t-c", "t-b"]
    assert await ids(attributes={"region": "eu"}, statuses=[S.RUNNING]) == ["c-1", "t-a", "o-1"]
    assert await ids(updated_after=_at(6), created_before=_at(7)) == ["t-c", "t-b", "t-a", "e-1"]
    after = (_at(6), "t-b")
    assert await ids(after_activity=after, roots_only=True, limit=2) == ["t-a", "o-1"]
    assert await ids(after_activity=after, statuses=[S.FAILED, S.RUNNING]) == [
        "t-a",
        "o-1",
        "e-2",
    ]


async def test_counts_per_status_follow_the_filters(store: EventStore) -> None:  # noqa: F811
    await _world(store)
    every = {
        S.RUNNING: 3,
        S.STEP_STUCK: 1,
        S.COMPENSATING: 1,
        S.COMPLETED: 1,
        S.FAILED: 1,
        S.CANCELLED: 1,
    }
    assert await store.count_by_status(cap=100) == every
    assert await store.count_by_status(cap=2) == {**every, S.RUNNING: 2}
    assert await store.count_by_status(SagaFilter(roots_only=True), cap=100) == {
        **every,
        S.RUNNING: 2,
    }
    assert await store.count_by_status(SagaFilter(saga_type="payment"), cap=100) == {S.FAILED: 1}
    assert await store.count_by_status(SagaFilter(search="t-"), cap=100) == {
        S.RUNNING: 1,
        S.COMPENSATING: 1,
        S.CANCELLED: 1,
    }
    assert await store.count_by_status(SagaFilter(attributes={"region": "us"}), cap=100) == {}
    # The statuses filter the counts too (the admin's tabs count without them).
    some = SagaFilter(statuses=frozenset({S.RUNNING, S.FAILED}))
    assert await store.count_by_status(some, cap=100) == {S.RUNNING: 3, S.FAILED: 1}
    assert await store.count_by_status(SagaFilter(statuses=frozenset()), cap=100) == {}
