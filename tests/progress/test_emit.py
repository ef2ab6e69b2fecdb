"""``ctx.emit`` (issue 41 §5): numbered, durable progress items, matched on replay and
checked like every other saga output."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from saga_engine import PayloadTooLarge, Saga, SagaContext, SagaStatus, UnstorableValue
from saga_engine.events import ProgressEmitted, event_from_dict, event_to_dict
from saga_engine.replay import HistoryExport, replay
from saga_engine.settings import KafkaSettings, Settings
from saga_engine.testing import SagaTestEnv
from tests.progress.sagas import Order, Status, Tracked


def items(history: list[Any]) -> list[tuple[int, str, Any]]:
    return [(e.number, e.topic, e.payload) for e in history if isinstance(e, ProgressEmitted)]


async def test_items_are_numbered_from_one_across_topics() -> None:
    env = SagaTestEnv([Tracked])
    run = await env.start(Tracked, Order())
    assert await run.status() == SagaStatus.COMPLETED
    assert items(await run.history()) == [
        (1, "status", {"stage": "reserving"}),
        (2, "eta", {"minutes": 5}),
        (3, "status", {"stage": "done"}),
    ]
    assert (await run.output()).items == 3  # type: ignore[attr-defined]


async def test_an_item_round_trips_through_its_stored_form() -> None:
    env = SagaTestEnv([Tracked])
    run = await env.start(Tracked, Order())
    first = next(e for e in await run.history() if isinstance(e, ProgressEmitted))
    assert event_from_dict(event_to_dict(first)) == first
    assert "version" not in event_to_dict(first)


async def test_replay_and_a_restarted_engine_record_no_item_twice() -> None:
    env = SagaTestEnv([Tracked])
    run = await env.start(Tracked, Order(hold=True))
    assert await run.status() == SagaStatus.RUNNING
    before = items(await run.history())
    assert [n for n, _, _ in before] == [1, 2]
    # A restarted engine replays the saga from its history: items 1 and 2 are matched,
    # never recorded again; the next ones go on from 3.
    env.engine = env.new_engine()
    await env.signal(run, "go", Status(stage="packing"))
    after = items(await run.history())
    assert after == [*before, (3, "status", {"stage": "packing"}), (4, "status", {"stage": "done"})]
    result = replay([Tracked], HistoryExport(run.saga_id, Tracked.name, await run.history()))
    assert result.deterministic
    assert result.status == SagaStatus.COMPLETED


class Changed(Saga[Order, Status]):
    """Emits on another topic than the history it replays recorded."""

    name = "tracked"

    async def run(self, ctx: SagaContext, input: Order) -> Status:
        await ctx.emit("stage", Status(stage="reserving"))
        return Status(stage="x")


async def test_code_that_emits_otherwise_on_replay_is_nondeterministic() -> None:
    env = SagaTestEnv([Tracked])
    run = await env.start(Tracked, Order())
    result = replay([Changed], HistoryExport(run.saga_id, Tracked.name, await run.history()))
    assert not result.deterministic
    assert "progress #1 on 'status'" in str(result.error)


class Out(BaseModel):
    outcome: list[str]


class Bad(BaseModel):
    case: str


class Misuse(Saga[Bad, Out]):
    name = "misuse"

    async def run(self, ctx: SagaContext, input: Bad) -> Out:
        seen: list[str] = []
        payload: Any = {
            "unstorable": {"text": "nul \x00 here"},
            "not json": {"when": object()},
            "too large": {"blob": "x" * 5000},
        }.get(input.case)
        if payload is not None:
            try:
                await ctx.emit("status", payload)
            except (UnstorableValue, PayloadTooLarge) as exc:
                seen.append(type(exc).__name__)
            except Exception as exc:
                seen.append(type(exc).__name__)
        else:
            await ctx.emit(input.case, {"stage": "x"})
        # The refused item used no number: the next one is #1.
        seen.append(str(await ctx.emit("status", {"stage": "after"})))
        return Out(outcome=seen)


@pytest.mark.parametrize(
    ("case", "error"),
    [
        ("unstorable", "UnstorableValue"),
        ("not json", "SerializationError"),
        ("too large", "PayloadTooLarge"),
    ],
)
async def test_a_bad_payload_raises_in_the_code_and_records_nothing(case: str, error: str) -> None:
    settings = Settings(kafka=KafkaSettings(max_message_bytes=4096))
    env = SagaTestEnv([Misuse], settings=settings)
    run = await env.start(Misuse, Bad(case=case))
    assert await run.status() == SagaStatus.COMPLETED
    assert (await run.output()).outcome == [error, "1"]  # type: ignore[attr-defined]
    assert [n for n, _, _ in items(await run.history())] == [1]


@pytest.mark.parametrize("topic", ["", "1st", "has space", "x" * 65, "slash/no"])
async def test_a_bad_topic_parks_the_saga_naming_the_rule(topic: str) -> None:
    env = SagaTestEnv([Misuse])
    run = await env.start(Misuse, Bad(case=topic))
    assert await run.status() == SagaStatus.NONDETERMINISTIC
    error = await run.error()
    assert error is not None
    assert error["type"] == "DefinitionError"
    assert "ctx.emit: a progress topic is 1 to 64 letters" in error["message"]
    assert items(await run.history()) == []
