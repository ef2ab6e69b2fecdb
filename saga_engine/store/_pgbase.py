"""What the Postgres store's writer and readers share: errors, JSON, row mapping.

Connection trouble of any kind becomes ``StoreUnavailable`` (retryable); a value
Postgres cannot store becomes ``SerializationError``. Everything else passes unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final, TypeAlias

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from saga_engine.core.history._codec import CodecChain, Undecodable, open_error, open_event
from saga_engine.core.history._events import (
    EVENT_TYPES,
    Event,
    event_from_dict,
    event_from_json,
    events_from_json,
)
from saga_engine.core.history._status import SagaStatus
from saga_engine.core.history._structs import InvalidRecord, RawJson, json_items
from saga_engine.kernel._errors import SerializationError, StoreUnavailable
from saga_engine.kernel._serde import JsonDict, dumps, loads
from saga_engine.kernel._settings import PostgresSettings
from saga_engine.kernel._startup import Dependency
from saga_engine.store._store import SagaRecord, StoredEvent

_Conn: TypeAlias = "PoolConnectionProxy[asyncpg.Record]"


# Errors that say "the server or the connection is in trouble", not "this request is
# wrong": connection refused/reset/lost (OSError covers socket errors and timeouts),
# SQLSTATE class 08 (connection exception), 53 (insufficient resources, e.g. too many
# connections), 57 (operator intervention: shutdown, restart, "cannot connect now") and
# 40 (transaction rollback: serialization failure, deadlock).
_TRANSIENT: Final = (
    OSError,
    asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.InsufficientResourcesError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.TransactionRollbackError,
)

# Postgres refuses a NUL character in text, and \u0000 in jsonb.
_UNSTORABLE_TEXT: Final = (
    asyncpg.exceptions.CharacterNotInRepertoireError,
    asyncpg.exceptions.UntranslatableCharacterError,
)


def transient_cause(exc: BaseException) -> BaseException | None:
    """The connection trouble behind ``exc``, if any.

    The chain matters: when a connection dies inside a transaction, asyncpg's rollback
    in ``Transaction.__aexit__`` then fails with an InterfaceError ("the underlying
    connection is closed") that replaces the original error, which survives only as its
    ``__context__``.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, (*_TRANSIENT, StoreUnavailable)):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _translate(exc: BaseException) -> BaseException:
    """The error a caller should see for ``exc`` raised while talking to Postgres.

    Returns a new exception each time: one failure can be handed to many callers.
    """
    out: BaseException
    cause = transient_cause(exc)
    if isinstance(cause, StoreUnavailable):
        out = StoreUnavailable(str(cause))
    elif cause is not None:
        out = StoreUnavailable(f"Postgres is unavailable: {type(cause).__name__}: {cause}")
    elif isinstance(exc, _UNSTORABLE_TEXT):
        out = SerializationError(f"Postgres cannot store this value: {exc}")
    elif isinstance(exc, asyncio.CancelledError):
        out = StoreUnavailable(
            "the write was interrupted (the store is closing); it may or may not have committed"
        )
    else:
        return exc
    out.__cause__ = exc
    return out


@contextmanager
def _unavailable_as_transient() -> Iterator[None]:
    """Turns connection trouble into StoreUnavailable; other errors pass unchanged."""
    try:
        yield
    except Exception as exc:
        if transient_cause(exc) is None:
            raise
        raise _translate(exc) from exc


def _connection_lost(conn: _Conn) -> bool:
    try:
        return conn.is_closed()
    except asyncpg.InterfaceError:
        # The pool detaches a proxy from its connection when that connection closes.
        return True


# --------------------------------------------------------------------------- JSON


class _EncodedJson(bytes):
    """JSON already encoded by the caller, passed to a jsonb parameter as is."""


def _encode_jsonb(value: Any) -> bytes:
    # The binary jsonb format is a version byte (1) followed by the JSON text.
    return b"\x01" + (value if isinstance(value, _EncodedJson) else dumps(value))


def _decode_jsonb(data: bytes) -> Any:
    return loads(data[1:])


def _json_text(data: bytes) -> bytes:
    return data


async def _init_connection(conn: asyncpg.Connection[asyncpg.Record]) -> None:
    await conn.set_type_codec(
        "jsonb",
        schema="pg_catalog",
        encoder=_encode_jsonb,
        decoder=_decode_jsonb,
        format="binary",
    )
    # A ``json`` value (the history reads' ``events::json``) comes as its text, undecoded
    # (the binary format of json is its text): read into the events' types in one pass
    # (``_stored_events``), no dicts built first. The engine writes no ``json`` column.
    await conn.set_type_codec(
        "json", schema="pg_catalog", encoder=_json_text, decoder=_json_text, format="binary"
    )


async def _keep_session(conn: asyncpg.Connection[asyncpg.Record]) -> None:
    """The reset of a connection the engine gives back to its pool: nothing to send.

    asyncpg's default reset sends ``SELECT pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN
    *; RESET ALL`` on every release: one round trip per group commit and per read. The
    engine's statements leave no session state to clear: its advisory locks and settings
    are transaction-scoped (``pg_advisory_xact_lock``, ``SET LOCAL``), it opens no cursor
    past a transaction and listens to nothing. An open transaction is still rolled back
    on release (asyncpg does that before calling this). The participant kit keeps the
    default: its handlers run the user's SQL."""


async def side_pool(settings: PostgresSettings, max_size: int) -> asyncpg.Pool[asyncpg.Record]:
    """A small pool of its own on ``settings``' database and schema, for a store beside
    the event store (schedules, batch operations, rollouts past one database): the
    event store's writer keeps its pool for the hot path."""
    with _unavailable_as_transient():
        return await asyncpg.create_pool(
            settings.dsn.get_secret_value(),
            min_size=1,
            max_size=max_size,
            command_timeout=settings.command_timeout_s,
            server_settings={"search_path": settings.db_schema},
            init=_init_connection,
            reset=_keep_session,
        )


def _json(value: JsonDict | None) -> _EncodedJson | None:
    return None if value is None else _EncodedJson(dumps(value))


#: An event as read from the history: its sequence number and its stored JSON.
EventRow: TypeAlias = tuple[int, Any]


def unnest_rows(
    rows: Iterable[asyncpg.Record], keep: Callable[[int, str], bool] | None = None
) -> list[EventRow]:
    """The events of history rows (``seq, kinds, events`` of ``saga_decisions``,
    migration 0022: one row per decision, its events an array, decoded once per row),
    in the rows' order, the event at position ``i`` numbered ``seq + i``; only those
    ``keep(seq, kind)`` accepts (None: all). ``events`` read as ``json`` (its text) is
    split into the events' texts, each read later by ``_stored_events``."""
    if keep is None:
        return [(r["seq"] + i, data) for r in rows for i, data in enumerate(_items(r["events"]))]
    return [
        (r["seq"] + i, data)
        for r in rows
        for i, (kind, data) in enumerate(zip(r["kinds"], _items(r["events"]), strict=True))
        if keep(r["seq"] + i, kind)
    ]


def _items(events: Any) -> list[Any]:
    """A history row's events: decoded already (``jsonb``), or from their text
    (``json``): read into their types in one pass when they all can be, else each
    event's text, read alone by ``_stored_events`` (which upcasts, or says why not)."""
    if type(events) is not bytes:
        return events  # type: ignore[no-any-return]
    return events_from_json(events) or json_items(events)


def _as_dict(data: Any) -> Any:
    """An event's stored value as JSON values, from its text if it is one."""
    return loads(bytes(data)) if type(data) is RawJson else data


#: What ``unnest_rows`` gives for an event read already.
_EVENT_TYPES: Final = frozenset(EVENT_TYPES)


def _event(data: Any) -> Event:
    """An event of a history row as ``unnest_rows`` gives it: read already, its text,
    or its JSON values."""
    kind = type(data)
    if kind is RawJson:
        return event_from_json(data)
    return data if kind in _EVENT_TYPES else event_from_dict(data)


def _stored_events(
    rows: Sequence[EventRow],
    codec: CodecChain | None,
    undecodable: Undecodable = Undecodable.RAISE,
) -> list[StoredEvent]:
    """``(seq, data)`` pairs as events, their sealed payloads opened. ``data``: as
    ``unnest_rows`` gives it (an event read already, an event's text, or its JSON values).

    Without a codec this is the loop it always was: nothing per event for the feature.
    A sealed event then fails validation, and only then does ``open_event`` look at the
    rows, to raise CodecError ("no codec configured") instead of a validation error.
    """
    if codec is None and undecodable is Undecodable.RAISE:
        try:
            return [StoredEvent(seq, _event(data)) for seq, data in rows]
        except InvalidRecord:
            for _, data in rows:
                if type(data) not in _EVENT_TYPES:
                    open_event(None, _as_dict(data))
            raise
    return [
        StoredEvent(
            seq,
            data if type(data) in _EVENT_TYPES else open_event(codec, _as_dict(data), undecodable),
        )
        for seq, data in rows
    ]


def history_sql(where: str) -> str:
    """A query of the events of the history rows ``where`` selects (a condition on
    ``d``, a row of ``saga_decisions``, migration 0022: one row per decision, its events
    an array), one row per event, with the columns of the view ``saga_events``:
    ``saga_id, seq, kind, data, recorded_at``. The event at position ``n`` (1-based) of a
    row is the saga's event ``d.seq + n - 1``."""
    return (
        "SELECT d.saga_id, d.seq + e.n::int - 1 AS seq, d.kinds[e.n::int] AS kind, e.data, "
        "d.recorded_at FROM saga_decisions AS d CROSS JOIN LATERAL "
        f"jsonb_array_elements(d.events) WITH ORDINALITY AS e (data, n) WHERE {where}"
    )


def first_event_sql(path: str, saga_id: str = "s.saga_id") -> str:
    """A scalar subquery: ``path`` (``-> 'parent' ->> 'saga_id'``, say) of the first event
    (its start: the first element of its first history row, one probe of the primary
    key) of the saga ``saga_id`` (an SQL expression)."""
    return (
        f"(SELECT d.events -> 0 {path} FROM saga_decisions AS d "
        f"WHERE d.saga_id = {saga_id} AND d.seq = 1)"
    )


_RECORD_COLUMNS: Final = (
    "saga_id, saga_type, status, last_seq, created_at, updated_at, current_step, "
    "next_wakeup, error, idempotency_key, search, saga_version, ended_at"
)

_OPEN_STATUSES: Final = [s.value for s in SagaStatus if s.is_open]


def _record(row: asyncpg.Record, codec: CodecChain | None = None) -> SagaRecord:
    error = row["error"]
    if error is not None and type(error.get("details")) is dict:
        error = open_error(codec, error)  # its details sealed with a codec (seal_error)
    return SagaRecord(
        saga_id=row["saga_id"],
        saga_type=row["saga_type"],
        status=SagaStatus(row["status"]),
        last_seq=row["last_seq"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        current_step=row["current_step"],
        next_wakeup=row["next_wakeup"],
        error=error,
        idempotency_key=row["idempotency_key"],
        search=row["search"],
        saga_version=row["saga_version"],
        ended_at=row["ended_at"],
    )


#: Postgres at start-up: unreachable while it starts, shuts down or refuses connections
#: for a while (``transient_cause``); any other error is a setting to fix.
POSTGRES = Dependency("Postgres", lambda exc: transient_cause(exc) is not None)
