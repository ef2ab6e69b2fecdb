"""The Postgres store with a payload codec, on the real server: what lands in the rows,
rotation, mixed histories, and a reader without the key (clear error, or "encrypted"
for an operator). The contract itself runs with a codec in test_event_store.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime

import asyncpg
import pytest
from pydantic import SecretStr

from saga_engine.core.history._codec import (
    ENCRYPTED,
    AesGcmCodec,
    CodecChain,
    Undecodable,
    ZstdCodec,
)
from saga_engine.core.history._events import (
    CompensationStarted,
    ErrorInfo,
    Event,
    ReplyReceived,
    SagaCompleted,
    SagaStarted,
    SignalReceived,
)
from saga_engine.core.history._status import SagaStatus
from saga_engine.core.history._structs import to_data
from saga_engine.kernel._errors import CodecError, CodecFailure
from saga_engine.settings import PostgresSettings
from saga_engine.store._migrations import migrate
from saga_engine.store._pgstore import PostgresEventStore
from saga_engine.store._store import Append, NewSaga, Projection
from tests.conftest import PgTarget

CANARY = "canary-7d1e-store"
OLD, NEW = bytes(range(32)), bytes(range(100, 132))


Opener = Callable[[CodecChain | None], Awaitable[PostgresEventStore]]


def chain(current: str = "old", **keys: bytes) -> CodecChain:
    return CodecChain(ZstdCodec(threshold=32), AesGcmCodec(keys or {"old": OLD}, current))


@pytest.fixture
async def opener(pg: PgTarget) -> AsyncIterator[Opener]:
    await migrate(pg.database_dsn, pg.schema)
    opened: list[PostgresEventStore] = []

    async def open_store(codec: CodecChain | None) -> PostgresEventStore:
        store = await PostgresEventStore.connect(
            PostgresSettings(dsn=SecretStr(pg.database_dsn), db_schema=pg.schema), codec=codec
        )
        opened.append(store)
        return store

    yield open_store
    for store in opened:
        await store.close()


def _history() -> list[Event]:
    at = datetime.now(UTC)
    return [
        SagaStarted(at=at, saga_type="order", input={"name": CANARY}),
        ReplyReceived(at=at, step="s", command_id="c", outcome="success", payload={"card": CANARY}),
        SignalReceived(at=at, name="approve", signal_id="g", payload={"by": CANARY}),
        SagaCompleted(at=at, output={"receipt": CANARY * 10}),
    ]


async def test_a_refused_steps_payload_in_an_error_is_sealed_too(
    pg: PgTarget, opener: Opener
) -> None:
    # A refused step's reply payload becomes the StepFailed's details: in the event's
    # error and in the saga's error (sagas.error), next to a clear type and message.
    store = await opener(chain())
    at = datetime.now(UTC)
    error = ErrorInfo(type="StepFailed", message="refused", step="s", details={"card": CANARY})
    events: list[Event] = [
        SagaStarted(at=at, saga_type="order", input={}),
        CompensationStarted(at=at, reason="failure", error=error, owed=["s"]),
    ]
    failing = Projection(SagaStatus.COMPENSATING, error=to_data(error))
    assert await store.create(NewSaga("s-3", "order", events, failing))
    text = await _rows_text(pg)
    assert CANARY not in text
    assert "StepFailed" in text  # the error's type and message stay clear for listings
    loaded = await store.load("s-3")
    assert [e.event for e in loaded.events] == events
    assert loaded.record.error == to_data(error)
    [listed] = await store.list_sagas()
    assert listed.error == to_data(error)
    blind = await opener(None)
    record = await blind.get("s-3")
    assert record.error is not None
    assert record.error["message"] == "refused"
    assert record.error["details"][ENCRYPTED]["failure"] == "not_configured"


async def _rows_text(pg: PgTarget) -> str:
    conn = await asyncpg.connect(pg.dsn)
    try:
        rows = await conn.fetch("SELECT t::text AS t FROM saga_events AS t")
        rows += await conn.fetch("SELECT t::text AS t FROM sagas AS t")
    finally:
        await conn.close()
    return "\n".join(r["t"] for r in rows)


async def test_sealed_rows_hold_no_clear_payload_and_read_back(
    pg: PgTarget, opener: Opener
) -> None:
    store = await opener(chain())
    events = _history()
    assert await store.create(NewSaga("s-1", "order", events[:1], Projection(SagaStatus.RUNNING)))
    await store.append(Append("s-1", 1, events[1:], Projection(SagaStatus.COMPLETED)))
    text = await _rows_text(pg)
    assert "s-1" in text  # the scan sees the rows
    assert CANARY not in text
    assert '""$codec"": ""zstd,aes-gcm""' in text  # quoted by the row's text form
    loaded = await store.load("s-1")
    assert [e.event for e in loaded.events] == events
    assert (await store.first_event("s-1")).event == events[0]
    assert [e.event for e in (await store.histories(["s-1"]))[0].events] == events


async def test_rotation_mixed_histories_and_readers_without_the_key(opener: Opener) -> None:
    open_store = opener
    clear = await open_store(None)
    events = _history()
    # Written in clear before the codec was turned on...
    await clear.create(NewSaga("s-2", "order", events[:1], Projection(SagaStatus.RUNNING)))
    # ... then under the old key, then (after a rotation) under the new one.
    old = await open_store(chain())
    await old.append(Append("s-2", 1, events[1:2], Projection(SagaStatus.RUNNING)))
    rotated = await open_store(chain("new", old=OLD, new=NEW))
    await rotated.append(Append("s-2", 2, events[2:], Projection(SagaStatus.COMPLETED)))

    assert [e.event for e in (await rotated.load("s-2")).events] == events

    # A process without a codec: a clear error naming what is missing...
    with pytest.raises(CodecError) as caught:
        await clear.load("s-2")
    assert caught.value.failure is CodecFailure.NOT_CONFIGURED
    # ...the first event, written in clear, still reads.
    assert (await clear.first_event("s-2")).event == events[0]
    # A process with only the old key: the new key's events fail by key id.
    with pytest.raises(CodecError) as caught:
        await old.load("s-2")
    assert caught.value.failure is CodecFailure.UNKNOWN_KEY
    assert caught.value.key_id == "new"
    # An operator's read shows what it cannot decode as encrypted, with the key id.
    shown = [e.event for e in (await old.load("s-2", undecodable=Undecodable.SHOW)).events]
    assert shown[:2] == events[:2]
    assert isinstance(shown[2], SignalReceived)
    assert shown[2].payload == {
        ENCRYPTED: {"failure": "unknown_key", "codec": "zstd,aes-gcm", "key_id": "new"}
    }
    none = [e.event for e in (await clear.load("s-2", undecodable=Undecodable.SHOW)).events]
    assert isinstance(none[1], ReplyReceived)
    assert none[1].payload[ENCRYPTED]["key_id"] == "old"
    assert none[1].step == "s"
