-- 0023_shard_map: the shard map of a sharded store (issue 43; kernel/_shards.py), kept in
-- the control database (SAGA_PG__CONTROL_DSN).
--
-- One row per epoch, never updated: the current map is the row of the highest epoch, and
-- the rows before it are the map's history (which range moved where, and when). A change
-- inserts epoch + 1 (store/_pgshard_map.py, `advance`): two writers of the same next epoch
-- meet on the primary key, and the second is refused.
--
-- map: ShardMap.to_data(): {"epoch": n, "partitions": 64, "shards": {"a": "0-31", ...}};
-- names only, the shards' addresses stay in the settings.
-- moving: a move of a range under way, for the online move (`saga shard move`): null
-- when none is.
--
-- Every database gets the table (one set of migrations); only the control database's
-- has rows. One database (no shards) leaves it empty and costs nothing.
CREATE TABLE shard_map (
    epoch      bigint PRIMARY KEY CHECK (epoch >= 1),
    map        jsonb NOT NULL,
    written_at timestamptz NOT NULL DEFAULT now(),
    moving     jsonb
);
