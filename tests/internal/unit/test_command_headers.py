"""A command's record as ``CommandRecords`` writes it (its headers directly, from the
decision) is what ``encode_fields`` writes of the command's fields: the same headers in
the same order, the same bytes, so the same size."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from saga_engine.core.history._decision import OutboundCommand
from saga_engine.kernel._settings import KafkaSettings
from saga_engine.transport._child_wire import ENGINE_PARTICIPANTS
from saga_engine.transport._command_records import SENT_TIME_PLACEHOLDER, CommandRecords
from saga_engine.transport._topics import Topics
from saga_engine.transport._wire import MessageType, decode, encode_fields, record_size

_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=20)


@st.composite
def _commands(draw: st.DrawFn) -> OutboundCommand:
    return OutboundCommand(
        saga_id=draw(_TEXT.filter(bool)),
        saga_type=draw(_TEXT),
        step=draw(_TEXT),
        participant=draw(_TEXT.filter(lambda t: t not in ENGINE_PARTICIPANTS)),
        command_type=draw(_TEXT),
        payload=draw(st.dictionaries(_TEXT, st.integers(-(2**63), 2**63 - 1) | _TEXT, max_size=3)),
        command_id=draw(_TEXT),
        attempt=1,
        compensation=draw(st.booleans()),
        trace_context=draw(
            st.fixed_dictionaries({}, optional={"traceparent": _TEXT, "tracestate": _TEXT})
        ),
        compensates=tuple(draw(st.lists(_TEXT, max_size=3))),
    )


def _fields(records: CommandRecords, command: OutboundCommand, source: str) -> dict[str, Any]:
    """The command's fields as the engine gave them to ``encode_fields`` before."""
    trace = command.trace_context
    return {
        "id": "00000000-0000-4000-8000-000000000000",
        "time": SENT_TIME_PLACEHOLDER,
        "message_type": MessageType.COMMAND,
        "source": source,
        "subject": command.command_type,
        "saga_id": command.saga_id,
        "saga_type": command.saga_type,
        "command_id": command.command_id,
        "step": command.step,
        "correlation_id": command.saga_id,
        "causation_id": command.command_id,
        "reply_to": Topics.of(KafkaSettings()).inbox,
        "compensation": command.compensation,
        "compensates": ",".join(command.compensates),
        "traceparent": trace.get("traceparent", ""),
        "tracestate": trace.get("tracestate", ""),
        "sent_time": SENT_TIME_PLACEHOLDER,
    }


@settings(max_examples=200, deadline=None)
@given(command=_commands(), source=_TEXT.filter(bool))
def test_a_commands_record_is_what_encode_fields_writes(
    command: OutboundCommand, source: str
) -> None:
    records = CommandRecords(Topics.of(KafkaSettings()), source)
    topic, key, value, headers = records.record(command, measuring=True)
    expected = encode_fields(_fields(records, command, source), command.payload)
    assert (key, value, headers) == expected
    assert topic == Topics.of(KafkaSettings()).commands(command.participant)
    # measured as sent: a record sent differs only in its id and times, of equal length
    _, _, sent_value, sent = records.record(command)
    assert record_size(sent_value, sent) == records.size(command) == record_size(value, headers)
    assert [name for name, _ in sent] == [name for name, _ in headers]


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
