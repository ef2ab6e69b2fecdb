"""Two engine instances: an operator's action applied through the instance that does NOT
own the saga (its admin API calls its own engine) reaches the owner, which goes on."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from pydantic import BaseModel

from saga_engine import KafkaUnavailable, Saga, SagaContext, SagaStatus, Settings, Signal
from saga_engine.client import SagaClient
from saga_engine.events import event_to_dict
from saga_engine.settings import AdminSettings, EngineSettings, KafkaSettings, PostgresSettings
from saga_engine.worker import SagaWorker
from tests.conftest import PgTarget
from tests.integration.kafka_helpers import fake_participant
from tests.waiting import eventually

pytestmark = pytest.mark.integration


class Order(BaseModel):
    n: int = 1


class Done(BaseModel):
    ok: bool = True


class Cmd(BaseModel):
    n: int


class Undo(BaseModel):
    n: int


class Go(BaseModel):
    pass


class Ship(BaseModel):
    n: int


class Gated(Saga[Order, Done]):
    """Waits for an operator's go; then its second step: at once (n=1), after a short
    durable sleep (n=2), or once shipped (n=3, the shipment's n goes to the step). With
    n=4 it sleeps first, then waits for the go."""

    name = "gated"
    go = Signal(Go)
    ship = Signal(Ship)

    async def run(self, ctx: SagaContext, input: Order) -> Done:
        n = input.n
        await ctx.step("first", to="alpha", command=Cmd(n=n), compensate=Undo(n=n))
        if n == 4:
            await ctx.sleep(timedelta(seconds=2))
        await ctx.wait_signal("go", timeout=timedelta(hours=1))
        if n == 2:
            await ctx.sleep(timedelta(seconds=1))
        elif n == 3:
            n = int((await ctx.wait_signal("ship"))["n"])
        await ctx.step("second", to="beta", command=Cmd(n=n))
        return Done()


@pytest.fixture
def settings(pg: PgTarget, kafka_bootstrap: str, unique_id: str) -> Settings:
    return Settings(
        pg=PostgresSettings(dsn=pg.database_dsn, db_schema=pg.schema),
        kafka=KafkaSettings(
            bootstrap_servers=kafka_bootstrap,
            topic_prefix=f"t{unique_id}",
            group_id=f"engines-{unique_id}",
            partitions=1,
            session_timeout_ms=6000,
            heartbeat_interval_ms=500,
        ),
        engine=EngineSettings(),
        admin=AdminSettings(enabled=False, port=0),
    )


@pytest.fixture
async def instances(settings: Settings) -> AsyncIterator[tuple[SagaWorker, SagaWorker]]:
    """(owner, other): two instances in one group; the inbox's one partition is the owner's."""
    workers = [SagaWorker(settings, [Gated]) for _ in range(2)]
    await workers[0].start()
    await workers[1].start()
    try:
        owners = await eventually(
            lambda: (
                [w for w in workers if w.owned_partitions == {0}]
                if sum(len(w.owned_partitions) for w in workers) == 1
                else None
            )
        )
        (owner,) = owners
        other = workers[1] if owner is workers[0] else workers[0]
        yield owner, other
    finally:
        await asyncio.gather(*(w.stop() for w in workers))


async def _waiting_for_go(owner: SagaWorker, saga_id: str) -> bool:
    assert owner.engine is not None
    try:
        history = await owner.engine.history(saga_id)
    except Exception:
        return False
    return any(e.kind == "reply_received" for e in history)


async def _status(worker: SagaWorker, saga_id: str) -> SagaStatus:
    assert worker.engine is not None
    return (await worker.engine.get(saga_id)).status


async def test_a_signal_through_the_other_instance_reaches_the_owners_timers(
    settings: Settings, instances: tuple[SagaWorker, SagaWorker]
) -> None:
    owner, other = instances
    assert owner.engine is not None
    assert other.engine is not None
    async with (
        fake_participant(settings, "alpha"),
        fake_participant(settings, "beta") as beta,
        SagaClient(settings) as client,
    ):
        saga_id = await client.start(Gated, Order(n=2))
        await eventually(lambda: _waiting_for_go(owner, saga_id))
        # What the other instance's admin API does: act through its own engine.
        await other.engine.signal(saga_id, "go", principal="olivia", reason="approved")
        assert saga_id not in other.engine.live_saga_ids()  # it does not drive the saga
        # The go was followed by a durable sleep: only the owner can fire it, and it
        # knows of it only by reloading the saga (the other engine's saga.reload).
        await eventually(lambda: _is_completed(owner, saga_id), timeout=30)
        assert [c.subject for c in beta] == ["Cmd"]
    assert owner.parts.stats.counts["reloaded"] >= 1
    [received] = [e for e in await owner.engine.history(saga_id) if e.kind == "signal_received"]
    assert {k: event_to_dict(received)[k] for k in ("principal", "reason")} == {
        "principal": "olivia",
        "reason": "approved",
    }


async def _is_completed(worker: SagaWorker, saga_id: str) -> bool:
    return await _status(worker, saga_id) is SagaStatus.COMPLETED


async def _lost(saga_id: str) -> None:
    """A reload message Kafka refuses, every time (the engine retries it, then gives up)."""
    raise KafkaUnavailable(f"could not publish the reload of {saga_id}")


async def test_a_reply_the_stale_owner_does_not_know_is_checked_against_history(
    settings: Settings,
    instances: tuple[SagaWorker, SagaWorker],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    owner, other = instances
    assert owner.engine is not None
    assert other.engine is not None
    monkeypatch.setattr(other, "notify_owner", _lost)
    async with (
        fake_participant(settings, "alpha"),
        fake_participant(settings, "beta"),
        SagaClient(settings) as client,
    ):
        saga_id = await client.start(Gated, Order(n=1))
        await eventually(lambda: _waiting_for_go(owner, saga_id))
        # The other engine appends the go and sends the second step itself; beta's reply
        # reaches the owner, whose copy (still waiting for the go) never issued that
        # command: before dead-lettering it as unknown, it reloads the saga from history.
        await other.engine.signal(saga_id, "go")
        await eventually(lambda: _is_completed(owner, saga_id), timeout=30)
    assert owner.parts.stats.counts["reloaded_stale_copy"] >= 1
    assert owner.parts.stats.counts["dropped_unknown_command"] == 0
    assert other.parts.stats.counts["reload_notice_lost"] == 1  # after its retries


async def test_the_owner_reloads_a_saga_changed_elsewhere_when_its_write_conflicts(
    settings: Settings,
    instances: tuple[SagaWorker, SagaWorker],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    owner, other = instances
    assert owner.engine is not None
    assert other.engine is not None
    monkeypatch.setattr(other, "notify_owner", _lost)
    async with (
        fake_participant(settings, "alpha"),
        fake_participant(settings, "beta") as beta,
        SagaClient(settings) as client,
    ):
        saga_id = await client.start(Gated, Order(n=3))
        await eventually(lambda: _waiting_for_go(owner, saga_id))
        await other.engine.signal(saga_id, "go")
        # The owner's copy still waits for the go; applying the first "ship" to it, its
        # write conflicts with the go appended elsewhere. Still owning the partition, it
        # rebuilds the saga and applies the message again, before the second "ship"
        # sent right behind it (one saga's messages keep their order).
        await client.signal(saga_id, "ship", {"n": 7})
        await client.signal(saga_id, "ship", {"n": 8})
        await eventually(lambda: _is_completed(owner, saga_id), timeout=30)
        assert [c.body for c in beta] == [{"n": 7}]
    assert owner.parts.stats.counts["stale_owner"] >= 1
    assert owner.parts.stats.counts["reloaded_after_conflict"] >= 1


async def test_a_timer_of_a_stale_copy_rebuilds_the_saga(
    settings: Settings,
    instances: tuple[SagaWorker, SagaWorker],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    owner, other = instances
    assert owner.engine is not None
    assert other.engine is not None
    monkeypatch.setattr(other, "notify_owner", _lost)
    async with (
        fake_participant(settings, "alpha"),
        fake_participant(settings, "beta") as beta,
        SagaClient(settings) as client,
    ):
        saga_id = await client.start(Gated, Order(n=4))
        await eventually(lambda: _waiting_for_go(owner, saga_id))
        # During the owner's sleep the go is appended elsewhere (buffered for the wait).
        # When the sleep ends, the owner's write of it conflicts; no message will come
        # for this saga, so the timer path itself rebuilds it, re-arming the sleep.
        await other.engine.signal(saga_id, "go")
        await eventually(lambda: _is_completed(owner, saga_id), timeout=30)
        assert [c.body for c in beta] == [{"n": 4}]
    assert owner.parts.stats.counts["reloaded_after_conflict"] >= 1
