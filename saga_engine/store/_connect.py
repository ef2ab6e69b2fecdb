"""The one way to open the event store the settings describe: the Postgres store of the
one database, or, past one database (``SAGA_PG__SHARDS``), a ``ShardedEventStore`` over
one Postgres store per shard, routed by the shard map in force (the control database's,
seeded from the settings on the first start; ``_pgshard_map``).

The engine (``worker``), the client's result reads and the CLI all open it here, so that
each of them talks to the same shards by the same map.
"""

from __future__ import annotations

from saga_engine.core.history._codec import CodecChain, PayloadCodec
from saga_engine.kernel._settings import PostgresSettings, Settings
from saga_engine.store._blobs import BlobStore
from saga_engine.store._pgrollouts import PostgresRolloutStore
from saga_engine.store._pgshard_map import PostgresShardMapStore
from saga_engine.store._pgstore import PostgresEventStore
from saga_engine.store._shard_router import ShardOpener
from saga_engine.store._sharded import ShardedEventStore
from saga_engine.store._store import EventStore
from saga_engine.telemetry._health import HealthBoard

__all__ = ["connect_event_store"]


async def connect_event_store(
    settings: Settings,
    *,
    pg: PostgresSettings | None = None,
    codec: PayloadCodec | CodecChain | None = None,
    blob_store: BlobStore | None = None,
    health: HealthBoard | None = None,
) -> EventStore:
    """The event store of ``settings`` (``pg``: the same Postgres settings with another
    pool size or schema). With shards, the map in force is read from the control database
    (written there from the settings on the first start), and each shard's store opens on
    first use: an engine connects to the shards of the partitions it owns; the rollouts
    and flow policies are the control database's. ``health``: where a shard that does
    not answer shows (``/health``)."""
    pg = pg or settings.pg
    settings_map = settings.shard_map()
    if settings_map is None or not pg.shards:
        return await PostgresEventStore.connect(pg, codec=codec, blob_store=blob_store)
    control = pg.control()
    async with PostgresShardMapStore.opened(
        control.dsn.get_secret_value(), control.db_schema, timeout_s=control.command_timeout_s
    ) as maps:
        shard_map = await maps.seed(settings_map)

    def opener(name: str) -> ShardOpener:
        async def open_shard() -> EventStore:
            return await PostgresEventStore.connect(
                pg.of_shard(name), codec=codec, blob_store=blob_store
            )

        return open_shard

    async def open_control() -> PostgresRolloutStore:
        return await PostgresRolloutStore.connect(control)

    return ShardedEventStore(
        shard_map,
        {name: opener(name) for name in shard_map.names},
        control=open_control,
        blob_store=blob_store,
        health=health,
    )
