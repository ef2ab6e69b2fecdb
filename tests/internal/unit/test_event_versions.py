"""Event versions: stored only above 1, old shapes upcast in a chain on load, newer
ones refused with NewerEventError (never guessed at). And a stored history read from
its text in one pass (``events_from_json``, ``event_from_json``, the Postgres store's
``events::json`` rows): the same events as the way of a dict, with the same refusals."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from saga_engine.core.history._event_versions import UPCASTERS, VERSION_KEY, EventVersions
from saga_engine.core.history._events import (
    EVENT_TYPES,
    VERSIONS,
    CancelRequested,
    CommandIssued,
    CompensationSpec,
    Event,
    SagaStarted,
    TimerFired,
    event_from_dict,
    event_from_json,
    event_to_dict,
    event_to_json,
    events_from_json,
    events_from_list,
)
from saga_engine.core.history._policy import RetryPolicy
from saga_engine.core.history._status import SagaStatus
from saga_engine.core.history._structs import InvalidRecord, _dec_hook, to_data
from saga_engine.kernel._errors import DefinitionError, NewerEventError
from saga_engine.store._memstore import InMemoryEventStore
from saga_engine.store._pgbase import _stored_events, unnest_rows
from saga_engine.store._store import NewSaga, Projection

AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def _started(**extra: Any) -> SagaStarted:
    return SagaStarted(at=AT, saga_type="place-order", input={"n": 1}, **extra)


def test_a_version_1_event_is_stored_exactly_as_before() -> None:
    fired = TimerFired(at=AT, timer_id="t-1")
    assert type(fired).version == 1
    data = event_to_dict(fired)
    assert VERSION_KEY not in data
    assert data == to_data(fired)
    assert orjson.loads(event_to_json(fired)) == data


def test_saga_started_is_at_version_2_and_says_so() -> None:
    assert VERSIONS.version_of("saga_started") == 2
    data = event_to_dict(_started(saga_version=3))
    assert data[VERSION_KEY] == 2
    assert data["saga_version"] == 3
    assert event_from_dict(data) == _started(saga_version=3)
    assert event_from_json(event_to_json(_started())) == _started()


def test_a_version_1_saga_started_is_upcast_to_saga_version_1() -> None:
    old = to_data(_started())
    del old["saga_version"]  # as every start before saga versions was stored
    assert VERSION_KEY not in old
    loaded = event_from_dict(old)
    assert isinstance(loaded, SagaStarted)
    assert loaded.saga_version == 1
    # The stored dict is not changed in place (a caller may hold it).
    assert "saga_version" not in old


def test_every_versioned_kind_has_its_upcasters() -> None:
    for event_type in EVENT_TYPES:
        kind = event_type.kind
        for version in range(1, event_type.version):
            assert (kind, version) in UPCASTERS, (kind, version)


def test_upcasters_chain_in_order() -> None:
    seen: list[str] = []

    def v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
        seen.append("1->2")
        data["reason"] = f"[{data.pop('why')}]"  # v1 called it "why"
        return data

    def v2_to_v3(data: dict[str, Any]) -> dict[str, Any]:
        seen.append("2->3")
        data.setdefault("principal", "legacy")  # v3 made the principal explicit
        return data

    versions = VERSIONS.with_version("cancel_requested", 2, v1_to_v2).with_version(
        "cancel_requested", 3, v2_to_v3
    )
    v1 = {"at": AT.isoformat(), "kind": "cancel_requested", "why": "too slow"}
    event = event_from_dict(v1, versions)
    assert event == CancelRequested(at=AT, reason="[too slow]", principal="legacy")
    assert seen == ["1->2", "2->3"]
    seen.clear()
    v2 = {"at": AT.isoformat(), "kind": "cancel_requested", "reason": "r", VERSION_KEY: 2}
    assert event_from_dict(v2, versions) == CancelRequested(at=AT, reason="r", principal="legacy")
    assert seen == ["2->3"]
    seen.clear()
    v3 = {"at": AT.isoformat(), "kind": "cancel_requested", "reason": "r", VERSION_KEY: 3}
    assert event_from_dict(v3, versions) == CancelRequested(at=AT, reason="r")
    assert seen == []
    # A whole history goes through the same path (replay files, archives).
    assert events_from_list([v1, v3], versions)[0].reason == "[too slow]"  # type: ignore[union-attr]


def test_an_event_from_a_newer_engine_is_refused_by_name() -> None:
    newer = event_to_dict(TimerFired(at=AT, timer_id="t"))
    newer[VERSION_KEY] = 2
    with pytest.raises(NewerEventError, match=r"'timer_fired' at version 2.*up to version 1"):
        event_from_dict(newer)
    with pytest.raises(NewerEventError, match="'child_started' this engine does not know"):
        event_from_dict({"at": AT.isoformat(), "kind": "child_started", "child_id": "c"})
    with pytest.raises(NewerEventError) as caught:
        event_from_dict({"kind": "saga_started", VERSION_KEY: 9})
    exc = caught.value
    assert (exc.kind, exc.version, exc.known, exc.reason) == ("saga_started", 9, 2, "newer_event")


def test_a_version_without_its_upcasters_is_refused_at_definition() -> None:
    with pytest.raises(DefinitionError, match="no upcaster from version"):
        EventVersions.of([("timer_fired", 3)], {("timer_fired", 2): lambda d: d})
    with pytest.raises(DefinitionError, match="does not lead to a version"):
        EventVersions.of([("timer_fired", 1)], {("timer_fired", 1): lambda d: d})


async def test_the_in_memory_store_upcasts_and_refuses_like_postgres() -> None:
    store = InMemoryEventStore()
    await store.create(
        NewSaga("s-1", "place-order", [_started(saga_version=2)], Projection(SagaStatus.RUNNING))
    )
    loaded = await store.load("s-1")
    assert isinstance(loaded.events[0].event, SagaStarted)
    assert loaded.events[0].event.saga_version == 2
    assert (await store.get("s-1")).saga_version == 1  # the NewSaga said nothing else


# --------------------------------------------------------------------------- one pass


def _issued(retry: RetryPolicy) -> CommandIssued:
    return CommandIssued(
        at=AT,
        step="charge",
        participant="payments",
        command_type="Charge",
        payload={"n": 1},
        payload_hash="h",
        command_id="c-1",
        attempt=1,
        compensation=CompensationSpec(
            participant="payments", command_type="Refund", payload={}, retry=retry, timeout_s=3.0
        ),
    )


def _array(*items: Any) -> bytes:
    """A history row's ``events`` as Postgres sends it read as ``json``: jsonb's text
    (keys by length, then bytes; a space after each separator)."""
    return orjson.dumps(list(items)).replace(b'":', b'": ').replace(b",", b", ")


def _rows(*items: Any) -> list[Any]:
    return [{"seq": 1, "kinds": [i["kind"] for i in items], "events": _array(*items)}]


def test_a_row_of_current_shapes_is_read_in_one_pass_as_the_dict_way_reads_it() -> None:
    events: list[Event] = [_started(saga_version=3), TimerFired(at=AT, timer_id="t-1")]
    data = [event_to_dict(e) for e in events]
    read = events_from_json(_array(*data))
    assert read == events == [event_from_dict(d) for d in data]
    assert read is not None
    assert type(read[0]) is SagaStarted  # never its stored shape
    stored = _stored_events(unnest_rows(_rows(*data)), None)
    assert [(s.seq, s.event) for s in stored] == [(1, events[0]), (2, events[1])]


def test_a_start_stored_at_version_1_is_upcast_not_read_in_one_pass() -> None:
    old = to_data(_started())
    del old["saga_version"]
    assert events_from_json(_array(old)) is None
    loaded = _stored_events(unnest_rows(_rows(old)), None)[0].event
    assert isinstance(loaded, SagaStarted)
    assert loaded.saga_version == 1
    assert event_from_json(orjson.dumps(old)) == event_from_dict(old)


def test_an_event_of_a_newer_version_is_refused_by_name() -> None:
    newer = {**event_to_dict(_started()), "_v": 99}
    assert events_from_json(_array(newer)) is None
    with pytest.raises(NewerEventError):
        _stored_events(unnest_rows(_rows(newer)), None)


def test_a_bad_stored_event_is_refused_as_the_dict_way_refuses_it() -> None:
    bad = {**event_to_dict(TimerFired(at=AT, timer_id="t-1")), "timer_id": 7}
    good = event_to_dict(TimerFired(at=AT, timer_id="t-2"))
    with pytest.raises(InvalidRecord) as by_dict:
        event_from_dict(bad)
    with pytest.raises(InvalidRecord) as by_text:
        _stored_events(unnest_rows(_rows(good, bad)), None)
    assert str(by_text.value) == str(by_dict.value)


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, strict=True)

    a: int | float
    b: int | float = 0


def test_a_model_read_again_is_reused_only_for_the_same_json() -> None:
    # 1, 1.0 and True are equal in Python; a strict model reads them apart.
    first = _dec_hook(_Strict, {"a": 1, "b": 1.0})
    assert _dec_hook(_Strict, {"a": 1, "b": 1.0}) is first
    assert type(_dec_hook(_Strict, {"a": 1.0, "b": 1}).a) is float  # swapped types
    assert type(_dec_hook(_Strict, {"b": 1, "a": 1.0}).a) is float  # another key order
    with pytest.raises(ValidationError):
        _dec_hook(_Strict, {"a": True, "b": 1.0})
    assert _dec_hook(_Strict, {"a": 2, "b": 1.0}).a == 2


def test_a_policy_read_again_is_the_policy_written() -> None:
    for retry in (RetryPolicy(max_attempts=2), RetryPolicy(max_attempts=3), RetryPolicy()):
        read = event_from_json(event_to_json(_issued(retry)))
        assert isinstance(read, CommandIssued)
        assert read.compensation is not None
        assert read.compensation.retry == retry
