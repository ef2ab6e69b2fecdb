"""What the engine writes fast is what it wrote before: its deterministic ids are exactly
``uuid.uuid5``'s (ids recorded by earlier engines still match), and an event's stored
JSON is exactly its ``event_to_dict``."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from saga_engine.core.history._decision import command_id_for
from saga_engine.core.history._events import event_to_dict, event_to_json, events_from_list
from saga_engine.kernel._ids import _BATCH, uuid4_text, uuid4_texts, uuid5_text

HISTORIES = Path(__file__).resolve().parents[2] / "replay" / "histories"


@given(st.uuids(), st.text(max_size=300))
def test_uuid5_text_is_uuid5(namespace: uuid.UUID, name: str) -> None:
    assert uuid5_text(namespace, name) == str(uuid.uuid5(namespace, name))


def test_a_command_id_recorded_before_is_derived_again() -> None:
    # What uuid.uuid5 derived for it before (the golden histories hold such ids too).
    assert (
        command_id_for("order-42", "reserve", 0, compensation=False)
        == "1f59b033-f4dd-541a-95d9-1a215120f6e1"
    )


def test_uuid4_text_is_a_random_uuid() -> None:
    ids = {uuid4_text() for _ in range(1000)}
    assert len(ids) == 1000
    for text in list(ids)[:50]:
        parsed = uuid.UUID(text)
        assert (parsed.version, parsed.variant, str(parsed)) == (4, uuid.RFC_4122, text)


@pytest.mark.parametrize("path", sorted(HISTORIES.glob("*.json")), ids=lambda p: p.name)
def test_an_event_is_stored_as_its_dict(path: Path) -> None:
    # The store writes event_to_json; readers (replay, exports, the in-memory store) see
    # event_to_dict: both must be the same JSON value, for every kind in the goldens.
    items = orjson.loads(path.read_bytes())["events"]
    events = events_from_list([{k: v for k, v in i.items() if k != "seq"} for i in items])
    assert events
    for event in events:
        assert orjson.loads(event_to_json(event)) == event_to_dict(event)


@given(st.binary(min_size=16, max_size=16 * 40).map(lambda b: b[: len(b) - len(b) % 16]))
def test_a_batch_of_uuid4_texts_is_uuid4_of_each_16_bytes(raw: bytes) -> None:
    expected = [str(uuid.UUID(bytes=raw[at : at + 16], version=4)) for at in range(0, len(raw), 16)]
    assert uuid4_texts(raw) == expected


def test_message_ids_never_repeat_across_batches() -> None:
    ids = [uuid4_text() for _ in range(3 * _BATCH + 7)]  # three refills at least
    assert len(set(ids)) == len(ids)
    for text in ids:
        parsed = uuid.UUID(text)
        assert (parsed.version, parsed.variant, str(parsed)) == (4, uuid.RFC_4122, text)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_never_hands_out_its_parents_ids() -> None:
    uuid4_text()  # a batch drawn, most of it left
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.write(write, uuid4_text().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read, "rb") as pipe:
        childs = pipe.read().decode()
    parents = {uuid4_text() for _ in range(_BATCH)}
    assert uuid.UUID(childs).version == 4
    assert childs not in parents
