"""What the engine writes fast is what it wrote before: its deterministic ids are exactly
``uuid.uuid5``'s (ids recorded by earlier engines still match), and an event's stored
JSON is exactly its ``event_to_dict``."""

from __future__ import annotations

import uuid
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from saga_engine.core.history._decision import command_id_for
from saga_engine.core.history._events import event_to_dict, event_to_json, events_from_list
from saga_engine.kernel._ids import uuid4_text, uuid5_text

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
