"""Child sagas' failure paths through the real inbox: a child type no engine runs yet
(a rolling deploy), a child input its model refuses, and a child past its own pivot that
refuses its parent's undo."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

from saga_engine import Saga, SagaContext, SagaStatus, StepFailed
from saga_engine.worker import SagaWorker
from tests.conftest import PgTarget
from tests.integration.kafka_helpers import fake_participant, read_topic
from tests.served_worker import real_settings
from tests.waiting import eventually

pytestmark = pytest.mark.integration


class Label(BaseModel):
    text: str = Field(min_length=1)


class Printed(BaseModel):
    text: str


class Printer(Saga[Label, Printed]):
    name = "printer"

    async def run(self, ctx: SagaContext, label: Label) -> Printed:
        return Printed(text=label.text.upper())


class Job(BaseModel):
    text: str


class Parcel(Saga[Job, Printed]):
    name = "parcel"

    async def run(self, ctx: SagaContext, job: Job) -> Printed:
        try:
            # poll=1: the start is sent again every second while the child does not answer.
            return await ctx.child(Printer, {"text": job.text}, poll=1)
        except StepFailed as exc:
            return Printed(text=f"refused: {exc.reason}")


async def _status(worker: SagaWorker, saga_id: str) -> SagaStatus:
    assert worker.engine is not None
    return (await worker.engine.get(saga_id)).status


async def test_a_child_type_no_engine_runs_yet_is_dead_lettered_and_started_later(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    settings = real_settings(pg, kafka_bootstrap, unique_id)
    async with SagaWorker(settings, [Parcel]) as old:  # the deploy before printers
        assert old.engine is not None
        parent = await old.engine.start(Parcel, Job(text="fragile"))
        # Its child's start is dead-lettered (no engine runs printers), each poll again;
        # the parent is not failed for it: it waits.
        records = await read_topic(settings.kafka, f"t{unique_id}.dlq", 2, timeout=30)
        reasons = {dict(r.headers)["dlq_reason"].decode() for r in records}
        assert reasons == {"unknown_saga_type"}
        assert await _status(old, parent) == SagaStatus.RUNNING
    async with SagaWorker(settings, [Parcel, Printer]) as new:  # the newer deploy
        # It recovers the parent, which asks again: the child starts and answers.
        await eventually(lambda: _done(new, parent), timeout=60)
        assert new.engine is not None
        output = [e for e in await new.engine.history(parent) if e.kind == "saga_completed"]
        assert output[0].output == {"text": "FRAGILE"}


async def _done(worker: SagaWorker, saga_id: str) -> bool:
    return await _status(worker, saga_id) == SagaStatus.COMPLETED


async def test_a_child_input_its_model_refuses_fails_the_parents_step(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    settings = real_settings(pg, kafka_bootstrap, unique_id)
    async with SagaWorker(settings, [Parcel, Printer]) as worker:
        assert worker.engine is not None
        # The parent checks the input first, so an empty text never leaves it as a start:
        # the step fails in the parent's own code, with the field named.
        parent = await worker.engine.start(Parcel, Job(text=""))
        await eventually(lambda: _terminal(worker, parent), timeout=30)
        assert await _status(worker, parent) == SagaStatus.FAILED
        record = await worker.engine.get(parent)
        assert record.error is not None
        assert "text" in record.error["message"]


async def _terminal(worker: SagaWorker, saga_id: str) -> bool:
    return (await _status(worker, saga_id)).is_terminal


class Charge(BaseModel):
    text: str


class PaidPrinter(Saga[Label, Printed]):
    """A child with a pivot of its own: once charged, it cannot be undone."""

    name = "paid-printer"

    async def run(self, ctx: SagaContext, label: Label) -> Printed:
        await ctx.step("charge", to="alpha", command=Charge(text=label.text), pivot=True)
        return Printed(text=label.text)


class Order(Saga[Job, Printed]):
    """Prints through the paid child, then fails: the parent compensates."""

    name = "order-with-paid-child"

    async def run(self, ctx: SagaContext, job: Job) -> Printed:
        await ctx.child(PaidPrinter, {"text": job.text}, poll=1)
        raise RuntimeError("the order fails after its child passed its pivot")


async def test_a_child_past_its_pivot_refuses_its_parents_undo_over_kafka(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    settings = real_settings(pg, kafka_bootstrap, unique_id)
    async with (
        SagaWorker(settings, [Order, PaidPrinter]) as worker,
        fake_participant(settings, "alpha"),
    ):
        engine = worker.engine
        assert engine is not None
        parent = await engine.start(Order, Job(text="x"))

        async def refused() -> bool:
            return any(
                e.kind == "reply_received" and e.compensation and e.outcome == "failure"
                for e in await engine.history(parent)
            )

        # The parent's undo of the child went through the inbox and came back refused.
        await eventually(refused, timeout=60)
        reply = next(
            e
            for e in await engine.history(parent)
            if e.kind == "reply_received" and e.compensation and e.outcome == "failure"
        )
        assert "past its pivot" in (reply.error or "")
        child_id = next(  # the child's id, from the parent's command that started it
            e.payload["saga_id"]
            for e in await engine.history(parent)
            if e.kind == "command_issued" and e.step == "child:paid-printer"
        )
        assert await _status(worker, child_id) == SagaStatus.COMPLETED
        kinds = [e.kind for e in await engine.history(child_id)]
        assert "undo_requested" not in kinds
        assert "compensation_started" not in kinds
