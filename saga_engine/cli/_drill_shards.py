"""The drill past one database (scenario ``shard-down``): the engines reach each shard
through a proxy of the drill's own (their ``SAGA_PG__SHARDS`` names its address), and a
fault stops one shard for them: the proxy drops its connections and closes new ones at
once, as the port of a stopped Postgres does (the drill cannot stop your cluster; the
other shards, the control database and the drill's own reads are untouched).

Measured in each shard's own ``sagas`` table, by the drill's sagas' end times: while a
shard is down, the other shards' sagas must go on ending, and the stopped shard's, which
wait, must end once it is back (the check "other shards went on while one was down")."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from saga_engine.cli._drill_checks import Check, ProgressWatch, saga_databases
from saga_engine.cli._drill_proxy import PgProxy
from saga_engine.cli._drill_stack import DrillStack
from saga_engine.kernel._errors import CliError
from saga_engine.kernel._settings import Settings

__all__ = ["ShardOutage", "shard_check", "shard_down", "shard_proxies"]


@dataclass(frozen=True)
class ShardOutage:
    """One shard stopped for the engines, from ``start`` to ``end`` (wall times)."""

    shard: str
    start: float
    end: float


async def shard_proxies(stack: DrillStack) -> dict[str, PgProxy]:
    """A proxy in front of each shard, for the engines (``stack.pg_shards``); refused,
    saying why, when the deployment has fewer than two shards."""
    pg = stack.settings.pg
    if len(pg.shards) < 2:
        have = f"{len(pg.shards)} shard" if pg.shards else "one database, no shards"
        raise CliError(
            f"shard-down needs a sharded deployment of two shards or more ({have} here): "
            "set SAGA_PG__SHARDS and SAGA_PG__CONTROL_DSN (docs/operations.md, 'Past one "
            "database')"
        )
    proxies: dict[str, PgProxy] = {}
    shards = []
    for shard in pg.shards:
        parts = urlsplit(shard.dsn.get_secret_value())
        if not parts.hostname:
            raise CliError(f"shard-down needs shard {shard.name}'s DSN as a URL with a host")
        proxy = PgProxy(parts.hostname, parts.port or 5432)
        await proxy.start()
        proxies[shard.name] = proxy
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"127.0.0.1:{proxy.port}"
        via = urlunsplit(parts._replace(netloc=f"{userinfo}@{netloc}" if userinfo else netloc))
        shards.append({"name": shard.name, "partitions": shard.partitions, "dsn": via})
    stack.pg_shards = json.dumps(shards)
    return proxies


async def shard_down(
    stack: DrillStack,
    proxies: dict[str, PgProxy],
    turn: int,
    down_s: float,
    watch: ProgressWatch,
    outages: list[ShardOutage],
) -> str:
    """Stops the ``turn``-th shard (in turns) for the engines for ``down_s`` seconds; the
    line says what ended meanwhile, on that shard and on the others."""
    names = list(proxies)
    shard = names[turn % len(names)]
    start = time.time()
    watch.faults.append(("shard-down", time.monotonic(), start))
    await proxies[shard].stop(down_s)
    outage = ShardOutage(shard, start, time.time())
    outages.append(outage)
    ends = await saga_ends(stack.settings, stack.engine_schema, watch.saga_ids)
    during = {name: _between(rows, outage.start, outage.end) for name, rows in ends.items()}
    others = sum(n for name, n in during.items() if name != shard)
    waiting = sum(1 for i, e in ends[shard].items() if e is None and i in watch.sent_at)
    return (
        f"shard {shard} down for the engines {down_s:.0f}s (its port refused them): "
        f"{others} sagas of the other shards ended meanwhile, {during[shard]} of {shard}'s; "
        f"{waiting} of {shard}'s still open when it came back"
    )


async def saga_ends(
    settings: Settings, schema: str, saga_ids: Sequence[str]
) -> dict[str, dict[str, float | None]]:
    """Each shard's sagas among ``saga_ids`` with their end times (None: not ended, or
    not created yet), read from its own ``sagas`` table; a saga in no table yet is its
    partition's shard's in the settings' map."""
    found: dict[str, dict[str, float | None]] = {}
    for name, dsn in saga_databases(settings).items():
        conn = await asyncpg.connect(dsn)
        try:
            rows = await conn.fetch(
                f'SELECT saga_id, ended_at FROM "{schema}".sagas WHERE saga_id = ANY($1)',
                list(saga_ids),
            )
        except asyncpg.UndefinedTableError:
            rows = []
        finally:
            await conn.close()
        found[name] = {r["saga_id"]: _wall(r["ended_at"]) for r in rows}
    shard_map = settings.shard_map()
    placed = {i for rows in found.values() for i in rows}
    for saga_id in saga_ids:
        if saga_id not in placed and shard_map is not None:
            found[shard_map.shard_of_saga(saga_id)][saga_id] = None
    return found


def _wall(at: datetime | None) -> float | None:
    return None if at is None else at.timestamp()


def _between(rows: dict[str, float | None], start: float, end: float) -> int:
    return sum(1 for e in rows.values() if e is not None and start < e <= end)


async def shard_check(
    settings: Settings,
    schema: str,
    saga_ids: Sequence[str],
    sent_at: dict[str, float],
    outages: list[ShardOutage],
) -> Check:
    """While a shard was down, the other shards' sagas went on ending (when any of them
    was open then); and its own sagas open then ended after it came back."""
    ends = await saga_ends(settings, schema, saga_ids)
    bad: list[str] = []
    notes: list[str] = []
    for outage in outages:
        shard = outage.shard

        def open_then(rows: dict[str, float | None], o: ShardOutage = outage) -> list[str]:
            return [
                i
                for i, e in rows.items()
                if sent_at.get(i, o.end) < o.end and (e is None or e > o.start)
            ]

        others = {i: e for name, rows in ends.items() if name != shard for i, e in rows.items()}
        went_on = _between(others, outage.start, outage.end)
        waited = open_then(ends[shard])
        resumed = sum(1 for i in waited if (e := ends[shard][i]) is not None and e > outage.end)
        if open_then(others) and not went_on:
            bad.append(f"while shard {shard} was down no saga of the other shards ended")
        if resumed < len(waited):
            bad.append(
                f"{len(waited) - resumed} of shard {shard}'s sagas open while it was down "
                "did not end after it came back"
            )
        notes.append(
            f"shard {shard} down {outage.end - outage.start:.0f}s: {went_on} sagas of the "
            f"others ended meanwhile; {len(waited)} of its own waited, {resumed} ended after"
        )
    return Check(
        "other shards went on while one was down", not bad, "; ".join(bad[:5] or notes[:5])
    )
