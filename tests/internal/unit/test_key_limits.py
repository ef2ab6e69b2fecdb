"""Per-key concurrency in the testing kit (in-memory store): at most N running per key,
FIFO, queued sagas visible, released at the end, a cancel while queued, definitions."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from pydantic import BaseModel

from saga_engine import ConcurrencyLimit, DefinitionError, Saga, SagaContext, SagaStatus
from saga_engine.core.authoring._definition import SagaDefinition, SagaRegistry
from saga_engine.core.runtime._runtime import SagaRuntime
from saga_engine.core.views._event_lines import event_line
from saga_engine.core.views._view import WaitKind, saga_view_of
from saga_engine.kernel._errors import InvalidPayload, StoreUnavailable
from saga_engine.store._keyslots import KeySlotStore
from saga_engine.testing import SagaTestEnv
from tests.waiting import eventually


class TransferIn(BaseModel):
    account_id: str
    amount: int = 1
    tags: list[str] = []


class TransferOut(BaseModel):
    ok: bool


class Debit(BaseModel):
    account_id: str
    amount: int


class Credit(BaseModel):
    account_id: str
    amount: int


class Transfer(Saga[TransferIn, TransferOut]):
    name = "transfer"
    concurrency = ConcurrencyLimit(key="account_id", limit=1)

    async def run(self, ctx: SagaContext, input: TransferIn) -> TransferOut:
        await ctx.step(
            "debit",
            to="ledger",
            command=Debit(account_id=input.account_id, amount=input.amount),
            compensate=Credit(account_id=input.account_id, amount=input.amount),
        )
        return TransferOut(ok=True)


class Pair(Saga[TransferIn, TransferOut]):
    name = "pair"
    concurrency = ConcurrencyLimit(key="account_id", limit=2)

    async def run(self, ctx: SagaContext, input: TransferIn) -> TransferOut:
        await ctx.step(
            "debit", to="ledger", command=Debit(account_id=input.account_id, amount=input.amount)
        )
        return TransferOut(ok=True)


class Unlimited(Saga[TransferIn, TransferOut]):
    name = "unlimited"

    async def run(self, ctx: SagaContext, input: TransferIn) -> TransferOut:
        return TransferOut(ok=True)


def _slots(env: SagaTestEnv) -> KeySlotStore:
    store = env.parts.store
    assert isinstance(store, KeySlotStore)
    return store


async def test_one_runs_per_key_the_others_queue_fifo_and_follow() -> None:
    env = SagaTestEnv([Transfer])
    env.participant("ledger").on(Debit, no_reply=True)  # the holder stays in its step
    first = await env.start(Transfer, TransferIn(account_id="a"))
    second = await env.start(Transfer, TransferIn(account_id="a", amount=2))
    third = await env.start(Transfer, TransferIn(account_id="a", amount=3))
    other = await env.start(Transfer, TransferIn(account_id="b"))
    # Only the first of key "a" and the one of key "b" sent their step.
    assert sorted(
        c.payload["account_id"] + str(c.payload["amount"]) for c in env.commands("ledger")
    ) == ["a1", "b1"]
    kinds = [e.kind for e in await second.history()]
    assert kinds == ["saga_started", "key_queued"]
    view = saga_view_of(await second.history(), saga_id=second.saga_id)
    assert view.status == SagaStatus.RUNNING
    [wait] = view.waiting_for
    assert wait.kind == WaitKind.KEY
    assert f"queued behind saga {first.saga_id}" in wait.what
    assert any(s.row == "concurrency key" and s.outcome == "waiting" for s in view.segments)
    assert f"behind saga {first.saga_id}" in event_line((await second.history())[1])
    third_view = saga_view_of(await third.history(), saga_id=third.saga_id)
    assert "position 2" in third_view.waiting_for[0].what

    # The holder ends: the next in line (FIFO) gets the key at once, the third waits.
    env.participant("ledger").reset(Debit)
    [held] = [c for c in env.commands("ledger") if c.saga_id == first.saga_id]
    await env.engine.reply(first.saga_id, held.command_id, "success")
    await env.settle()
    assert await first.status() == SagaStatus.COMPLETED
    assert await second.status() == SagaStatus.COMPLETED
    assert await third.status() == SagaStatus.COMPLETED
    assert await other.status() == SagaStatus.RUNNING  # key "b": its reply never came
    amounts = [
        c.payload["amount"] for c in env.commands("ledger") if c.payload["account_id"] == "a"
    ]
    assert amounts == [1, 2, 3]
    history = await second.history()
    assert [e.kind for e in history][:3] == ["saga_started", "key_queued", "key_acquired"]
    timeline = saga_view_of(history, saga_id=second.saga_id).segments
    assert any(s.row == "concurrency key" and s.outcome == "acquired" for s in timeline)
    # No slot is left held by a saga that ended.
    left = {s.saga_id for s in await _slots(env).key_slots("transfer", "a")}
    assert left == set()


async def test_a_limit_of_two_runs_two_and_a_cancel_while_queued_gives_its_place_up() -> None:
    env = SagaTestEnv([Pair])
    env.participant("ledger").on(Debit, no_reply=True)
    runs = [await env.start(Pair, TransferIn(account_id="k", amount=i)) for i in range(4)]
    assert [c.payload["amount"] for c in env.commands("ledger")] == [0, 1]
    # The third is cancelled while queued: its run never began, it owes nothing, and
    # it leaves the queue; the fourth moves up.
    await env.cancel(runs[2])
    assert await runs[2].status() == SagaStatus.CANCELLED
    kinds = [e.kind for e in await runs[2].history()]
    assert kinds == ["saga_started", "key_queued", "cancel_requested", "saga_cancelled"]
    slots = await _slots(env).key_slots("pair", "k")
    assert [(s.saga_id, s.held) for s in slots] == [
        (runs[0].saga_id, True),
        (runs[1].saga_id, True),
        (runs[3].saga_id, False),
    ]
    env.participant("ledger").reset(Debit)
    [cmd] = [c for c in env.commands("ledger") if c.saga_id == runs[0].saga_id]
    await env.engine.reply(runs[0].saga_id, cmd.command_id, "success")
    await env.settle()
    assert await runs[3].status() == SagaStatus.COMPLETED
    assert await runs[1].status() == SagaStatus.RUNNING  # still waiting for its reply
    assert [(s.saga_id, s.held) for s in await _slots(env).key_slots("pair")] == [
        (runs[1].saga_id, True)
    ]


async def test_a_queued_saga_rebuilt_from_history_still_waits_then_runs() -> None:
    env = SagaTestEnv([Transfer])
    env.participant("ledger").on(Debit, no_reply=True)
    first = await env.start(Transfer, TransferIn(account_id="a"))
    second = await env.start(Transfer, TransferIn(account_id="a", amount=2))
    env.engine.evict(second.saga_id)
    await env.advance(timedelta(seconds=5))  # its poll loads it and asks again
    assert [e.kind for e in await second.history()] == ["saga_started", "key_queued"]
    # The slot is freed behind the engine's back (as the sweep of another engine
    # would): its poll finds it granted, and its run begins from the history.
    await _slots(env).release_key(first.saga_id, env.now())
    env.engine.evict(second.saga_id)
    await env.advance(timedelta(seconds=5))
    kinds = [e.kind for e in await second.history()]
    assert kinds[:4] == ["saga_started", "key_queued", "key_acquired", "command_issued"]


async def test_an_ended_saga_whose_release_was_lost_is_released_by_the_sweep() -> None:
    env = SagaTestEnv([Transfer])
    env.participant("ledger").on(Debit, no_reply=True)
    first = await env.start(Transfer, TransferIn(account_id="a"))
    second = await env.start(Transfer, TransferIn(account_id="a", amount=2))
    slots = _slots(env)
    original = slots.release_key

    async def lost(saga_id: str, at: datetime) -> list[str]:
        raise StoreUnavailable("postgres went away")  # as if the engine died here

    slots.release_key = lost  # type: ignore[method-assign]
    env.participant("ledger").reset(Debit)
    await env.cancel(first)
    assert await first.status() == SagaStatus.CANCELLED
    held = [s.saga_id for s in await slots.key_slots("transfer", "a") if s.held]
    assert held == [first.saga_id]  # an ended saga holds the key: owed a release
    slots.release_key = original  # type: ignore[method-assign]
    assert await env.engine.sweep_keys() == 1
    await env.settle()
    assert first.saga_id not in {s.saga_id for s in await slots.key_slots()}
    assert await second.status() == SagaStatus.COMPLETED
    assert await slots.key_slots() == []


async def test_sagas_without_a_key_never_ask_the_store() -> None:
    class Plain(Saga[TransferIn, TransferOut]):
        name = "plain"

        async def run(self, ctx: SagaContext, input: TransferIn) -> TransferOut:
            return TransferOut(ok=True)

    env = SagaTestEnv([Plain])
    asked: list[str] = []
    store = _slots(env)
    original = store.acquire_key

    async def spy(*args: object, **kwargs: object) -> object:
        asked.append("acquire")
        return await original(*args, **kwargs)  # type: ignore[arg-type]

    store.acquire_key = spy  # type: ignore[method-assign, assignment]
    run = await env.start(Plain, TransferIn(account_id="a"))
    assert await run.status() == SagaStatus.COMPLETED
    assert asked == []
    assert [e.kind for e in await run.history()] == ["saga_started", "saga_completed"]


@pytest.mark.parametrize(
    ("concurrency", "message"),
    [
        (ConcurrencyLimit(key="nope"), "not a field of its input model"),
        (ConcurrencyLimit(key="account_id", limit=0), "integer from 1"),
        ("account_id", "must be a ConcurrencyLimit"),
        (ConcurrencyLimit(key="tags"), "must be a field holding a string"),
    ],
)
def test_a_wrong_concurrency_declaration_is_refused_when_defined(
    concurrency: object, message: str
) -> None:
    def define() -> type[Saga[TransferIn, TransferOut]]:
        class Wrong(Saga[TransferIn, TransferOut]):
            name = "wrong"
            concurrency = declared  # type: ignore[assignment]

            async def run(self, ctx: SagaContext, input: TransferIn) -> TransferOut:
                return TransferOut(ok=True)

        return Wrong

    declared = concurrency
    with pytest.raises(DefinitionError, match=message):
        define()


async def test_a_long_queue_of_sagas_that_end_at_once_drains_without_deep_recursion() -> None:
    class Instant(Saga[TransferIn, TransferOut]):
        name = "instant"
        concurrency = ConcurrencyLimit(key="account_id", limit=1)

        async def run(self, ctx: SagaContext, input: TransferIn) -> TransferOut:
            if input.amount == 0:  # the first holds the key until its reply
                await ctx.step("debit", to="ledger", command=Debit(account_id="a", amount=0))
            return TransferOut(ok=True)

    env = SagaTestEnv([Instant])
    env.participant("ledger").on(Debit, no_reply=True)
    runs = [await env.start(Instant, TransferIn(account_id="a", amount=i)) for i in range(300)]
    assert len(await _slots(env).key_slots(key="a")) == 300
    # Each release grants the next, which ends at once and releases in turn: 299 grants
    # chained, applied inline a few deep and then in tasks, never 299 frames deep.
    [debit] = env.commands("ledger")
    await env.engine.reply(runs[0].saga_id, debit.command_id, "success")
    # The tasks the chain went on in release the last slots.
    await eventually(
        _slots(env).key_slots, until=lambda held: held == [], interval=0.01, what="no slot held"
    )
    assert {await r.status() for r in runs} == {SagaStatus.COMPLETED}
    assert await _slots(env).key_slots() == []


async def test_sagas_started_before_the_type_declared_a_key_go_on_unlimited() -> None:
    class Before(Saga[TransferIn, TransferOut]):
        name = "declared-later"

        async def run(self, ctx: SagaContext, input: TransferIn) -> TransferOut:
            await ctx.step("debit", to="ledger", command=Debit(account_id="a", amount=1))
            return TransferOut(ok=True)

    class After(Saga[TransferIn, TransferOut]):
        name = "declared-later"
        concurrency = ConcurrencyLimit(key="account_id", limit=1)

        async def run(self, ctx: SagaContext, input: TransferIn) -> TransferOut:
            await ctx.step("debit", to="ledger", command=Debit(account_id="a", amount=1))
            return TransferOut(ok=True)

    env = SagaTestEnv([Before])
    env.participant("ledger").on(Debit, no_reply=True)
    old = await env.start(Before, TransferIn(account_id="a"))
    history = await old.history()
    # Replayed by the code that declares the key: not parked, nothing new owed.
    runtime, decision = SagaRuntime.replay(SagaDefinition.of(After), old.saga_id, history)
    assert decision.nondeterminism is None
    assert not runtime.awaits_key
    assert decision.events == []


async def test_a_key_too_long_to_store_is_refused_and_nothing_is_recorded() -> None:
    env = SagaTestEnv([Transfer])
    with pytest.raises(InvalidPayload, match="at most 200 characters") as refused:
        await env.start(Transfer, TransferIn(account_id="x" * 201))
    assert refused.value.errors[0]["loc"] == ["account_id"]
    assert await env.parts.store.list_sagas() == []
    assert await _slots(env).key_slots() == []


def test_the_registry_knows_when_a_saga_type_declares_a_limit_registered_late() -> None:
    # The engine asks the keys' gate only while a registered type declares a limit: one
    # registered after the engine was built must count too.
    registry = SagaRegistry([Unlimited])
    assert not registry.limited
    registry.register(Transfer)
    assert registry.limited
