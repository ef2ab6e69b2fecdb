"""The engine's one path with a batch of inputs (``Engine.apply``): starts, replies,
signals and cancels of several sagas applied together, each input answered by its
outcome. In memory."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from saga_engine.core._decision import DropReason, OutboundCommand, Reply
from saga_engine.core._start import StartRequest
from saga_engine.kernel._errors import InvalidTransition
from saga_engine.kernel._serde import JsonDict
from saga_engine.runner._work import Deliver, Input, Outcome, Start
from saga_engine.testing import SagaTestEnv
from tests.sagas import OrderRequest, PlaceOrder

Outcome_ = Literal["success", "failure", "retryable"]

#: A success reply that is neither a StockReserved nor a ShippingQuote: held, and parks.
INVALID: JsonDict = {"unexpected": True}


@dataclass(frozen=True)
class Begin:
    saga_id: str
    customer: str


@dataclass(frozen=True)
class Answer:
    """A reply to the last command the saga sent for ``step``."""

    saga_id: str
    step: str
    outcome: Outcome_
    payload: JsonDict
    error: str | None = None


def issued(env: SagaTestEnv, saga_id: str, step: str) -> OutboundCommand:
    return [c for c in env.bus.sent if c.saga_id == saga_id and c.step == step][-1]


def as_input(env: SagaTestEnv, item: Begin | Answer) -> Input:
    if isinstance(item, Begin):
        order = OrderRequest(customer=item.customer, total=5)
        request = StartRequest(PlaceOrder.name, order.model_dump(mode="json"), item.saga_id)
        return Start(item.saga_id, env.engine.prepare(request))
    command = issued(env, item.saga_id, item.step)
    reply = Reply(command.command_id, item.outcome, env.now(), item.payload, item.error)
    return Deliver(item.saga_id, reply)


async def one_by_one(env: SagaTestEnv, items: Sequence[Begin | Answer]) -> None:
    for item in items:
        (outcome,) = await env.engine.apply([as_input(env, item)])
        outcome.result()


async def as_one_batch(env: SagaTestEnv, items: Sequence[Begin | Answer]) -> list[Outcome]:
    outcomes = await env.engine.apply([as_input(env, item) for item in items])
    assert [o.error for o in outcomes] == [None] * len(items)
    return outcomes


async def kinds(env: SagaTestEnv, saga_id: str) -> list[str]:
    return [e.kind for e in await env.engine.history(saga_id)]


async def test_two_invalid_replies_of_one_saga_in_one_batch_count_one_park() -> None:
    """A park is counted once, as each decision was taken: the second reply is held
    while the first already is (counted from the replies held after the whole batch,
    neither would count one)."""
    env = SagaTestEnv([PlaceOrder])
    await one_by_one(env, [Begin("saga-p", "c"), Answer("saga-p", "reserve-credit", "success", {})])
    await as_one_batch(
        env,
        [
            Answer("saga-p", "reserve-stock", "success", INVALID),
            Answer("saga-p", "quote-shipping", "success", INVALID),
        ],
    )
    assert (await env.engine.get("saga-p")).status.is_parked
    assert env.parts.stats.counts["sagas_parked"] == 1
    assert (await kinds(env, "saga-p")).count("invalid_reply_received") == 2


async def test_a_batch_of_starts_and_replies_of_several_sagas() -> None:
    env = SagaTestEnv([PlaceOrder])
    await one_by_one(
        env,
        [
            Begin("saga-a", "a"),
            Answer("saga-a", "reserve-credit", "success", {}),
            Begin("saga-b", "b"),
            Begin("saga-d", "d"),
            Answer("saga-d", "reserve-credit", "success", {}),
        ],
    )
    sent_before = len(env.bus.sent)
    outcomes = await as_one_batch(
        env,
        [
            Begin("saga-c", "c"),  # a new saga
            Answer("saga-a", "reserve-stock", "success", {"reservation": "r-a"}),
            Answer("saga-b", "reserve-credit", "failure", {}, "no credit"),  # the saga fails
            Answer("saga-a", "quote-shipping", "success", {"price": 3}),  # its second input
            Answer("saga-d", "reserve-stock", "success", INVALID),  # parks
            Answer("saga-d", "quote-shipping", "success", INVALID),  # held too: no second park
            Answer("saga-a", "reserve-credit", "success", {}),  # answered before: a duplicate
            Begin("saga-c", "c"),  # the same start again
        ],
    )
    statuses = {s: (await env.engine.get(s)).status.value for s in ("saga-a", "saga-b", "saga-c")}
    assert statuses == {"saga-a": "running", "saga-b": "failed", "saga-c": "running"}
    assert (await env.engine.get("saga-d")).status.is_parked
    assert (await kinds(env, "saga-a"))[-1] == "timer_started"  # both answers applied
    assert (await kinds(env, "saga-c")).count("saga_started") == 1
    # What the batch sent: saga-c's first step, and nothing else (the others wait on a
    # timer, ended, or parked).
    assert [(c.saga_id, c.step) for c in env.bus.sent[sent_before:]] == [
        ("saga-c", "reserve-credit")
    ]
    counts = env.parts.stats.counts
    assert (counts["sagas_started"], counts["sagas_parked"]) == (4, 1)
    assert counts["start_deduplicated"] == 1
    assert counts["dropped_duplicate_reply"] == 1
    # Each input's own answer: the duplicate reply was dropped, the repeated start made
    # no decision.
    duplicate = outcomes[6].decision
    assert duplicate is not None
    assert duplicate.dropped is DropReason.DUPLICATE_REPLY
    assert outcomes[7].decision is None


async def test_an_input_refused_in_a_batch_answers_alone() -> None:
    """Every kind of input takes the batch: the signal that comes after a cancel is
    refused (the saga is undoing its steps), and only it answers with the error."""
    env = SagaTestEnv([PlaceOrder])
    await one_by_one(env, [Begin("saga-e", "e")])
    outcomes = await env.engine.apply(
        [
            Deliver("saga-e", env.engine.cancel_input("changed my mind")),
            Deliver("saga-e", env.engine.signal_input("approval", {"approved": True, "by": "x"})),
        ]
    )
    assert outcomes[0].error is None
    assert isinstance(outcomes[1].error, InvalidTransition)
    recorded = await kinds(env, "saga-e")
    assert "cancel_requested" in recorded
    assert "signal_received" not in recorded
