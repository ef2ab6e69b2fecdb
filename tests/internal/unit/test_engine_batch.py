"""The engine's one path with a batch of inputs (``Engine.apply``): starts, replies,
signals and cancels of several sagas applied together, each input answered by its
outcome. In memory."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from saga_engine.core.history._decision import DropReason, OutboundCommand, Reply
from saga_engine.core.runtime._start import StartRequest
from saga_engine.kernel._errors import InvalidTransition
from saga_engine.kernel._serde import JsonDict
from saga_engine.runner._engine import Engine
from saga_engine.runner._parts import EngineParts
from saga_engine.runner._path_inputs import Deliver, Input, InputOutcome, Start
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


async def as_one_batch(env: SagaTestEnv, items: Sequence[Begin | Answer]) -> list[InputOutcome]:
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


class OwnsAll:
    """An Ownership that says this engine drives every saga (as a worker's does for the
    sagas of its partitions), and records the reload notices it is asked to send."""

    def __init__(self) -> None:
        self.notified: list[str] = []

    def owns(self, saga_id: str) -> bool:
        return True

    async def notify_owner(self, saga_id: str) -> None:
        self.notified.append(saga_id)


def owning_engine(env: SagaTestEnv) -> tuple[Engine, EngineParts]:
    """Another engine on ``env``'s store and bus, driving its sagas as their owner."""
    parts = EngineParts.build(
        env.settings,
        sagas=[PlaceOrder],
        store=env.store,
        sender=env.bus,
        clock=env.clock,
        ownership=OwnsAll(),
    )
    return Engine(parts), parts


async def test_a_write_that_conflicts_is_decided_again_on_the_saga_rebuilt() -> None:
    """Another engine changed the saga (an operator's cancel there): the owner's copy is
    stale, its append conflicts, and the path decides the reply again on the saga
    rebuilt from history, in the same call."""
    env = SagaTestEnv([PlaceOrder])
    owner, parts = owning_engine(env)
    (started,) = await owner.apply([as_input(env, Begin("saga-x", "x"))])
    started.result()
    forward = issued(env, "saga-x", "reserve-credit")
    await env.engine.cancel("saga-x", "by an operator elsewhere")  # env.engine: another one
    reply = Reply(forward.command_id, "success", env.now(), {}, None)
    (outcome,) = await owner.apply([Deliver("saga-x", reply)])
    assert outcome.error is None
    assert parts.stats.counts["stale_owner"] == 1
    assert parts.stats.counts["reloaded_after_conflict"] == 1
    # The owner holds the saga as history has it now: the other engine's cancel in it.
    held = owner.runtime_of("saga-x")
    assert held is not None
    assert "cancel_requested" in [e.kind for e in held.history]
    assert held.history == await env.engine.history("saga-x")


async def test_a_reply_the_copy_held_does_not_know_is_asked_of_the_history() -> None:
    """The other engine's cancel issued a compensation the owner's copy never saw: its
    reply is not dropped as unknown, the copy is rebuilt from history first."""
    env = SagaTestEnv([PlaceOrder])
    owner, parts = owning_engine(env)
    (started,) = await owner.apply([as_input(env, Begin("saga-z", "z"))])
    started.result()
    await env.engine.reply("saga-z", issued(env, "saga-z", "reserve-credit").command_id, "success")
    await env.engine.cancel("saga-z", "by an operator elsewhere")
    undo = issued(env, "saga-z", "reserve-stock")  # the cancel undoes the step in flight
    assert undo.compensation
    (outcome,) = await owner.apply(
        [Deliver("saga-z", Reply(undo.command_id, "success", env.now(), {}, None))]
    )
    assert outcome.error is None
    assert outcome.decision is not None
    assert outcome.decision.dropped is None
    assert parts.stats.counts["reloaded_stale_copy"] == 1
    # Applied on the rebuilt copy: the compensation is done, and the next one issued.
    assert (await kinds(env, "saga-z"))[-2:] == ["compensation_completed", "compensation_issued"]


async def test_a_saga_started_in_the_batch_is_not_taken_for_a_stale_copy() -> None:
    """A reply no command of a saga started by the same batch names is dropped as
    unknown; the start stands (there is no stored copy to rebuild it from)."""
    env = SagaTestEnv([PlaceOrder])
    owner, _ = owning_engine(env)
    stray = Reply("no-such-command", "success", env.now(), {}, None)
    started, replied = await owner.apply(
        [as_input(env, Begin("saga-y", "y")), Deliver("saga-y", stray)]
    )
    assert started.error is None
    assert replied.error is None
    assert replied.decision is not None
    assert replied.decision.dropped is DropReason.UNKNOWN_COMMAND
    assert (await env.engine.get("saga-y")).status.value == "running"
