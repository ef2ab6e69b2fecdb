"""The domain events sagas wait for, in Postgres (migration 0011): the facts in
``saga_domain_events``; the waits read from the histories: the ``awaits`` of their
rows (each ``event_awaited`` event's source and key, migration 0022), through the
partial GIN index ``saga_decisions_awaits``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

import asyncpg

from saga_engine.core.history._codec import CodecChain, is_marker
from saga_engine.core.history._events import DomainEventReceived, Event
from saga_engine.kernel._settings import PostgresSettings
from saga_engine.store._domain_store import Expired, StoredFact
from saga_engine.store._pgbase import (
    _init_connection,
    _json,
    _keep_session,
    _unavailable_as_transient,
    history_sql,
)

__all__ = ["PostgresDomainEventStore", "mark_received"]

_COLUMNS: Final = (
    'source, key, event_id, payload, received_at, expires_at, topic, partition, "offset", matched'
)


#: The value of a history row's ``awaits`` that a wait for source {0} and key {1} (SQL
#: expressions) is contained in (migration 0022).
_AWAITS: Final = "jsonb_build_array(jsonb_build_object('source', {0}, 'key', {1}))"
#: Whether saga ``a``'s history received fact ``f``.
_RECEIVED: Final = history_sql(
    "d.saga_id = a.saga_id AND 'domain_event_received' = ANY (d.kinds) "
    "AND d.kinds[e.n::int] = 'domain_event_received' AND e.data ->> 'source' = f.source "
    "AND e.data ->> 'event_id' = f.event_id"
)


class PostgresDomainEventStore:
    def __init__(self, pool: asyncpg.Pool[asyncpg.Record], codec: CodecChain | None) -> None:
        self._pool = pool
        self._codec = codec

    @classmethod
    async def connect(
        cls, settings: PostgresSettings, codec: CodecChain | None = None
    ) -> PostgresDomainEventStore:
        with _unavailable_as_transient():
            pool = await asyncpg.create_pool(
                settings.dsn.get_secret_value(),
                # None held until a saga waits or a fact arrives: a deployment that
                # never uses domain events keeps no connection for them.
                min_size=0,
                max_size=4,  # the consumer, the matcher, the admin API
                command_timeout=settings.command_timeout_s,
                server_settings={"search_path": settings.db_schema},
                init=_init_connection,
                reset=_keep_session,
            )
        return cls(pool, codec)

    async def close(self) -> None:
        await self._pool.close()

    async def migrated(self) -> bool:
        with _unavailable_as_transient():
            found: bool = await self._pool.fetchval(
                "SELECT to_regclass('saga_domain_events') IS NOT NULL"
            )
        return found

    async def record(self, fact: StoredFact) -> bool:
        payload = self._codec.seal(fact.payload) if self._codec is not None else fact.payload
        with _unavailable_as_transient():
            # DO NOTHING: a redelivered record (the consumer crashed before its offset
            # moved on) is the fact kept already, whatever it says now.
            status: str = await self._pool.execute(
                f"INSERT INTO saga_domain_events ({_COLUMNS}) "
                "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, false) "
                "ON CONFLICT (source, event_id) DO NOTHING",
                fact.source,
                fact.key,
                fact.event_id,
                _json(payload),
                fact.received_at,
                fact.expires_at,
                fact.topic,
                fact.partition,
                fact.offset,
            )
        return status.endswith(" 1")

    async def waiting(self, source: str, key: str) -> list[str]:
        with _unavailable_as_transient():
            rows = await self._pool.fetch(
                "SELECT DISTINCT d.saga_id FROM saga_decisions d JOIN sagas s USING (saga_id) "
                f"WHERE d.awaits @> {_AWAITS.format('$1::text', '$2::text')} "
                "AND s.ended_at IS NULL ORDER BY 1",
                source,
                key,
            )
        return [r[0] for r in rows]

    async def kept(self, source: str, key: str, now: datetime) -> list[StoredFact]:
        with _unavailable_as_transient():
            rows = await self._pool.fetch(
                f"SELECT {_COLUMNS} FROM saga_domain_events WHERE source = $1 AND key = $2 "
                "AND expires_at > $3 ORDER BY received_at, event_id",
                source,
                key,
                now,
            )
        return [self._fact(r) for r in rows]

    async def mark_matched(self, source: str, event_id: str, *, key: str) -> None:
        with _unavailable_as_transient():
            await self._pool.execute(
                "UPDATE saga_domain_events SET matched = true "
                "WHERE source = $1 AND event_id = $2 AND NOT matched",
                source,
                event_id,
            )

    async def expire(self, now: datetime) -> Expired:
        with _unavailable_as_transient():
            row = await self._pool.fetchrow(
                "WITH gone AS (DELETE FROM saga_domain_events WHERE expires_at <= $1 "
                "RETURNING matched) SELECT count(*), count(*) FILTER (WHERE NOT matched) FROM gone",
                now,
            )
        assert row is not None
        return Expired(row[0], row[1])

    async def recent(
        self, *, source: str | None = None, unmatched: bool = False, limit: int = 100
    ) -> list[StoredFact]:
        with _unavailable_as_transient():
            rows = await self._pool.fetch(
                f"SELECT {_COLUMNS} FROM saga_domain_events "
                "WHERE ($1::text IS NULL OR source = $1) AND NOT ($2 AND matched) "
                "ORDER BY received_at DESC, event_id DESC LIMIT $3",
                source,
                unmatched,
                limit,
            )
        return [self._fact(r) for r in rows]

    async def receivers(self, facts: Sequence[StoredFact]) -> dict[tuple[str, str], list[str]]:
        matched = [f for f in facts if f.matched]
        if not matched:
            return {}
        with _unavailable_as_transient():
            # Through the partial index of the waits (a saga received only what it
            # waited for), then each such saga's own history rows that received a domain
            # event (its primary key): never a scan of the histories by kind.
            rows = await self._pool.fetch(
                "SELECT DISTINCT f.source, f.event_id, a.saga_id "
                "FROM unnest($1::text[], $2::text[], $3::text[]) AS f(source, key, event_id) "
                f"JOIN saga_decisions a ON a.awaits @> {_AWAITS.format('f.source', 'f.key')} "
                f"WHERE EXISTS ({_RECEIVED}) ORDER BY 1, 2, 3",
                [f.source for f in matched],
                [f.key for f in matched],
                [f.event_id for f in matched],
            )
        out: dict[tuple[str, str], list[str]] = {}
        for source, event_id, saga_id in rows:
            out.setdefault((source, event_id), []).append(saga_id)
        return out

    def _fact(self, r: Any) -> StoredFact:
        payload = r["payload"]
        if self._codec is not None and is_marker(payload):
            payload = self._codec.open(payload)
        return StoredFact(
            source=r["source"],
            key=r["key"],
            event_id=r["event_id"],
            payload=payload,
            received_at=r["received_at"],
            expires_at=r["expires_at"],
            topic=r["topic"],
            partition=r["partition"],
            offset=r["offset"],
            matched=r["matched"],
        )


# The facts that sagas' new events record as received, marked in the transaction that
# appends those events: an engine killed after the append but before a separate mark
# would leave a matched fact counted as unmatched when it expires. SKIP LOCKED, in one
# order: a row another transaction is marking (another saga received the same fact) is
# left to it, so two group commits never wait on each other here.
_MARK_RECEIVED: Final = (
    "UPDATE saga_domain_events d SET matched = true FROM ("
    "SELECT source, event_id FROM saga_domain_events "
    "WHERE (source, event_id) IN (SELECT * FROM unnest($1::text[], $2::text[])) "
    "AND NOT matched ORDER BY source, event_id FOR UPDATE SKIP LOCKED) s "
    "WHERE d.source = s.source AND d.event_id = s.event_id"
)


async def mark_received(conn: Any, events: Sequence[Event]) -> None:
    """Marks the facts ``events`` record as received (none: no statement)."""
    received = sorted(
        {(e.source, e.event_id) for e in events if isinstance(e, DomainEventReceived)}
    )
    if received:
        await conn.execute(
            _MARK_RECEIVED, [source for source, _ in received], [eid for _, eid in received]
        )
