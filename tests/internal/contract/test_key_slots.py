"""The key slots of per-key concurrency (``KeySlotStore``), against every adapter
(memory and Postgres): the in-memory store behaves like migration 0012's table."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from saga_engine.core.history._events import SagaCancelled
from saga_engine.core.history._status import SagaStatus
from saga_engine.store._keyslots import KeySlotStore, KeyTurn
from saga_engine.store._pgstore import PostgresEventStore
from saga_engine.store._store import Append, EventStore, Projection
from tests.internal.contract.test_event_store import _new, backend, pg_store, store

__all__ = ["backend", "pg_store", "store"]  # the fixtures, shared with the event store's

AT = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _slots(store: EventStore) -> KeySlotStore:
    assert isinstance(store, KeySlotStore)
    return store


async def _ask(store: EventStore, saga_id: str, key: str = "acct-1", limit: int = 1) -> KeyTurn:
    await store.create(_new(saga_id, "transfer"))
    return await _slots(store).acquire_key("transfer", key, saga_id, limit, AT)


async def test_the_first_holds_the_others_queue_fifo(store: EventStore) -> None:
    assert await _ask(store, "s-1") == KeyTurn(True, ("s-1",), 0)
    assert await _ask(store, "s-2") == KeyTurn(False, ("s-1",), 1)
    assert await _ask(store, "s-3") == KeyTurn(False, ("s-1",), 2)
    # Another key, and another type with the same key, are not limited by these.
    assert (await _ask(store, "s-4", key="acct-2")).held
    assert (await _slots(store).acquire_key("other", "acct-1", "s-5", 1, AT)).held
    # Asking again keeps the saga's place.
    assert await _slots(store).acquire_key("transfer", "acct-1", "s-3", 1, AT) == KeyTurn(
        False, ("s-1",), 2
    )
    rows = await _slots(store).key_slots("transfer", "acct-1")
    assert [(r.saga_id, r.held, r.limit) for r in rows] == [
        ("s-1", True, 1),
        ("s-2", False, 1),
        ("s-3", False, 1),
    ]


async def test_a_release_grants_the_head_of_the_queue(store: EventStore) -> None:
    for saga_id in ("s-1", "s-2", "s-3"):
        await _ask(store, saga_id)
    slots = _slots(store)
    assert await slots.release_key("s-2", AT) == []  # a queued one leaves: nobody moves
    assert await slots.release_key("s-1", AT) == ["s-3"]
    assert await slots.release_key("s-1", AT) == []  # released already: nothing
    [row] = await slots.key_slots("transfer")
    assert (row.saga_id, row.held, row.acquired_at) == ("s-3", True, AT)
    assert await slots.release_key("nobody", AT) == []


async def test_a_limit_of_three_holds_three(store: EventStore) -> None:
    turns = [await _ask(store, f"s-{i}", limit=3) for i in range(5)]
    assert [t.held for t in turns] == [True, True, True, False, False]
    assert turns[4] == KeyTurn(False, ("s-0", "s-1", "s-2"), 2)
    assert await _slots(store).release_key("s-1", AT) == ["s-3"]


async def test_the_sweep_releases_sagas_that_ended(store: EventStore) -> None:
    await _ask(store, "s-1")
    await _ask(store, "s-2")
    await _ask(store, "s-3", key="acct-2")
    slots = _slots(store)
    assert await slots.sweep_keys(AT) == []  # all running: nothing to release
    await store.create(_new("s-9", "transfer", SagaStatus.COMPLETED))
    await slots.acquire_key("transfer", "acct-3", "s-9", 1, AT)
    # s-1 ends (its engine died before releasing its slot): the sweep releases it.
    loaded = await store.load("s-1")
    await store.append(
        Append(
            "s-1",
            loaded.record.last_seq,
            [SagaCancelled(at=AT, reason="x")],
            Projection(SagaStatus.CANCELLED),
        )
    )
    assert sorted(await slots.sweep_keys(AT)) == ["s-2"]
    assert [(r.saga_id, r.held) for r in await slots.key_slots()] == [
        ("s-2", True),
        ("s-3", True),
    ]


async def test_concurrent_asks_on_one_key_grant_one_slot(pg_store: PostgresEventStore) -> None:
    # Twenty connections ask at once: the advisory lock lets exactly one through.
    ids = [f"c-{i}" for i in range(20)]
    for saga_id in ids:
        await pg_store.create(_new(saga_id, "transfer"))
    turns = await asyncio.gather(*(pg_store.acquire_key("transfer", "hot", i, 1, AT) for i in ids))
    assert sum(t.held for t in turns) == 1
    assert sorted(t.position for t in turns if not t.held) == list(range(1, 20))
    holder = next(i for i, t in zip(ids, turns, strict=True) if t.held)
    releases = await asyncio.gather(
        pg_store.release_key(holder, AT), *(pg_store.release_key(holder, AT) for _ in range(3))
    )
    assert sum(len(r) for r in releases) == 1  # one successor, granted once
