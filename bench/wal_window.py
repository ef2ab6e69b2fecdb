"""The WAL a run wrote, by relation and record kind: ``pg_walinspect`` over the LSN window
of the run, shared by ``bench/store_rows.py`` (the store alone) and ``bench/e2e.py
--wal-breakdown`` (the whole pipeline, participants included).

A record is named by the relation its first block touches (``<label>:<relation>``, the
label naming the schema: ``engine``, ``alpha``...; just ``<relation>`` for the label
``""``); a record that touches none (a commit)
by the relations its transaction touched (``<label>:(transaction)``). Records of other
transactions (another session's, a checkpoint's) are counted apart as ``other``. The
grouping runs in SQL: a 30 s load writes about a million records.
"""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import asyncpg

#: Each record's kind, the relation its first block touches (by filenode) and its
#: transaction; a record of no relation takes its transaction's label; grouped.
_GROUPED = r"""
WITH recs AS (
    SELECT resource_manager || '/' || split_part(record_type, ' ', 1) AS kind,
           (regexp_match(block_ref, 'rel \d+/\d+/(\d+)'))[1] AS node,
           xid::text::int8 AS xid, record_length
    FROM public.pg_get_wal_records_info($1::text::pg_lsn, $2::text::pg_lsn)
), named AS (
    SELECT recs.*, rel.name FROM recs
    LEFT JOIN unnest($3::text[], $4::text[]) AS rel(node, name) USING (node)
), xids AS (
    SELECT xid, min(split_part(name, ':', 1)) AS label FROM named
    WHERE name IS NOT NULL AND xid <> 0 GROUP BY xid
)
SELECT coalesce(n.name, x.label || ':(transaction)') AS relation,
       n.kind, count(*)::int8 AS records, sum(n.record_length)::int8 AS bytes
FROM named AS n LEFT JOIN xids AS x USING (xid)
GROUP BY 1, 2
"""


@dataclass
class WalCounts:
    """The window's records: ``(relation, kind) -> (records, bytes)``; ``relation`` None
    for another transaction's."""

    cells: dict[tuple[str | None, str], tuple[int, int]] = field(default_factory=dict)

    @property
    def records(self) -> int:
        return sum(r for (rel, _), (r, _b) in self.cells.items() if rel is not None)

    @property
    def bytes(self) -> int:
        return sum(b for (rel, _), (_r, b) in self.cells.items() if rel is not None)

    @property
    def other(self) -> int:
        return sum(r for (rel, _), (r, _b) in self.cells.items() if rel is None)

    def by_kind(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for (rel, kind), (r, _b) in self.cells.items():
            if rel is not None:
                out[kind] += r
        return out

    def by_relation(self) -> dict[str, Counter[str]]:
        out: dict[str, Counter[str]] = {}
        for (rel, kind), (r, _b) in self.cells.items():
            if rel is not None:
                out.setdefault(rel, Counter())[kind] += r
        return out

    def per_saga(self, sagas: int) -> dict[str, Any]:
        """The figures per saga: records, bytes, by kind, by relation (each by kind)."""

        def per(counter: Counter[str]) -> dict[str, float]:
            return {k: round(v / sagas, 2) for k, v in counter.most_common() if v}

        relations = self.by_relation()
        return {
            "wal_records_per_saga": round(self.records / sagas, 2),
            "wal_bytes_per_saga": round(self.bytes / sagas),
            "other_wal_records_in_the_window": self.other,
            "wal_records_by_kind_per_saga": per(self.by_kind()),
            "wal_records_by_relation_per_saga": {
                name: {"total": round(sum(c.values()) / sagas, 2), **per(c)}
                for name, c in sorted(relations.items(), key=lambda kv: -sum(kv[1].values()))
            },
        }


async def relations(conn: asyncpg.Connection[Any], schemas: dict[str, str]) -> dict[str, str]:
    """Filenode -> ``<label>:<relation>`` of every
    relation of ``schemas`` (schema -> label), their TOAST tables and indexes included."""
    rows = await conn.fetch(
        "SELECT pg_relation_filenode(c.oid)::text AS node, c.relname, "
        "coalesce(owner_ns.nspname, n.nspname) AS nspname, coalesce(owner.relname, '') AS owner "
        "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "LEFT JOIN pg_class owner ON owner.reltoastrelid = c.oid "
        "LEFT JOIN pg_namespace owner_ns ON owner_ns.oid = owner.relnamespace "
        "WHERE (n.nspname = ANY($1::text[]) OR owner_ns.nspname = ANY($1::text[])) "
        "AND pg_relation_filenode(c.oid) IS NOT NULL",
        list(schemas),
    )
    out = {}
    for r in rows:
        name = f"{r['owner']}(toast)" if r["owner"] else r["relname"]
        out[r["node"]] = f"{schemas.get(r['nspname'], '')}:{name}"
    return out


class WalWindow:
    """Opened before a run (a temporary physical replication slot keeps its WAL until it
    is read, however much is written meanwhile; it goes with the connection), read after."""

    def __init__(self, conn: asyncpg.Connection[Any]) -> None:
        self.conn = conn
        self.slot = f"wal_window_{uuid.uuid4().hex[:8]}"
        self.start = ""

    async def open(self) -> None:
        await self.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect SCHEMA public")
        await self.conn.execute(
            "SELECT pg_create_physical_replication_slot($1, true, true)", self.slot
        )
        self.start = await flush_lsn(self.conn)

    async def read(self, schemas: dict[str, str]) -> WalCounts:
        """The records from the opening to now, of the relations of ``schemas``; the slot
        dropped."""
        end = await flush_lsn(self.conn)
        rels = await relations(self.conn, schemas)
        rows = await self.conn.fetch(_GROUPED, self.start, end, list(rels), list(rels.values()))
        await self.conn.execute("SELECT pg_drop_replication_slot($1)", self.slot)
        return WalCounts(
            {(_shown(r["relation"]), r["kind"]): (int(r["records"]), int(r["bytes"])) for r in rows}
        )


async def flush_lsn(conn: asyncpg.Connection[Any]) -> str:
    """Where the WAL is flushed to: every committed write is before it (pg_walinspect
    reads no further)."""
    lsn: str = await conn.fetchval("SELECT pg_current_wal_flush_lsn()::text")
    return lsn


def _shown(relation: str | None) -> str | None:
    """A relation's name as reported: without the label ``""``'s colon."""
    return relation[1:] if relation and relation.startswith(":") else relation
