"""The batch-operation store contract, run against both adapters.

``postgres``: two stores on two pools stand for two engines; they meet only in Postgres.
``memory``: one in-memory store that both "engines" share.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import SecretStr

from saga_engine.core.history._status import SagaStatus
from saga_engine.core.planning._batch_operations import (
    BatchAction,
    BatchFilter,
    BatchSpec,
    BatchState,
)
from saga_engine.kernel._errors import BatchNotFound, InvalidTransition
from saga_engine.kernel._settings import PostgresSettings
from saga_engine.store._batch_operation_store import (
    MAX_ERRORS,
    BatchStore,
    Dealt,
    Lease,
    SagaActionOutcome,
)
from saga_engine.store._membatch_operations import InMemoryBatchStore
from saga_engine.store._migrations import migrate
from saga_engine.store._pgbatch_operations import PostgresBatchStore
from tests.conftest import PgTarget

pytestmark = pytest.mark.integration

T0 = datetime(2030, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=30)
SPEC = BatchSpec(
    filter=BatchFilter(statuses=[SagaStatus.RUNNING], saga_type="order", attributes={"k": "v"}),
    action=BatchAction.SIGNAL,
    reason="approve them all",
    signal="approval",
    payload={"ok": True},
)


@pytest.fixture(params=["memory", "postgres"])
async def stores(
    request: pytest.FixtureRequest, pg: PgTarget
) -> AsyncIterator[tuple[BatchStore, BatchStore]]:
    """Two engines' stores over one database."""
    if request.param == "memory":
        one = InMemoryBatchStore()
        two = InMemoryBatchStore()
        two._rows = one._rows
        yield one, two
        return
    await migrate(pg.database_dsn, pg.schema)
    settings = PostgresSettings(dsn=SecretStr(pg.database_dsn), db_schema=pg.schema)
    a = await PostgresBatchStore.connect(settings)
    b = await PostgresBatchStore.connect(settings)
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


async def test_create_get_list(stores: tuple[BatchStore, BatchStore]) -> None:
    store, _ = stores
    first = await store.create("op-1", SPEC, "alice", 7, T0)
    await store.create("op-2", SPEC, "bob", 0, T0 + timedelta(seconds=1))
    assert first.state is BatchState.RUNNING
    assert (first.total, first.done, first.cursor, first.errors) == (7, 0, None, [])
    got = await store.get("op-1")
    assert got.spec == SPEC
    assert got.principal == "alice"
    assert [r.operation_id for r in await store.list()] == ["op-2", "op-1"]
    assert [r.operation_id for r in await store.list(limit=1)] == ["op-2"]
    with pytest.raises(BatchNotFound):
        await store.get("nope")


async def test_one_engine_holds_an_operation_until_its_lease_expires(
    stores: tuple[BatchStore, BatchStore],
) -> None:
    one, two = stores
    assert await one.claim(Lease("a", T0, LEASE)) is None
    await one.create("op", SPEC, "alice", 3, T0)
    claimed = await one.claim(Lease("a", T0, LEASE))
    assert claimed is not None
    assert claimed.lease_owner == "a"
    # The other engine finds nothing while the lease lasts; its holder may claim again.
    assert await two.claim(Lease("b", T0 + timedelta(seconds=29), LEASE)) is None
    again = await one.claim(Lease("a", T0 + timedelta(seconds=1), LEASE))
    assert again is not None
    assert again.operation_id == "op"
    # Expired (the holder crashed): the other takes it over, and the first is fenced.
    taken = await two.claim(Lease("b", T0 + timedelta(seconds=32), LEASE))
    assert taken is not None
    assert taken.lease_owner == "b"
    assert not await one.advance("op", Lease("a", T0, LEASE), Dealt("s1", SagaActionOutcome.ACTED))
    assert (await one.get("op")).done == 0


async def test_concurrent_claims_give_the_operation_to_one(
    stores: tuple[BatchStore, BatchStore],
) -> None:
    one, two = stores
    await one.create("op", SPEC, "alice", 3, T0)
    got = await asyncio.gather(one.claim(Lease("a", T0, LEASE)), two.claim(Lease("b", T0, LEASE)))
    assert sum(r is not None for r in got) == 1


async def test_progress_counts_moves_the_cursor_and_keeps_the_first_errors(
    stores: tuple[BatchStore, BatchStore],
) -> None:
    store, _ = stores
    await store.create("op", SPEC, "alice", 3, T0)
    assert await store.claim(Lease("a", T0, LEASE)) is not None
    at = T0 + timedelta(seconds=10)
    assert await store.advance("op", Lease("a", at, LEASE), Dealt("s1", SagaActionOutcome.ACTED))
    assert await store.advance("op", Lease("a", at, LEASE), Dealt("s2", SagaActionOutcome.SKIPPED))
    for i in range(MAX_ERRORS + 2):
        failed = Dealt(f"s3-{i:03d}", SagaActionOutcome.FAILED, error="no")
        assert await store.advance("op", Lease("a", at, LEASE), failed)
    assert await store.advance("op", Lease("a", at, LEASE))  # a renewal alone
    row = await store.get("op")
    assert (row.acted, row.skipped, row.failed) == (1, 1, MAX_ERRORS + 2)
    assert row.cursor == f"s3-{MAX_ERRORS + 1:03d}"
    assert len(row.errors) == MAX_ERRORS
    assert row.errors[0] == {"saga_id": "s3-000", "error": "no"}
    assert row.lease_until == at + LEASE
    assert await store.finish("op", "a", at)
    done = await store.get("op")
    assert done.state is BatchState.COMPLETED
    assert done.finished_at == at
    assert not await store.advance(
        "op", Lease("a", at, LEASE), Dealt("s9", SagaActionOutcome.ACTED)
    )
    assert not await store.finish("op", "a", at)
    assert await store.claim(Lease("a", at, LEASE)) is None


async def test_cancel_stops_the_holder_and_only_a_running_operation(
    stores: tuple[BatchStore, BatchStore],
) -> None:
    one, two = stores
    await one.create("op", SPEC, "alice", 3, T0)
    assert await one.claim(Lease("a", T0, LEASE)) is not None
    cancelled = await two.cancel("op", T0 + timedelta(seconds=1))
    assert cancelled.state is BatchState.CANCELLED
    assert cancelled.lease_owner is None
    assert not await one.advance("op", Lease("a", T0, LEASE), Dealt("s1", SagaActionOutcome.ACTED))
    assert not await one.finish("op", "a", T0)
    assert (await one.get("op")).state is BatchState.CANCELLED
    assert await two.claim(Lease("b", T0 + timedelta(hours=1), LEASE)) is None
    with pytest.raises(InvalidTransition):
        await one.cancel("op", T0)
    with pytest.raises(BatchNotFound):
        await one.cancel("nope", T0)
