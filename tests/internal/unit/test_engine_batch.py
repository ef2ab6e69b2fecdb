"""The engine's batch path (Engine.apply_batch) against its single path (start/deliver):
the same inputs must leave the same histories, commands and counters. In memory."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from saga_engine.core._decision import OutboundCommand, Reply
from saga_engine.kernel._serde import JsonDict
from saga_engine.runner._engine_batch import BatchInput
from saga_engine.testing import SagaTestEnv
from tests.sagas import OrderRequest, PlaceOrder

Outcome = Literal["success", "failure", "retryable"]

#: A success reply that is neither a StockReserved nor a ShippingQuote: held, and parks.
INVALID: JsonDict = {"unexpected": True}


@dataclass(frozen=True)
class Start:
    saga_id: str
    customer: str


@dataclass(frozen=True)
class Answer:
    """A reply to the last command the saga sent for ``step``."""

    saga_id: str
    step: str
    outcome: Outcome
    payload: JsonDict
    error: str | None = None


Input = Start | Answer


def order(start: Start) -> OrderRequest:
    return OrderRequest(customer=start.customer, total=5)


def issued(env: SagaTestEnv, saga_id: str, step: str) -> OutboundCommand:
    return [c for c in env.bus.sent if c.saga_id == saga_id and c.step == step][-1]


def reply_of(env: SagaTestEnv, answer: Answer) -> Reply:
    command = issued(env, answer.saga_id, answer.step)
    return Reply(command.command_id, answer.outcome, env.now(), answer.payload, answer.error)


async def one_at_a_time(env: SagaTestEnv, inputs: Sequence[Input]) -> None:
    for item in inputs:
        if isinstance(item, Start):
            await env.engine.start(PlaceOrder, order(item), saga_id=item.saga_id)
        else:
            await env.engine.deliver(item.saga_id, reply_of(env, item))


async def as_one_batch(env: SagaTestEnv, inputs: Sequence[Input]) -> None:
    engine = env.engine
    batch = [
        BatchInput(
            item.saga_id,
            None,
            start=engine.prepare_start(PlaceOrder, order(item), saga_id=item.saga_id),
        )
        if isinstance(item, Start)
        else BatchInput(item.saga_id, None, reply=reply_of(env, item))
        for item in inputs
    ]
    result = await engine.apply_batch(batch)
    # Nothing handed back to the single path: the batch path applied every input itself.
    assert result.redo == []
    assert result.reload == set()


@dataclass
class Outcomes:
    kinds: dict[str, list[str]]
    statuses: dict[str, str]
    commands: dict[str, list[tuple[str, str, int, bool]]]
    stats: Counter[str]


async def outcomes(env: SagaTestEnv, saga_ids: list[str]) -> Outcomes:
    kinds: dict[str, list[str]] = {
        s: [e.kind for e in await env.engine.history(s)] for s in saga_ids
    }
    statuses = {s: (await env.engine.get(s)).status.value for s in saga_ids}
    commands = {
        s: [
            (c.step, c.command_type, c.attempt, c.compensation)
            for c in env.bus.sent
            if c.saga_id == s
        ]
        for s in saga_ids
    }
    return Outcomes(kinds, statuses, commands, Counter(env.engine.stats.counts))


async def test_two_invalid_replies_of_one_saga_in_one_batch_count_one_park() -> None:
    """Before, the park was decided from the replies held after the whole batch (two),
    so neither invalid reply counted one."""
    setup: list[Input] = [
        Start("saga-p", "c"),
        Answer("saga-p", "reserve-credit", "success", {}),
    ]
    both = [
        Answer("saga-p", "reserve-stock", "success", INVALID),
        Answer("saga-p", "quote-shipping", "success", INVALID),
    ]
    single, batched = SagaTestEnv([PlaceOrder]), SagaTestEnv([PlaceOrder])
    for env in (single, batched):
        await one_at_a_time(env, setup)

    await one_at_a_time(single, both)
    await as_one_batch(batched, both)

    record = await batched.engine.get("saga-p")
    assert record.status.is_parked
    assert batched.engine.stats.counts["sagas_parked"] == 1
    assert single.engine.stats.counts["sagas_parked"] == 1
    assert await outcomes(batched, ["saga-p"]) == await outcomes(single, ["saga-p"])


async def test_a_batch_leaves_what_the_same_inputs_one_at_a_time_leave() -> None:
    setup: list[Input] = [
        Start("saga-a", "a"),
        Answer("saga-a", "reserve-credit", "success", {}),
        Start("saga-b", "b"),
        Start("saga-d", "d"),
        Answer("saga-d", "reserve-credit", "success", {}),
    ]
    batch: list[Input] = [
        Start("saga-c", "c"),  # a new saga
        Answer("saga-a", "reserve-stock", "success", {"reservation": "r-a"}),
        Answer("saga-b", "reserve-credit", "failure", {}, "no credit"),  # the saga fails
        Answer("saga-a", "quote-shipping", "success", {"price": 3}),  # its second input
        Answer("saga-d", "reserve-stock", "success", INVALID),  # parks
        Answer("saga-d", "quote-shipping", "success", INVALID),  # held too: no second park
        Answer("saga-a", "reserve-credit", "success", {}),  # answered before: a duplicate
        Start("saga-c", "c"),  # the same start again
    ]
    sagas = ["saga-a", "saga-b", "saga-c", "saga-d"]
    single, batched = SagaTestEnv([PlaceOrder]), SagaTestEnv([PlaceOrder])
    for env in (single, batched):
        await one_at_a_time(env, setup)

    await one_at_a_time(single, batch)
    await as_one_batch(batched, batch)

    expected = await outcomes(single, sagas)
    got = await outcomes(batched, sagas)
    assert got.kinds == expected.kinds
    assert got.statuses == expected.statuses
    assert got.commands == expected.commands
    assert got.stats == expected.stats
    # The scenario reaches what it means to (so the comparison is not between two no-ops).
    assert expected.statuses["saga-c"] == "running"
    assert expected.statuses["saga-b"] == "failed"
    assert expected.kinds["saga-a"][-1] == "timer_started"
    assert expected.stats["sagas_parked"] == 1
    assert expected.stats["sagas_started"] == 4
    assert expected.stats["start_deduplicated"] == 1
    assert sum(n for k, n in expected.stats.items() if k.startswith("dropped_")) == 1
