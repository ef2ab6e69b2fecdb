"""The size rule's cheap bound (``CommandRecords.bound``) is never below the size it
stands for: a command whose bound fits the limit fits it measured, so skipping the
measure changes no refusal (issue 42, lever 2). And the record ``CommandRecords``
writes (its headers directly, from the decision) is what ``encode_fields`` writes of
the command's fields: the same headers in the same order, the same bytes and size."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from saga_engine.core.history._codec import CodecChain, GzipCodec
from saga_engine.core.history._decision import OutboundCommand
from saga_engine.core.history._structs import replace
from saga_engine.kernel._settings import KafkaSettings
from saga_engine.transport._child_wire import ENGINE_PARTICIPANTS
from saga_engine.transport._command_records import SENT_TIME_PLACEHOLDER, CommandRecords
from saga_engine.transport._topics import Topics
from saga_engine.transport._wire import MessageType, encode_fields, record_size

# Any text a saga can name a step, a type or an id with: every plane of Unicode (so
# characters of one to four UTF-8 bytes), but no lone surrogate (refused before this).
_TEXT = st.text(
    st.characters(exclude_categories=["Cs"]) | st.characters(min_codepoint=0x1F300),
    max_size=60,
)
_JSON: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=20,
)


@st.composite
def _commands(draw: st.DrawFn) -> OutboundCommand:
    return OutboundCommand(
        saga_id=draw(_TEXT.filter(bool)),
        saga_type=draw(_TEXT),
        step=draw(_TEXT),
        participant=draw(_TEXT.filter(lambda t: t not in ENGINE_PARTICIPANTS)),
        command_type=draw(_TEXT),
        payload=draw(st.dictionaries(_TEXT, _JSON, max_size=5)),
        command_id=draw(_TEXT),
        attempt=draw(st.integers(1, 10_000)),
        compensation=draw(st.booleans()),
        trace_context=draw(
            st.fixed_dictionaries({}, optional={"traceparent": _TEXT, "tracestate": _TEXT})
        ),
        compensates=tuple(draw(st.lists(_TEXT, max_size=3))),
    )


@settings(max_examples=300, deadline=None)
@given(command=_commands(), source=_TEXT.filter(bool))
def test_the_bound_is_never_below_the_size(command: OutboundCommand, source: str) -> None:
    records = CommandRecords(Topics.of(KafkaSettings()), source)
    bound = records.bound(command)
    if bound is None:  # an engine's own command: measured, never bounded
        return
    assert bound >= records.size(command)


def test_a_command_sealed_by_a_codec_or_for_an_engine_has_no_bound() -> None:
    command = OutboundCommand(
        saga_id="s",
        saga_type="t",
        step="a",
        participant="payments",
        command_type="Charge",
        payload={"amount": 1},
        command_id="c",
        attempt=1,
        compensation=False,
    )
    plain = CommandRecords(Topics.of(KafkaSettings()), "/saga-engine")
    assert plain.bound(command) is not None
    sealed = CommandRecords(Topics.of(KafkaSettings()), "/saga-engine", CodecChain.of(GzipCodec()))
    assert sealed.bound(command) is None
    to_engine = replace(command, participant=next(iter(ENGINE_PARTICIPANTS)))
    assert plain.bound(to_engine) is None


def test_the_bound_counts_four_bytes_a_character() -> None:
    """Text of four-byte characters, longer than the headers' slack: the bound holds."""
    wide = "\U0001f600" * 60
    command = OutboundCommand(
        saga_id=wide,
        saga_type=wide,
        step=wide,
        participant="payments",
        command_type=wide,
        payload={wide: wide},
        command_id=wide,
        attempt=1,
        compensation=True,
        trace_context={"traceparent": wide, "tracestate": wide},
        compensates=(wide, wide),
    )
    records = CommandRecords(Topics.of(KafkaSettings()), wide)
    bound = records.bound(command)
    assert bound is not None
    assert bound >= records.size(command)


def _fields(command: OutboundCommand, source: str) -> dict[str, Any]:
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
    expected = encode_fields(_fields(command, source), command.payload)
    assert (key, value, headers) == expected
    assert topic == Topics.of(KafkaSettings()).commands(command.participant)
    # measured as sent: a record sent differs only in its id and times, of equal length
    _, _, sent_value, sent = records.record(command)
    assert record_size(sent_value, sent) == records.size(command) == record_size(value, headers)
    assert [name for name, _ in sent] == [name for name, _ in headers]
