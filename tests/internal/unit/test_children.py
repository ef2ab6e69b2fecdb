"""Child sagas in the testing kit: start, output, failure, undo on compensation, cancel."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel

from saga_engine import Saga, SagaContext, SagaStatus, StepFailed
from saga_engine.core.history._decision import CHILD_PARTICIPANT, child_saga_id
from saga_engine.core.views._view import saga_view_of
from saga_engine.events import SagaStarted
from saga_engine.testing import SagaTestEnv


async def _views_agree(env: SagaTestEnv) -> None:
    """The fold every view uses reads each saga's history as the runtime drove it."""
    for record in await env.parts.store.list_sagas():
        view = saga_view_of(await env.engine.history(record.saga_id), saga_id=record.saga_id)
        assert view.status == record.status, record.saga_id
        runtime = env.engine.runtime_of(record.saga_id)
        if runtime is not None:
            assert [o.step for o in view.owed] == runtime.owed_compensations()


class ShipIn(BaseModel):
    order_id: str
    fail: bool = False


class ShipOut(BaseModel):
    tracking: str


class Reserve(BaseModel):
    order_id: str


class Release(BaseModel):
    order_id: str


class Book(BaseModel):
    order_id: str


class Unbook(BaseModel):
    order_id: str


class Shipment(Saga[ShipIn, ShipOut]):
    name = "shipment"

    async def run(self, ctx: SagaContext, input: ShipIn) -> ShipOut:
        await ctx.step(
            "book",
            to="carrier",
            command=Book(order_id=input.order_id),
            compensate=Unbook(order_id=input.order_id),
        )
        if input.fail:
            await ctx.step("label", to="printer", command=Book(order_id=input.order_id))
        return ShipOut(tracking=f"T-{input.order_id}")


class OrderIn(BaseModel):
    order_id: str
    fail_child: bool = False
    fail_after: bool = False


class OrderOut(BaseModel):
    tracking: str


class Order(Saga[OrderIn, OrderOut]):
    name = "order"

    async def run(self, ctx: SagaContext, input: OrderIn) -> OrderOut:
        await ctx.step(
            "reserve",
            to="stock",
            command=Reserve(order_id=input.order_id),
            compensate=Release(order_id=input.order_id),
        )
        shipped = await ctx.child(Shipment, ShipIn(order_id=input.order_id, fail=input.fail_child))
        if input.fail_after:
            await ctx.step("charge", to="payments", command=Book(order_id=input.order_id))
        return OrderOut(tracking=shipped.tracking)


async def test_a_child_runs_and_its_output_is_the_parents_step_result() -> None:
    env = SagaTestEnv([Order, Shipment])
    run = await env.start(Order, OrderIn(order_id="o1"))
    assert await run.status() == SagaStatus.COMPLETED
    assert (await run.output()).model_dump() == {"tracking": "T-o1"}
    child_id = child_saga_id(run.saga_id, "shipment")
    child = await env.engine.get(child_id)
    assert child.status == SagaStatus.COMPLETED
    started = (await env.engine.history(child_id))[0]
    assert isinstance(started, SagaStarted)
    assert started.parent is not None
    assert started.parent.saga_id == run.saga_id
    assert [c.step for c in env.commands(CHILD_PARTICIPANT)] == ["child:shipment"]
    await _views_agree(env)


async def test_a_failed_child_fails_the_parents_step_and_is_not_undone() -> None:
    env = SagaTestEnv([Order, Shipment])
    env.participant("printer").on(Book, reject="out of paper")
    run = await env.start(Order, OrderIn(order_id="o2", fail_child=True))
    assert await run.status() == SagaStatus.COMPENSATED
    error = await run.error()
    assert error is not None
    assert error["type"] == StepFailed.__name__
    assert "out of paper" in error["message"]
    child = await env.engine.get(child_saga_id(run.saga_id, "shipment"))
    assert child.status == SagaStatus.COMPENSATED  # it undid its own booking
    # The parent compensated only its own step: the child's undo is not owed.
    assert env.compensated_steps() == ["book", "reserve"]
    assert not env.commands(CHILD_PARTICIPANT, compensation=True)
    await _views_agree(env)


async def test_a_completed_child_is_undone_in_the_parents_lifo_order() -> None:
    env = SagaTestEnv([Order, Shipment])
    env.participant("payments").on(Book, reject="card declined")
    run = await env.start(Order, OrderIn(order_id="o3", fail_after=True))
    assert await run.status() == SagaStatus.COMPENSATED
    child_id = child_saga_id(run.saga_id, "shipment")
    child = await env.engine.get(child_id)
    assert child.status == SagaStatus.COMPENSATED
    kinds = [e.kind for e in await env.engine.history(child_id)]
    assert kinds.index("saga_completed") < kinds.index("undo_requested")
    assert kinds[-1] == "saga_compensated"
    # The child's booking undone before the parent's reservation: LIFO across both.
    assert env.compensated_steps() == ["child:shipment", "book", "reserve"]
    sent = [c for c in env.bus.sent if c.compensation]
    assert [c.participant for c in sent] == [CHILD_PARTICIPANT, "carrier", "stock"]
    await _views_agree(env)


async def test_cancelling_a_parent_cancels_its_running_child() -> None:
    env = SagaTestEnv([Order, Shipment])
    env.participant("carrier").on(Book, no_reply=True)  # the booking never answers
    run = await env.start(Order, OrderIn(order_id="o4"))
    child_id = child_saga_id(run.saga_id, "shipment")
    assert (await env.engine.get(child_id)).status == SagaStatus.RUNNING
    await env.cancel(run)
    assert await run.status() == SagaStatus.CANCELLED
    assert (await env.engine.get(child_id)).status == SagaStatus.CANCELLED
    kinds = [e.kind for e in await env.engine.history(child_id)]
    assert "undo_requested" in kinds
    await _views_agree(env)


class ShipInV2(BaseModel):
    order_id: str
    carrier: str  # v1's inputs have none: v2's model refuses them


class ShipmentV2(Saga[ShipInV2, ShipOut]):
    name = "shipment"
    version = 2

    async def run(self, ctx: SagaContext, input: ShipInV2) -> ShipOut:
        return ShipOut(tracking=f"{input.carrier}-{input.order_id}")


async def test_a_child_whose_input_is_refused_fails_the_parents_step() -> None:
    # The parent checks the input against the class it names (v1); the engine starts the
    # version the rollout picks (v2, the highest), whose model refuses it.
    env = SagaTestEnv([Order, Shipment, ShipmentV2])
    run = await env.start(Order, OrderIn(order_id="o5"))
    assert await run.status() == SagaStatus.COMPENSATED
    [answer] = env.commands("saga.parent")
    assert (answer.command_id, answer.payload["outcome"]) == (
        env.commands(CHILD_PARTICIPANT)[0].command_id,
        "failure",
    )
    assert "carrier" in answer.payload["error"]
    assert env.compensated_steps() == ["reserve"]  # nothing started: nothing to undo


async def test_a_child_of_a_type_not_deployed_here_waits_for_an_engine_that_runs_it() -> None:
    env = SagaTestEnv([Order, Shipment])
    env.engine = env.new_engine([Order])  # this deploy does not run shipments yet
    run = await env.start(Order, OrderIn(order_id="o5"))
    # The start cannot be carried out here (the worker dead-letters it): the parent is
    # not failed for a rolling deploy; it keeps waiting and asks again every poll.
    assert await run.status() == SagaStatus.RUNNING
    env.engine = env.new_engine([Order, Shipment])  # the newer deploy
    await env.engine.recover()
    await env.advance(timedelta(minutes=6))  # past the poll: the start is sent again
    assert await run.status() == SagaStatus.COMPLETED
    await _views_agree(env)


async def test_a_repeated_start_of_an_ended_child_answers_again() -> None:
    env = SagaTestEnv([Order, Shipment])
    run = await env.start(Order, OrderIn(order_id="o6"))
    child_id = child_saga_id(run.saga_id, "shipment")
    start = env.commands(CHILD_PARTICIPANT)[0]
    before = len(env.bus.sent)
    await env.children.deliver_locally(start)
    answers = env.bus.sent[before:]
    assert [(a.participant, a.command_id, a.payload["outcome"]) for a in answers] == [
        ("saga.parent", start.command_id, "success")
    ]
    assert answers[0].payload["child"] == child_id
    await _views_agree(env)
