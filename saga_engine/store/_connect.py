"""The one way to open the event store the settings describe: the Postgres store of the
one database, or, past one database (``SAGA_PG__SHARDS``), a ``ShardedEventStore`` over
one Postgres store per shard, routed by the shard map in force (the control database's,
seeded from the settings on the first start; ``_pgshard_map``).

The engine (``worker``), the client's result reads and the CLI all open it here, so that
each of them talks to the same shards by the same map.

With shards, each shard's store is opened with its fence (``_pgfence``): the first open
of a shard seeds its ``shard_partitions`` from the map in force, read again from the
control database at that moment, by the rule written in ``_pgfence``; the sharded store
reads the map again (``map_loader``) when a shard refuses a write as stale and when the
worker refreshes it.
"""

from __future__ import annotations

from saga_engine.core.history._codec import CodecChain, PayloadCodec
from saga_engine.kernel._settings import PostgresSettings, Settings
from saga_engine.kernel._shards import ShardMap
from saga_engine.store._blobs import BlobStore
from saga_engine.store._pgfence import ShardFence
from saga_engine.store._pgrollouts import PostgresRolloutStore
from saga_engine.store._pgshard_map import PostgresShardMapStore, reconciled
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

    async def open_control() -> PostgresRolloutStore:
        return await PostgresRolloutStore.connect(control)

    async def stored_maps() -> PostgresShardMapStore:
        # One pool to the control database, the sharded store's (closed with it): the
        # rollouts' and the map's reads.
        control_store = await sharded.control()
        assert isinstance(control_store, PostgresRolloutStore)  # open_control's
        return control_store.shard_maps()

    def opener(name: str) -> ShardOpener:
        async def open_shard() -> EventStore:
            store = await PostgresEventStore.connect(
                pg.of_shard(name),
                codec=codec,
                blob_store=blob_store,
                fence=ShardFence(settings_map.partitions, name),
            )
            try:
                stored = await (await stored_maps()).current()
                if stored is not None and stored.moving is None:
                    await store.seed_partitions(stored.map.partitions_of(name), stored.map.epoch)
            except BaseException:
                await store.close()
                raise
            return store

        return open_shard

    async def load_map(known: int) -> ShardMap | None:
        maps = await stored_maps()
        epoch = await maps.epoch()
        if epoch is None or epoch <= known:
            return None
        found = await maps.load()
        return None if found is None else reconciled(found, settings_map)

    sharded = ShardedEventStore(
        shard_map,
        {name: opener(name) for name in shard_map.names},
        control=open_control,
        blob_store=blob_store,
        health=health,
        map_loader=load_map,
    )
    return sharded
