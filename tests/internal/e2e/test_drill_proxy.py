"""The drill's Postgres proxy (scenarios ``pg-cut`` and ``shard-down``) against the real
server: a cut drops the open connections, holds new ones unanswered for the stall, then
forwards again; a stop drops them and refuses new ones at once, then forwards again."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from saga_engine.cli._drill_proxy import PgProxy
from tests.conftest import PgTarget
from tests.waiting import scaled


@contextlib.asynccontextmanager
async def _proxied(pg: PgTarget) -> AsyncIterator[tuple[PgProxy, str]]:
    """A proxy in front of the test's Postgres, and the DSN through it."""
    parts = urlsplit(pg.database_dsn)
    assert parts.hostname is not None
    proxy = PgProxy(parts.hostname, parts.port or 5432)
    await proxy.start()
    user = parts.netloc.rpartition("@")[0]
    try:
        yield proxy, urlunsplit(parts._replace(netloc=f"{user}@127.0.0.1:{proxy.port}"))
    finally:
        await proxy.close()


async def test_a_cut_drops_connections_and_stalls_new_ones(pg: PgTarget) -> None:
    async with _proxied(pg) as (proxy, via):
        conn = await asyncpg.connect(via)
        assert await conn.fetchval("SELECT 1") == 1
        # Long enough that the probe below meets the stall on a busy machine too.
        cut = asyncio.create_task(proxy.cut(10.0))
        await asyncio.sleep(0)  # the cut drops the connections at once
        with pytest.raises((asyncpg.PostgresConnectionError, ConnectionError, OSError)):
            await conn.fetchval("SELECT 1")
        conn.terminate()
        # During the stall a new connection is neither refused nor answered.
        with pytest.raises(TimeoutError):
            await asyncpg.connect(via, timeout=0.5)
        await cut
        # After the stall the proxy carries connections again (a deadline, not a timing).
        again = await asyncpg.connect(via, timeout=scaled(30))
        assert await again.fetchval("SELECT 2") == 2
        await again.close()
        assert proxy.cuts == 1


async def test_a_stop_drops_connections_and_refuses_new_ones_at_once(pg: PgTarget) -> None:
    async with _proxied(pg) as (proxy, via):
        conn = await asyncpg.connect(via)
        stop = asyncio.create_task(proxy.stop(10.0))
        await asyncio.sleep(0)  # the stop drops the connections at once
        with pytest.raises((asyncpg.PostgresConnectionError, ConnectionError, OSError)):
            await conn.fetchval("SELECT 1")
        conn.terminate()
        # While stopped, a new connection fails at once (a stopped server's port), well
        # before the stop ends: not held as a cut holds it.
        with pytest.raises((asyncpg.PostgresConnectionError, ConnectionError, OSError)):
            await asyncpg.connect(via, timeout=scaled(8))
        assert not stop.done()
        await stop
        again = await asyncpg.connect(via, timeout=scaled(30))
        assert await again.fetchval("SELECT 2") == 2
        await again.close()
        assert (proxy.stats.cuts, proxy.stats.refused) == (1, 1)
