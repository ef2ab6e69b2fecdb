"""What a parent and its child owe each other, on the real inbox (Postgres and Kafka):
an undo that reaches a child after it failed, a repeated start after a rollout change, a
child's end whose send the broker did not take (on the single, batch and timer paths), a
child input over the size limit, and an undo or end from a saga that is not linked."""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError
from pydantic import BaseModel

from saga_engine import Saga, SagaContext, SagaStatus, Settings, Signal
from saga_engine.core.history._decision import child_saga_id
from saga_engine.core.planning._rollout import RolloutSpec
from saga_engine.protocol import Envelope, MessageType, Topics
from saga_engine.runner._rollouts import apply_rollout
from saga_engine.worker import SagaWorker
from tests.conftest import PgTarget
from tests.edge.conftest import dead_letters, produce
from tests.integration.kafka_helpers import fake_participant
from tests.served_worker import real_settings
from tests.waiting import eventually

pytestmark = pytest.mark.integration


class Go(BaseModel):
    ok: bool


class Box(BaseModel):
    label: str


class Boxed(BaseModel):
    label: str


class Wrap(BaseModel):
    label: str


class Fragile(Saga[Box, Boxed]):
    """Waits for ``go``; fails when it is not ok (nothing to compensate: it fails)."""

    name = "fragile"
    go = Signal(Go)

    async def run(self, ctx: SagaContext, box: Box) -> Boxed:
        decision = await ctx.wait_signal(self.go)
        if not decision.ok:
            raise RuntimeError("dropped on the floor")
        return Boxed(label=box.label)


class InsuredBox(BaseModel):
    label: str
    insured: bool  # v1's inputs have none: v2's model refuses them


class FragileV2(Saga[InsuredBox, Boxed]):
    name = "fragile"
    version = 2
    go = Signal(Go)

    async def run(self, ctx: SagaContext, box: InsuredBox) -> Boxed:
        await ctx.wait_signal(self.go)
        return Boxed(label=f"insured {box.label}")


class Mover(Saga[Box, Boxed]):
    """Asks its child again every second while it has no answer."""

    name = "mover"

    async def run(self, ctx: SagaContext, box: Box) -> Boxed:
        return await ctx.child(Fragile, box, poll=1)


class Wrapper(Saga[Box, Boxed]):
    """A child whose last input is a participant's reply (the inbox's batch path)."""

    name = "wrapper"

    async def run(self, ctx: SagaContext, box: Box) -> Boxed:
        await ctx.step("wrap", to="wrapping", command=Wrap(label=box.label))
        return Boxed(label=box.label)


class Napper(Saga[Box, Boxed]):
    """A child whose last input is a timer (the timer path)."""

    name = "napper"

    async def run(self, ctx: SagaContext, box: Box) -> Boxed:
        await ctx.sleep(timedelta(milliseconds=300))
        return Boxed(label=box.label)


class Patient(Saga[Box, Boxed]):
    """Waits for its child without asking again (no poll): only the child's end, sent
    again from its history, can finish it."""

    name = "patient"

    async def run(self, ctx: SagaContext, box: Box) -> Boxed:
        child: type[Saga[Any, Any]] = {"wrap": Wrapper, "nap": Napper}.get(box.label, Fragile)
        done = await ctx.child(child, box, poll=None)
        return Boxed(label=done.label)


def _settings(pg: PgTarget, kafka_bootstrap: str, unique_id: str, **kafka: Any) -> Settings:
    settings = real_settings(pg, kafka_bootstrap, unique_id)
    return settings.model_copy(update={"kafka": settings.kafka.model_copy(update=kafka)})


async def _status(worker: SagaWorker, saga_id: str) -> SagaStatus | None:
    assert worker.engine is not None
    try:
        return (await worker.engine.get(saga_id)).status
    except Exception:
        return None


async def _reaches(worker: SagaWorker, saga_id: str, wanted: SagaStatus, timeout: float) -> None:
    await eventually(
        lambda: _status(worker, saga_id),
        until=lambda status: status == wanted,
        timeout=timeout,
        what=f"saga {saga_id} to be {wanted.value}",
    )


def _signal(saga_id: str, ok: bool) -> Envelope:
    return Envelope(
        message_type=MessageType.SIGNAL,
        source="/test",
        saga_id=saga_id,
        subject="go",
        body={"name": "go", "signal_id": str(uuid.uuid4()), "payload": {"ok": ok}},
    )


def _cancel(saga_id: str) -> Envelope:
    return Envelope(
        message_type=MessageType.CANCEL,
        source="/test",
        saga_id=saga_id,
        subject="cancel",
        body={"reason": "the customer changed their mind"},
    )


async def test_an_undo_reaching_a_child_that_failed_first_completes_the_parents_undo(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    # One inbox partition: the records below are applied in the order they are written.
    settings = _settings(pg, kafka_bootstrap, unique_id, partitions=1)
    async with SagaWorker(settings, [Mover, Fragile]) as worker:
        assert worker.engine is not None
        parent = await worker.engine.start(Mover, Box(label="vase"))
        child = child_saga_id(parent, "fragile")
        await _reaches(worker, child, SagaStatus.RUNNING, 30)
        # The child fails, and the parent is cancelled before the child's end (written
        # after both) reaches it: the parent's undo meets a child that has ended.
        inbox = Topics.of(settings.kafka).inbox
        await produce(settings, inbox, _signal(child, ok=False), _cancel(parent))
        await _reaches(worker, child, SagaStatus.FAILED, 30)
        # Answered under the undo's id: the parent ends cancelled, not stuck after ten
        # unanswered undos (one a second).
        await _reaches(worker, parent, SagaStatus.CANCELLED, 8)
        kinds = [e.kind for e in await worker.engine.history(parent)]
        assert "compensation_stuck" not in kinds


async def test_a_repeated_start_after_a_rollout_change_is_answered_by_the_child(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    settings = real_settings(pg, kafka_bootstrap, unique_id)
    async with SagaWorker(settings, [Mover, Fragile, FragileV2]) as worker:
        engine, parts = worker.engine, worker.parts
        assert engine is not None
        await apply_rollout(
            parts, "fragile", RolloutSpec(version=2, percent=0), principal="test", reason="v1"
        )
        parent = await engine.start(Mover, Box(label="vase"))
        child = child_saga_id(parent, "fragile")
        await _reaches(worker, child, SagaStatus.RUNNING, 30)
        assert (await engine.get(child)).saga_version == 1
        # v2 for every new start; its model refuses the child's (v1) input.
        await apply_rollout(
            parts, "fragile", RolloutSpec(version=2, percent=100), principal="test", reason="v2"
        )
        engine.evict(child)
        repeated = parts.stats.counts["child_start_repeated"]
        # The parent asks again (every second): the child, not today's rollout, answers.
        await eventually(lambda: parts.stats.counts["child_start_repeated"] >= repeated + 2)
        assert await _status(worker, parent) == SagaStatus.RUNNING
        await produce(settings, Topics.of(settings.kafka).inbox, _signal(child, ok=True))
        await _reaches(worker, parent, SagaStatus.COMPLETED, 30)
        assert await _status(worker, child) == SagaStatus.COMPLETED


def _fail_first_end(worker: SagaWorker, parent: Callable[[], str | None]) -> list[bytes]:
    """The broker does not take the first child's end sent to ``parent()``: the record
    to the inbox fails as a broken connection would. Returns the failed keys."""
    producer = worker._producer  # the worker's own producer: every path sends through it
    assert producer is not None
    original = producer.send
    failed: list[bytes] = []

    async def send(*args: Any, **kw: Any) -> Any:
        sent = inspect.signature(original).bind(*args, **kw).arguments
        headers = dict(sent.get("headers") or [])
        is_end = headers.get("ce_type") == MessageType.REPLY.value.encode()
        if not failed and is_end and sent.get("key") == (parent() or "").encode():
            failed.append(sent["key"])
            raise KafkaConnectionError("injected: the broker did not take the record")
        return await original(*args, **kw)

    producer.send = send
    return failed


@pytest.mark.parametrize("path", ["signal", "wrap", "nap"])
async def test_a_childs_end_the_broker_did_not_take_is_sent_again(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str, path: str
) -> None:
    settings = real_settings(pg, kafka_bootstrap, unique_id)
    parent_id: list[str] = []
    async with (
        SagaWorker(settings, [Patient, Fragile, Wrapper, Napper]) as worker,
        fake_participant(settings, "wrapping"),
    ):
        assert worker.engine is not None
        failed = _fail_first_end(worker, lambda: parent_id[0] if parent_id else None)
        parent_id.append(await worker.engine.start(Patient, Box(label=path)))
        parent = parent_id[0]
        if path == "signal":  # the single path: a signal is the child's last input
            child = child_saga_id(parent, "fragile")
            await _reaches(worker, child, SagaStatus.RUNNING, 30)
            await produce(settings, Topics.of(settings.kafka).inbox, _signal(child, ok=True))
        await _reaches(worker, parent, SagaStatus.COMPLETED, 30)
        assert failed == [parent.encode()]  # the end did fail once, and went again


class Bulky(Saga[Box, Boxed]):
    name = "bulky"

    async def run(self, ctx: SagaContext, box: Box) -> Boxed:
        return await ctx.child(Fragile, Box(label=box.label * 3000), poll=60)


async def test_a_child_input_over_the_size_limit_fails_the_parent_at_once(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    settings = real_settings(pg, kafka_bootstrap, unique_id)
    kafka = settings.kafka.model_copy(update={"max_message_bytes": 8192})
    settings = settings.model_copy(update={"kafka": kafka})
    async with SagaWorker(settings, [Bulky, Fragile]) as worker:
        assert worker.engine is not None
        parent = await worker.engine.start(Bulky, Box(label="crate"))
        # Long before the parent's next poll (a minute): the step fails with the reason.
        await _reaches(worker, parent, SagaStatus.FAILED, 30)
        record = await worker.engine.get(parent)
        assert record.error is not None
        assert "8,192" in record.error["message"]


async def test_an_undo_or_end_from_a_saga_that_is_not_linked_is_dead_lettered(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    settings = real_settings(pg, kafka_bootstrap, unique_id)
    async with SagaWorker(settings, [Patient, Fragile]) as worker:
        engine = worker.engine
        assert engine is not None
        parent = await engine.start(Patient, Box(label="vase"))  # no poll: a still history
        child = child_saga_id(parent, "fragile")
        await _reaches(worker, child, SagaStatus.RUNNING, 30)
        start = next(e for e in await engine.history(parent) if e.kind == "command_issued")
        undo = Envelope(
            message_type=MessageType.UNDO,
            source="/intruder",
            saga_id=child,
            subject="fragile",
            command_id="forged-undo",
            body={"parent_id": "intruder"},
        )
        end = Envelope(
            message_type=MessageType.REPLY,
            source="/intruder",
            saga_id=parent,
            command_id=start.command_id,
            causation_id="intruder",
            body={"outcome": "success", "payload": {"label": "forged"}},
        )
        # An undo of a saga no parent started (PROTOCOL.md section 5a): not_parent too.
        root_undo = Envelope(
            message_type=MessageType.UNDO,
            source="/intruder",
            saga_id=parent,
            subject="patient",
            command_id="forged-root-undo",
            body={"parent_id": "intruder"},
        )
        before = {s: await engine.history(s) for s in (parent, child)}
        await produce(settings, Topics.of(settings.kafka).inbox, undo, end, root_undo)
        letters = await dead_letters(settings, 3)
        assert sorted(d["dlq_reason"] for d in letters) == ["not_parent"] * 3
        for saga_id, history in before.items():
            assert await engine.history(saga_id) == history  # untouched, both
        # The real child still answers its real parent.
        await produce(settings, Topics.of(settings.kafka).inbox, _signal(child, ok=True))
        await _reaches(worker, parent, SagaStatus.COMPLETED, 30)
