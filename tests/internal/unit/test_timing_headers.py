"""The timing headers (PROTOCOL.md 7.4a): stamped on commands and replies, read leniently
(a value that is not well-formed is left out, never a reason to refuse the reply), and
recorded on the reply's event."""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from datetime import UTC, datetime

import pytest
from aiokafka import TopicPartition
from pydantic import BaseModel

from saga_engine import Saga, SagaContext
from saga_engine.core.history._decision import OutboundCommand
from saga_engine.core.history._events import ReplyReceived, ReplyTimings
from saga_engine.core.history._structs import to_data
from saga_engine.participant._handler_timing import CpuTimed, stamp_timings
from saga_engine.participant._reading import Item
from saga_engine.participant._sql import reply_record
from saga_engine.testing import SagaTestEnv
from saga_engine.transport._command_records import CommandRecords
from saga_engine.transport._timings import echoed_time, reply_timings, wire_time
from saga_engine.transport._topics import Topics
from saga_engine.transport._wire import (
    TIMING_HEADERS,
    Envelope,
    MessageType,
    ReplyBody,
    decode,
    encode,
)

GOOD = {
    "sent_time": "2025-01-31T12:00:00.124012Z",
    "received_time": "2025-01-31T12:00:00.126530Z",
    "handler_start_time": "2025-01-31T12:00:00.127104+00:00",
    "handler_end_time": "2025-01-31T13:00:00.131877+01:00",  # an offset: the same instant zone
    "commit_time": "2025-01-31T12:00:00.133260Z",
    "handler_cpu_ms": "1.842",
}


def _reply(**headers: str) -> Envelope:
    return Envelope(
        message_type=MessageType.REPLY,
        source="/participants/p",
        saga_id="s-1",
        command_id="c-1",
        body={"outcome": "success"},
        **headers,
    )


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


def test_well_formed_timing_headers_are_read() -> None:
    timings = reply_timings(_reply(**GOOD))
    assert timings == ReplyTimings(
        sent_at=_at(GOOD["sent_time"]),
        received_at=_at(GOOD["received_time"]),
        handler_started_at=_at(GOOD["handler_start_time"]),
        handler_ended_at=_at(GOOD["handler_end_time"]),
        committed_at=_at(GOOD["commit_time"]),
        handler_cpu_ms=1.842,
    )
    assert timings is not None
    assert timings.handler_ended_at is not None
    assert timings.handler_ended_at.tzinfo is UTC


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("sent_time", "yesterday"),
        ("received_time", "2025-01-31T12:00:00"),  # no offset: a local time means nothing
        ("handler_start_time", "2025-13-31T12:00:00Z"),
        ("handler_end_time", "0001-01-01T00:00:00+23:59"),  # before year 1 in UTC
        ("commit_time", "2025-01-31T12:00:00Z" + " " * 100),
        ("handler_cpu_ms", "-1"),
        ("handler_cpu_ms", "NaN"),
        ("handler_cpu_ms", "inf"),
        ("handler_cpu_ms", "1e999"),
        ("handler_cpu_ms", "12 ms"),
        ("handler_cpu_ms", "1" * 40),
    ],
)
def test_a_bad_value_is_left_out_and_the_others_kept(field: str, bad: str) -> None:
    timings = reply_timings(_reply(**{**GOOD, field: bad}))
    assert timings is not None
    kept = to_data(timings)  # what is None is left out
    assert len(kept) == len(GOOD) - 1


def test_a_reply_with_only_bad_or_no_timing_headers_has_none() -> None:
    assert reply_timings(_reply()) is None
    assert reply_timings(_reply(sent_time="x", handler_cpu_ms="y")) is None


def test_bad_timing_headers_never_poison_a_reply_on_the_wire() -> None:
    key, value, headers = encode(_reply())
    headers += [
        ("ce_senttime", b"not a time"),
        ("ce_handlercpums", b"-3"),
        ("ce_committime", b"2025-01-31T12:00:00.133260Z"),
    ]
    envelope = decode(key, value, headers, max_bytes=1_000_000)
    assert envelope.body_as(ReplyBody).outcome == "success"
    assert reply_timings(envelope) == ReplyTimings(committed_at=_at(GOOD["commit_time"]))


def test_the_engine_stamps_when_a_command_leaves_always_in_one_length() -> None:
    clock = [1_738_324_800.0]  # 2025-01-31T12:00:00Z, no microseconds
    records = CommandRecords(Topics("saga"), "/saga-engine", clock=lambda: clock[0])
    command = _command()
    _, _, _, headers = records.record(command)
    assert dict(headers)["ce_senttime"] == b"2025-01-31T12:00:00.000000Z"
    size = records.size(command)
    clock[0] += 0.123456
    _, _, _, headers = records.record(command)
    assert dict(headers)["ce_senttime"] == b"2025-01-31T12:00:00.123456Z"
    # The size the step was measured at is the size sent, whenever it is sent.
    assert records.size(command) == size


def test_a_reply_echoes_only_a_well_formed_sent_time() -> None:
    assert echoed_time(GOOD["sent_time"]) == GOOD["sent_time"]
    assert echoed_time("soon") == ""
    assert echoed_time("") == ""


def _item(command: Envelope, received: float) -> Item:
    item = Item(TopicPartition("t", 0), None, received, command=command, topic="saga.inbox")
    item.outgoing = reply_record(
        command,
        ReplyBody(outcome="success"),
        source="/participants/p",
        topic="saga.inbox",
        codec=None,
    )
    return item


def test_the_kit_stamps_a_reply_after_its_commit() -> None:
    command = Envelope(
        message_type=MessageType.COMMAND,
        source="/saga-engine",
        saga_id="s-1",
        command_id="c-1",
        sent_time=GOOD["sent_time"],
    )
    item = _item(command, 1_738_324_800.0)
    item.handler_times = (1_738_324_800.001, 1_738_324_800.003, 0.0015)
    stamp_timings(item, 1_738_324_800.004)
    assert item.outgoing is not None
    got = {k: v.decode() for k, v in item.outgoing.headers if k.endswith(("time", "cpums"))}
    assert got == {
        "ce_time": got["ce_time"],
        "ce_senttime": GOOD["sent_time"],
        "ce_receivedtime": "2025-01-31T12:00:00.000000Z",
        "ce_handlerstarttime": "2025-01-31T12:00:00.001000Z",
        "ce_handlerendtime": "2025-01-31T12:00:00.003000Z",
        "ce_committime": "2025-01-31T12:00:00.004000Z",
        "ce_handlercpums": "1.500",
    }
    names = [k for k, _ in item.outgoing.headers]
    assert len(names) == len(set(names))
    # What the engine reads back.
    key, value, headers = item.outgoing.key, item.outgoing.value, item.outgoing.headers
    timings = reply_timings(decode(key, value, headers, max_bytes=1_000_000))
    assert timings is not None
    assert timings.handler_cpu_ms == 1.5


def test_a_duplicate_reply_has_no_handler_times() -> None:
    command = Envelope(
        message_type=MessageType.COMMAND, source="/e", saga_id="s-1", command_id="c-1"
    )
    item = _item(command, 1_738_324_800.0)
    item.duplicate = True
    item.handler_times = (1.0, 2.0, 0.5)  # from a pass rolled back
    stamp_timings(item, 1_738_324_800.004)
    assert item.outgoing is not None
    names = {k for k, _ in item.outgoing.headers}
    assert {"ce_receivedtime", "ce_committime"} <= names
    assert not names & {
        "ce_handlerstarttime",
        "ce_handlerendtime",
        "ce_handlercpums",
        "ce_senttime",
    }


async def test_cpu_timed_passes_results_errors_and_cancellations_through() -> None:
    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    timed = CpuTimed(answer())
    assert await timed == 42
    assert timed.cpu_s >= 0
    assert timed.started <= timed.ended

    async def refuse() -> None:
        await asyncio.sleep(0)
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        await CpuTimed(refuse())

    seen: list[str] = []

    async def slow() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    async def run() -> None:
        await CpuTimed(slow())

    task = asyncio.create_task(run())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["cancelled"]


def test_wire_time_is_rfc3339_utc_with_microseconds() -> None:
    assert wire_time(0) == "1970-01-01T00:00:00.000000Z"


@pytest.mark.parametrize(
    "epoch_s",
    [
        0.0,
        1e-7,
        0.5e-6,  # half a microsecond: to even (0)
        1.5e-6,  # to even (2)
        0.9999995,  # rounds up into the next second
        59.9999999,
        1_738_324_800.004,
        1_738_324_799.9999996,  # across a minute, an hour, a day
        1_767_225_599.9999999,  # and a year
        253_402_300_799.0,  # the last second datetime can write
    ],
)
def test_wire_time_writes_what_datetime_writes(epoch_s: float) -> None:
    # Written from the second's text and the rounded microseconds; the text is
    # datetime's to the character, carries and half-to-even rounding included.
    expected = datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="microseconds")
    assert wire_time(epoch_s) == expected.replace("+00:00", "Z")
    assert wire_time(epoch_s) == wire_time(epoch_s)  # again, from what it kept


def test_wire_time_refuses_what_datetime_refuses() -> None:
    for bad, error in [(math.nan, ValueError), (math.inf, OverflowError), (1e20, OverflowError)]:
        with pytest.raises(error):
            datetime.fromtimestamp(bad, UTC)
        with pytest.raises(error):
            wire_time(bad)


def test_a_reply_gets_its_timing_headers_in_the_protocols_order() -> None:
    command = Envelope(
        message_type=MessageType.COMMAND, source="/e", saga_id="s-1", command_id="c-1"
    )
    item = _item(command, 1_738_324_800.0)
    item.handler_times = (1_738_324_800.001, 1_738_324_800.003, 0.0015)
    stamp_timings(item, 1_738_324_800.004)
    assert item.outgoing is not None
    stamped = [k for k, _ in item.outgoing.headers if k in TIMING_HEADERS.values()]
    assert stamped == [h for f, h in TIMING_HEADERS.items() if f != "sent_time"]


class Order(BaseModel):
    n: int = 1


class Cmd(BaseModel):
    n: int


class One(Saga[Order, Order]):
    name = "one-timed"

    async def run(self, ctx: SagaContext, input: Order) -> Order:
        await ctx.step("a", to="alpha", command=Cmd(n=input.n))
        return input


async def test_a_replys_timings_are_recorded_on_its_event_and_kept_in_history() -> None:
    env = SagaTestEnv([One])
    engine = env.engine
    saga_id = await engine.start(One, {"n": 1})
    command = next(c for c in env.bus.sent if c.saga_id == saga_id)
    timings = reply_timings(_reply(**GOOD))
    await engine.deliver(
        saga_id, engine.reply_input(command.command_id, "success", {}, timings=timings)
    )
    (reply,) = [e for e in await engine.history(saga_id) if isinstance(e, ReplyReceived)]
    assert reply.timings == timings


def _command() -> OutboundCommand:
    return OutboundCommand(
        saga_id="s-1",
        saga_type="t",
        step="a",
        participant="p",
        command_type="Cmd",
        command_id="c-1",
        payload={"n": 1},
        attempt=1,
        compensation=False,
    )


def test_a_command_sent_has_a_new_id_and_is_made_when_sent() -> None:
    records = CommandRecords(Topics("saga"), "/saga-engine")
    before = datetime.now(UTC)
    first = decode(*records.record(_command())[1:], max_bytes=1 << 20)
    second = decode(*records.record(_command())[1:], max_bytes=1 << 20)
    assert first.id != second.id
    assert all(uuid.UUID(m.id).version == 4 for m in (first, second))
    # one reading of the wall clock: made when it was sent
    assert first.sent_time == first.time.isoformat().replace("+00:00", "Z")
    assert before <= first.time <= second.time <= datetime.now(UTC)


def test_a_clock_of_its_own_stamps_only_the_sent_time() -> None:
    records = CommandRecords(Topics("saga"), "/saga-engine", clock=lambda: 1_738_324_800.0)
    before = time.time()
    message = decode(*records.record(_command())[1:], max_bytes=1 << 20)
    assert message.sent_time == "2025-01-31T12:00:00.000000Z"
    assert message.time.timestamp() >= before  # ce_time is the wall clock's
