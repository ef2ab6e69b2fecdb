"""The batch-operation runner over the testing kit's engine and the in-memory stores:
each action on every matching saga, once, with the operation's id in its history, across
a crash between an action and its progress, rate-limited, and stopped by a cancel."""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import BaseModel

from saga_engine import Saga, SagaContext, SagaStatus, Signal
from saga_engine.core.history._decision import DropReason
from saga_engine.core.history._events import CancelRequested, SagaStarted, SignalReceived
from saga_engine.core.planning._batch_operations import (
    BatchAction,
    BatchFilter,
    BatchSpec,
    BatchState,
    reason_prefix,
    rerun_key_for,
)
from saga_engine.kernel._errors import StoreUnavailable
from saga_engine.kernel._settings import BatchSettings
from saga_engine.runner import _batch_operations
from saga_engine.runner._batch_operations import BatchOperationRunner
from saga_engine.store._membatch_operations import InMemoryBatchStore
from saga_engine.testing import SagaTestEnv


class Job(BaseModel):
    region: str


class Go(BaseModel):
    speed: int


class Done(BaseModel):
    speed: int = 0


class Waits(Saga[Job, Done]):
    name = "waits"
    search_attributes = ("region",)
    go = Signal(Go)

    async def run(self, ctx: SagaContext, job: Job) -> Done:
        got = await ctx.wait_signal(self.go)
        return Done(speed=got.speed)


class Crash(Exception):
    pass


async def _crash_then_take_over(env: SagaTestEnv, store: InMemoryBatchStore, at: int) -> None:
    """Runs operation ``op`` on an engine that crashes after its ``at``-th action (before
    recording it), then on another that takes over once the lease has expired."""
    hits = 0

    def crash(point: str) -> None:
        nonlocal hits
        hits += 1
        if hits == at:
            raise Crash(point)

    crashing = BatchOperationRunner(
        env.engine, env.store, store, _settings(), owner="e1", crash_hook=crash
    )
    with pytest.raises(Crash):
        await crashing.run_once()
    # The at-th saga was acted on, not recorded.
    assert (await store.get("op")).done == at - 1
    # Another engine takes over once the lease expired (here: at once).
    store._rows["op"] = dataclasses.replace(store._rows["op"], lease_until=None)
    await BatchOperationRunner(env.engine, env.store, store, _settings(), owner="e2").run_once()


def _settings(**kw: float) -> BatchSettings:
    return BatchSettings(**{"rate_per_s": 10_000, "page_size": 3, **kw})


async def _world(n: int, region: str = "eu") -> tuple[SagaTestEnv, list[str]]:
    env = SagaTestEnv([Waits])
    ids = [(await env.start(Waits, Job(region=region))).saga_id for _ in range(n)]
    return env, ids


def _spec(action: BatchAction, **kw: object) -> BatchSpec:
    where = BatchFilter(saga_type="waits", attributes={"region": "eu"})
    return BatchSpec(filter=where, action=action, reason="clean up", **kw)


async def _kinds(env: SagaTestEnv, saga_id: str) -> Counter[str]:
    return Counter(type(e).__name__ for e in await env.engine.history(saga_id))


async def test_cancel_acts_on_every_matching_saga_once_and_names_the_operation() -> None:
    env, ids = await _world(7)
    other = (await env.start(Waits, Job(region="us"))).saga_id
    store = InMemoryBatchStore()
    await store.create("op-1", _spec(BatchAction.CANCEL), "alice", 7, env.now())
    runner = BatchOperationRunner(env.engine, env.store, store, _settings(), owner="e1")
    assert await runner.run_once() is not None
    row = await store.get("op-1")
    assert row.state is BatchState.COMPLETED
    assert (row.acted, row.skipped, row.failed) == (7, 0, 0)
    for saga_id in ids:
        assert (await env.engine.get(saga_id)).status is SagaStatus.CANCELLED
        [cancel] = [e for e in await env.engine.history(saga_id) if isinstance(e, CancelRequested)]
        assert cancel.principal == "alice"
        assert cancel.reason == f"{reason_prefix('op-1')} clean up"
    assert (await env.engine.get(other)).status is SagaStatus.RUNNING  # not matched
    assert await runner.run_once() is None  # nothing left to claim


async def test_a_crash_between_an_action_and_its_progress_does_not_act_twice() -> None:
    env, ids = await _world(5)
    store = InMemoryBatchStore()
    await store.create(
        "op", _spec(BatchAction.SIGNAL, signal="go", payload={"speed": 3}), "bo", 5, env.now()
    )
    await _crash_then_take_over(env, store, at=3)
    assert (await store.get("op")).done == 5
    await env.settle()
    row = await store.get("op")
    assert (row.state, row.acted, row.skipped, row.failed) == (BatchState.COMPLETED, 4, 1, 0)
    for saga_id in ids:
        assert (await _kinds(env, saga_id))["SignalReceived"] == 1
        assert (await env.engine.get(saga_id)).status is SagaStatus.COMPLETED
        [signal] = [e for e in await env.engine.history(saga_id) if isinstance(e, SignalReceived)]
        assert signal.reason.startswith(reason_prefix("op"))


async def test_refused_actions_are_counted_with_their_reason() -> None:
    env, ids = await _world(3)
    await env.cancel(ids[0])  # cancelled already: a resume, a retry or a cancel is refused
    store = InMemoryBatchStore()
    await store.create("op", _spec(BatchAction.RESUME), "alice", 3, env.now())
    await BatchOperationRunner(env.engine, env.store, store, _settings(), owner="e").run_once()
    row = await store.get("op")
    assert (row.acted, row.failed) == (0, 3)
    assert {e["saga_id"] for e in row.errors} == set(ids)
    assert all(e["error"] for e in row.errors)
    await store.create("op-r", _spec(BatchAction.RETRY), "alice", 3, env.now())
    await BatchOperationRunner(env.engine, env.store, store, _settings(), owner="e").run_once()
    assert "no stuck step to retry" in (await store.get("op-r")).errors[-1]["error"]


async def test_the_rate_limit_spaces_the_actions() -> None:
    env, _ = await _world(6)
    store = InMemoryBatchStore()
    await store.create("op", _spec(BatchAction.CANCEL), "alice", 6, env.now())
    began = time.monotonic()
    await BatchOperationRunner(
        env.engine, env.store, store, _settings(rate_per_s=20), owner="e"
    ).run_once()
    assert time.monotonic() - began >= 5 / 20 * 0.9
    assert (await store.get("op")).acted == 6


async def test_a_cancelled_operation_stops_at_its_next_saga() -> None:
    env, ids = await _world(6)
    store = InMemoryBatchStore()
    await store.create("op", _spec(BatchAction.CANCEL), "alice", 6, env.now())
    hits = 0

    def cancel_after_two(point: str) -> None:
        nonlocal hits
        hits += 1
        if hits == 2:
            store._rows["op"] = dataclasses.replace(store._rows["op"], state=BatchState.CANCELLED)

    await BatchOperationRunner(
        env.engine, env.store, store, _settings(), owner="e", crash_hook=cancel_after_two
    ).run_once()
    statuses = [(await env.engine.get(i)).status for i in sorted(ids)]
    assert statuses.count(SagaStatus.CANCELLED) == 2
    assert statuses.count(SagaStatus.RUNNING) == 4


async def test_one_broken_saga_is_counted_and_an_outage_is_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env, ids = await _world(4)
    broken, flaky = sorted(ids)[1], sorted(ids)[2]
    real = _batch_operations.ACTIONS[BatchAction.CANCEL]
    outages = [StoreUnavailable("postgres restarting")]

    async def act(engine: Any, op: Any, saga_id: str, events: Any, why: str) -> object:
        if saga_id == broken:
            raise RuntimeError("a bug on one saga")
        if saga_id == flaky and outages:
            raise outages.pop()
        return await real(engine, op, saga_id, events, why)

    monkeypatch.setitem(_batch_operations.ACTIONS, BatchAction.CANCEL, act)
    store = InMemoryBatchStore()
    await store.create("op", _spec(BatchAction.CANCEL), "alice", 4, env.now())
    runner = BatchOperationRunner(env.engine, env.store, store, _settings(), owner="e")
    with pytest.raises(StoreUnavailable):
        await runner.run_once()
    assert (await store.get("op")).done == 2  # the outage stopped it before the flaky one
    await runner.run_once()  # its own lease: it goes on from the cursor
    row = await store.get("op")
    assert (row.state, row.acted, row.failed) == (BatchState.COMPLETED, 3, 1)
    assert row.errors == [{"saga_id": broken, "error": "a bug on one saga"}]
    assert (await env.engine.get(flaky)).status is SagaStatus.CANCELLED


async def test_an_input_the_saga_drops_is_counted_as_failed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env, _ = await _world(2)

    async def dropped(engine: Any, op: Any, saga_id: str, events: Any, why: str) -> object:
        return SimpleNamespace(dropped=DropReason.PARKED)  # a decision that records nothing

    monkeypatch.setitem(_batch_operations.ACTIONS, BatchAction.CANCEL, dropped)
    store = InMemoryBatchStore()
    await store.create("op", _spec(BatchAction.CANCEL), "alice", 2, env.now())
    await BatchOperationRunner(env.engine, env.store, store, _settings(), owner="e").run_once()
    row = await store.get("op")
    assert (row.acted, row.failed) == (0, 2)
    assert row.errors[0]["error"] == "the saga dropped it (parked)"


async def _reruns_of(env: SagaTestEnv, saga_id: str) -> list[SagaStarted]:
    """The sagas started as reruns of ``saga_id``, read from every history in the store."""
    found = []
    for record in await env.store.list_sagas(limit=1000):
        started = (await env.engine.history(record.saga_id))[0]
        assert isinstance(started, SagaStarted)
        if started.rerun_of is not None and started.rerun_of.saga_id == saga_id:
            found.append(started)
    return found


async def test_a_rerun_after_a_crash_starts_no_second_saga() -> None:
    env, ids = await _world(4)
    store = InMemoryBatchStore()
    await store.create("op", _spec(BatchAction.RERUN), "bo", 4, env.now())
    await _crash_then_take_over(env, store, at=2)  # the second rerun started, not recorded
    row = await store.get("op")
    # The reruns match the filter too (same type, same region, running): passed over,
    # neither re-run nor counted.
    assert (row.state, row.acted, row.skipped, row.failed) == (BatchState.COMPLETED, 3, 1, 0)
    for saga_id in ids:
        [rerun] = await _reruns_of(env, saga_id)
        assert rerun.input == {"region": "eu"}
        assert rerun.rerun_of is not None
        assert rerun.rerun_of.principal == "bo"
        assert rerun.rerun_of.reason == f"{reason_prefix('op')} clean up"
        assert rerun.idempotency_key == rerun_key_for("op", saga_id)
        assert (await env.engine.get(saga_id)).status is SagaStatus.RUNNING  # untouched
    assert len(await env.store.list_sagas(limit=1000)) == 8


async def test_a_shard_that_does_not_answer_holds_the_operation_rather_than_skip_its_sagas() -> (
    None
):
    """Past one database the listing is merged across shards; one that does not answer
    would leave its sagas out of the page and the cursor would pass them for good: the
    page fails instead, and the operation goes on from its cursor once the shard is back."""
    from saga_engine.kernel._errors import ShardUnavailable
    from saga_engine.kernel._shards import ShardMap
    from saga_engine.store._memstore import InMemoryEventStore
    from saga_engine.store._sharded import ShardedEventStore
    from saga_engine.store._store import EventStore

    class Flaky(InMemoryEventStore):
        down = False

        async def list_sagas(self, *args: Any, **kwargs: Any) -> Any:
            if self.down:
                raise ShardUnavailable("b", "connection refused")
            return await super().list_sagas(*args, **kwargs)

    a, b = InMemoryEventStore(), Flaky()

    async def open_a() -> EventStore:
        return a

    async def open_b() -> EventStore:
        return b

    shard_map = ShardMap.build({"a": "0-3", "b": "4-7"}, 8)
    env = SagaTestEnv([Waits], store=ShardedEventStore(shard_map, {"a": open_a, "b": open_b}))
    ids = [(await env.start(Waits, Job(region="eu"))).saga_id for _ in range(12)]
    assert {shard_map.shard_of_saga(i) for i in ids} == {"a", "b"}
    b.down = True
    store = InMemoryBatchStore()
    await store.create("op", _spec(BatchAction.CANCEL), "alice", 12, env.now())
    runner = BatchOperationRunner(env.engine, env.store, store, _settings(), owner="e1")
    with pytest.raises(ShardUnavailable, match="'b'"):
        await runner.run_once()
    row = await store.get("op")
    assert (row.state, row.done, row.cursor) == (BatchState.RUNNING, 0, None)
    b.down = False
    store._rows["op"] = dataclasses.replace(store._rows["op"], lease_until=None)
    await runner.run_once()
    row = await store.get("op")
    assert (row.state, row.acted) == (BatchState.COMPLETED, 12)
