-- 0024_shard_partitions: which inbox partitions a shard accepts writes for (issue 43), the
-- fence of a sharded store. Kept in each shard's database.
--
-- A shard writes a saga (a create or an append of the group commit) only if the saga's
-- partition (sagas.key_hash % the inbox's partition count) has a row here in state
-- 'active': an engine routing by a map older than a move writes to a shard that no longer
-- holds the partition and is refused (StaleShardMap), reloads the map and writes to the
-- new shard. A range being moved is 'moving' on its source: its sagas' writes are refused
-- (retried later), the other partitions' go on. A move marks a range 'moving' under
-- LOCK TABLE shard_partitions IN ACCESS EXCLUSIVE MODE: the lock waits for every group
-- commit that read the table to end, and every statement after it sees the new state.
--
-- epoch: the shard map's epoch at which this shard received the partition.
-- Every database gets the table (one set of migrations); one database (no shards) leaves
-- it empty and never reads it.
CREATE TABLE shard_partitions (
    partition  int PRIMARY KEY CHECK (partition >= 0),
    state      text NOT NULL CHECK (state IN ('active', 'moving')),
    epoch      bigint NOT NULL CHECK (epoch >= 1),
    changed_at timestamptz NOT NULL DEFAULT now()
);
