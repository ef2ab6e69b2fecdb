"""The drill's Postgres proxy (scenario ``pg-cut``) against the real server: a cut drops
the open connections, holds new ones unanswered for the stall, then forwards again."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from saga_engine.cli._drill_proxy import PgProxy
from tests.conftest import PgTarget
from tests.waiting import scaled


async def test_a_cut_drops_connections_and_stalls_new_ones(pg: PgTarget) -> None:
    parts = urlsplit(pg.database_dsn)
    assert parts.hostname is not None
    proxy = PgProxy(parts.hostname, parts.port or 5432)
    await proxy.start()
    user = parts.netloc.rpartition("@")[0]
    via = urlunsplit(parts._replace(netloc=f"{user}@127.0.0.1:{proxy.port}"))
    try:
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
    finally:
        await proxy.close()
