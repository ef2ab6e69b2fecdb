"""Event versions: stored only above 1, old shapes upcast in a chain on load, newer
ones refused with NewerEventError (never guessed at)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from saga_engine.core.history._event_versions import UPCASTERS, VERSION_KEY, EventVersions
from saga_engine.core.history._events import (
    EVENT_TYPES,
    VERSIONS,
    CancelRequested,
    SagaStarted,
    TimerFired,
    event_from_dict,
    event_from_json,
    event_to_dict,
    event_to_json,
    events_from_list,
)
from saga_engine.core.history._status import SagaStatus
from saga_engine.core.history._structs import to_data
from saga_engine.kernel._errors import DefinitionError, NewerEventError
from saga_engine.store._memstore import InMemoryEventStore
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
