"""What a parent and its child owe each other is derived from history and sent again until
answered, in the testing kit (the real engine in memory): an undo that reaches a child
that already ended, a repeated start after a rollout, a child's end whose send failed, a
child input over the size limit, and messages that name another saga as the parent."""

from __future__ import annotations

from datetime import timedelta

import pytest

from saga_engine import Saga, SagaContext, SagaStatus, Settings
from saga_engine.core.history._decision import CHILD_PARTICIPANT, PARENT_PARTICIPANT, child_saga_id
from saga_engine.core.history._events import ParentLink
from saga_engine.core.runtime._start import StartRequest
from saga_engine.kernel._errors import NotParent, SagaNotFound
from saga_engine.kernel._settings import KafkaSettings
from saga_engine.testing import SagaTestEnv
from tests.internal.unit.test_children import (
    Book,
    Order,
    OrderIn,
    OrderOut,
    Release,
    Reserve,
    ShipIn,
    Shipment,
    ShipmentV2,
    ShipOut,
)


def _is_end(command: object) -> bool:
    return getattr(command, "participant", None) == PARENT_PARTICIPANT


def _failures_to(env: SagaTestEnv, parent_id: str) -> list[str]:
    return [
        c.payload["error"]
        for c in env.commands(PARENT_PARTICIPANT)
        if c.saga_id == parent_id and c.payload["outcome"] == "failure"
    ]


async def test_an_undo_that_reaches_a_child_after_it_failed_is_answered_under_its_id() -> None:
    env = SagaTestEnv([Order, Shipment])
    env.participant("printer").on(Book, reject="out of paper")
    env.hold(_is_end)  # the child's end reaches its parent late
    run = await env.start(Order, OrderIn(order_id="o1", fail_child=True))
    child_id = child_saga_id(run.saga_id, "shipment")
    assert (await env.engine.get(child_id)).status == SagaStatus.COMPENSATED
    assert await run.status() == SagaStatus.RUNNING
    await env.cancel(run)  # the parent undoes its steps: the child's first
    [undo] = env.commands(CHILD_PARTICIPANT, compensation=True)
    answers = [c.command_id for c in env.held]
    assert undo.command_id in answers  # answered under the undo's id, not only the start's
    await env.release()
    assert await env.run_until_settled(run) == SagaStatus.CANCELLED
    parents = {c.step for c in env.commands(compensation=True) if c.saga_id == run.saga_id}
    assert parents == {"child:shipment", "reserve"}
    # The child had undone its own booking; nothing of it was undone twice.
    assert [c.step for c in env.commands("carrier", compensation=True)] == ["book"]


async def test_a_second_undo_of_an_undone_child_is_answered_too() -> None:
    env = SagaTestEnv([Order, Shipment])
    env.participant("payments").on(Book, reject="card declined")
    run = await env.start(Order, OrderIn(order_id="o2", fail_after=True))
    assert await run.status() == SagaStatus.COMPENSATED
    child_id = child_saga_id(run.saga_id, "shipment")
    before = len(env.bus.sent)
    await env.children.undo_child(child_id, "another-undo", run.saga_id, "")
    answered = [(c.participant, c.command_id) for c in env.bus.sent[before:]]
    assert (PARENT_PARTICIPANT, "another-undo") in answered


async def test_a_repeated_start_is_answered_by_the_child_whatever_the_rollout_says() -> None:
    env = SagaTestEnv([Order, Shipment, ShipmentV2])
    await env.set_rollout("shipment", 2, percent=0)  # new shipments run v1
    env.participant("carrier").on(Book, no_reply=True)  # the child waits on its booking
    run = await env.start(Order, OrderIn(order_id="o3"))
    child_id = child_saga_id(run.saga_id, "shipment")
    assert (await env.engine.get(child_id)).saga_version == 1
    await env.set_rollout("shipment", 2, percent=100)  # v2 refuses v1's input
    env.engine.evict(child_id)
    await env.advance(timedelta(minutes=6))  # past the parent's poll: it asks again
    assert len(env.commands(CHILD_PARTICIPANT, compensation=False)) >= 2
    assert _failures_to(env, run.saga_id) == []
    assert await run.status() == SagaStatus.RUNNING
    [booking] = env.commands("carrier")
    await env.engine.reply(child_id, booking.command_id, "success")
    await env.settle()
    assert await run.status() == SagaStatus.COMPLETED
    assert (await run.output()).model_dump() == {"tracking": "T-o3"}


class PatientOrder(Saga[OrderIn, OrderOut]):
    """Waits for its child without asking again (no poll)."""

    name = "patient-order"

    async def run(self, ctx: SagaContext, input: OrderIn) -> OrderOut:
        shipped = await ctx.child(Shipment, ShipIn(order_id=input.order_id), poll=None)
        return OrderOut(tracking=shipped.tracking)


async def test_a_childs_end_whose_send_failed_is_sent_again_from_history() -> None:
    env = SagaTestEnv([PatientOrder, Shipment])
    env.bus.fail(_is_end)  # the broker does not take the child's end, once
    run = await env.start(PatientOrder, OrderIn(order_id="o4"))
    child_id = child_saga_id(run.saga_id, "shipment")
    assert (await env.engine.get(child_id)).status == SagaStatus.COMPLETED
    assert await run.status() == SagaStatus.RUNNING
    # Nothing asks the child again (no poll, no new input): the engine re-sends its end.
    await env.advance(timedelta(seconds=1))
    assert await run.status() == SagaStatus.COMPLETED


async def test_a_redelivered_reply_to_an_ended_child_sends_its_end_again() -> None:
    env = SagaTestEnv([PatientOrder, Shipment])
    env.bus.fail(_is_end)
    run = await env.start(PatientOrder, OrderIn(order_id="o5"))
    child_id = child_saga_id(run.saga_id, "shipment")
    [booking] = env.commands("carrier")
    # The inbox applies the reply again (its offset was not committed): a duplicate for
    # the child, which is loaded from history and re-sends what it owes.
    await env.engine.reply(child_id, booking.command_id, "success")
    await env.settle()
    assert await run.status() == SagaStatus.COMPLETED


class BulkyOrder(Saga[OrderIn, OrderOut]):
    name = "bulky-order"

    async def run(self, ctx: SagaContext, input: OrderIn) -> OrderOut:
        await ctx.step(
            "reserve",
            to="stock",
            command=Reserve(order_id=input.order_id),
            compensate=Release(order_id=input.order_id),
        )
        shipped = await ctx.child(Shipment, ShipIn(order_id=input.order_id * 4000))
        return OrderOut(tracking=shipped.tracking)


async def test_a_child_input_over_the_size_limit_fails_the_parents_step_at_once() -> None:
    settings = Settings(kafka=KafkaSettings(max_message_bytes=4096))
    env = SagaTestEnv([BulkyOrder, Shipment], settings=settings)
    run = await env.start(BulkyOrder, OrderIn(order_id="o6"))
    assert await run.status() == SagaStatus.COMPENSATED  # no poll, no time passed
    error = await run.error()
    assert error is not None
    assert "4,096" in error["message"]
    assert env.compensated_steps() == ["reserve"]
    # Too large for the broker: the child's start was refused before it was recorded.
    assert env.commands(CHILD_PARTICIPANT, compensation=False) == []


async def test_an_undo_from_a_saga_that_is_not_the_parent_is_refused() -> None:
    env = SagaTestEnv([Order, Shipment])
    run = await env.start(Order, OrderIn(order_id="o7"))
    child_id = child_saga_id(run.saga_id, "shipment")
    before = await env.engine.history(child_id)
    with pytest.raises(NotParent, match="not by saga 'intruder'"):
        await env.children.undo_child(child_id, "forged", "intruder", "")
    assert await env.engine.history(child_id) == before
    assert (await env.engine.get(child_id)).status == SagaStatus.COMPLETED
    # A saga no parent started is cancelled, never undone: no saga is its parent.
    with pytest.raises(NotParent, match="started on its own"):
        await env.children.undo_child(run.saga_id, "forged", "intruder", "")


async def test_a_start_from_a_saga_that_is_not_the_parent_is_refused() -> None:
    env = SagaTestEnv([Order, Shipment])
    run = await env.start(Order, OrderIn(order_id="o8"))
    child_id = child_saga_id(run.saga_id, "shipment")
    before = len(env.bus.sent)
    with pytest.raises(NotParent):
        await env.children.start_child(
            StartRequest(
                "shipment",
                {"order_id": "o8"},
                child_id,
                parent=ParentLink(saga_id="intruder", command_id="c1", saga_type="order"),
            )
        )
    assert env.bus.sent[before:] == []  # the intruder hears nothing of the child


async def test_an_end_from_a_saga_that_is_not_the_steps_child_is_refused() -> None:
    env = SagaTestEnv([Order, Shipment])
    env.participant("carrier").on(Book, no_reply=True)  # the child waits on its booking
    run = await env.start(Order, OrderIn(order_id="o9"))
    [start] = env.commands(CHILD_PARTICIPANT)
    before = await run.history()
    with pytest.raises(NotParent, match="not from its child"):
        await env.engine.reply(run.saga_id, start.command_id, "success", {}, sender="intruder")
    assert await run.history() == before
    assert await run.status() == SagaStatus.RUNNING


async def test_a_start_overtaken_by_its_undo_starts_no_child() -> None:
    env = SagaTestEnv([Order, Shipment])
    env.hold(lambda c: c.participant == CHILD_PARTICIPANT and not c.compensation)
    run = await env.start(Order, OrderIn(order_id="o10"))
    await env.cancel(run)  # the undo overtakes the start: "nothing to undo"
    assert await run.status() == SagaStatus.CANCELLED
    await env.release()  # the start arrives late: its parent no longer asks for it
    child_id = child_saga_id(run.saga_id, "shipment")
    with pytest.raises(SagaNotFound):
        await env.engine.get(child_id)
    assert env.parts.stats.counts["child_start_withdrawn"] == 1
    assert env.commands("carrier") == []  # no booking that nobody would undo


async def test_a_start_of_a_step_an_operator_skipped_starts_no_child() -> None:
    env = SagaTestEnv([Order, Shipment])
    env.hold(lambda c: c.participant == CHILD_PARTICIPANT and not c.compensation)
    env.participant("payments").on(Book, no_reply=True)  # the parent runs on after it
    run = await env.start(Order, OrderIn(order_id="o11", fail_after=True))
    await env.engine.skip_step(run.saga_id, "child:shipment", {"tracking": "by hand"})
    await env.settle()
    assert await run.status() == SagaStatus.RUNNING
    await env.release()  # the start arrives late: its step was answered by hand
    with pytest.raises(SagaNotFound):
        await env.engine.get(child_saga_id(run.saga_id, "shipment"))
    assert env.parts.stats.counts["child_start_withdrawn"] == 1


class Napping(Saga[ShipIn, ShipOut]):
    """A child whose last input is a timer (the timer path)."""

    name = "napping"

    async def run(self, ctx: SagaContext, input: ShipIn) -> ShipOut:
        await ctx.sleep(timedelta(seconds=1))
        return ShipOut(tracking=f"N-{input.order_id}")


class NapOrder(Saga[OrderIn, OrderOut]):
    name = "nap-order"

    async def run(self, ctx: SagaContext, input: OrderIn) -> OrderOut:
        done = await ctx.child(Napping, ShipIn(order_id=input.order_id), poll=None)
        return OrderOut(tracking=done.tracking)


async def test_an_end_refused_on_the_timer_path_is_reloaded_once() -> None:
    env = SagaTestEnv([NapOrder, Napping])
    env.bus.fail(_is_end)
    run = await env.start(NapOrder, OrderIn(order_id="o12"))
    await env.advance(timedelta(seconds=1))  # the nap ends; its end is refused
    assert await run.status() == SagaStatus.RUNNING
    await env.advance(timedelta(seconds=1))  # one reload re-sends it
    assert await run.status() == SagaStatus.COMPLETED
    assert env.parts.stats.counts["reloaded"] == 1


async def test_a_parent_waiting_for_its_child_says_so_by_the_childs_id() -> None:
    from saga_engine.core.views._view import WaitKind, saga_view_of

    env = SagaTestEnv([Order, Shipment])
    env.participant("carrier").on(Book, no_reply=True)  # the child waits: so does its parent
    run = await env.start(Order, OrderIn(order_id="o2"))
    child_id = child_saga_id(run.saga_id, "shipment")
    view = saga_view_of(await run.history(), saga_id=run.saga_id)
    [wait] = [w for w in view.waiting_for if w.step == "child:shipment"]
    assert (wait.kind, wait.name) == (WaitKind.CHILD, child_id)
    assert wait.what == f"child saga 'shipment' ({child_id}) to end"
