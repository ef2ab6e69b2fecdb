"""The Postgres event store (asyncpg), with group commit.

Tables (see migrations/0001_initial.sql): ``sagas`` holds one row per saga, both the
listing projection and the optimistic-concurrency guard ``last_seq``; ``saga_decisions``
holds the history (migration 0022), one row per append (a decision: its events as one
array), keyed by (saga_id, seq) of its first event; sequences are per event, a row
spans ``seq..last_seq``. ``saga_events`` is a view of it, one row per event.

Writes are conditional. An append names the sequence it expects to be the saga's last;
it is applied only if the ``sagas`` row still says so, and otherwise fails with
ConcurrencyError carrying the actual last sequence, so a stale owner learns it lost the
saga before it sends any effect.

Group commit: creates and appends from concurrent callers are queued, and one flusher
task writes a whole batch in ONE transaction with set-based statements, so a thousand
sagas advancing at once cost a few commits instead of a thousand. Each operation in a
batch still succeeds or fails on its own. A caller learns the outcome only after COMMIT;
a caller cancelled while its operation is being written does not stop the write.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Generic, TypeAlias, TypeVar

import asyncpg

from saga_engine.core.history._blobref import collecting
from saga_engine.core.history._codec import CodecChain, PayloadCodec, seal_error, seal_event
from saga_engine.core.history._events import (
    Event,
    EventAwaited,
    event_to_dict,
    event_to_json,
)
from saga_engine.core.history._status import SagaStatus
from saga_engine.kernel._errors import (
    ConcurrencyError,
    MigrationError,
    SagaNotFound,
    StoreUnavailable,
)
from saga_engine.kernel._partitioning import key_hash
from saga_engine.kernel._serde import JsonDict, dumps
from saga_engine.kernel._settings import PostgresSettings
from saga_engine.store._blobs import BlobStore
from saga_engine.store._pgbase import (
    _Conn,
    _connection_lost,
    _EncodedJson,
    _init_connection,
    _json,
    _keep_session,
    _translate,
    _unavailable_as_transient,
    transient_cause,
)
from saga_engine.store._pgblobs import PostgresRecordBlobs, sweep_blobs, write_blobs
from saga_engine.store._pgconcurrency_keys import PostgresKeySlots
from saga_engine.store._pgdomain import mark_received
from saga_engine.store._pgfence import ShardFence, seed_partitions
from saga_engine.store._pginsights import PostgresInsights, ends_saga, record_ended
from saga_engine.store._pglisting import PostgresListing
from saga_engine.store._pgqueries import PostgresReads
from saga_engine.store._pgretention import PostgresRetention
from saga_engine.store._pgrollouts import PostgresRollouts
from saga_engine.store._pgwrites import (
    CURRENT_SEQS,
    INSERT_DECISIONS,
    INSERT_SAGAS,
    PLAN_GUARDS,
    SAGAS_KEY,
    SET_SAGA_VERSIONS,
    UPDATE_GUARDS,
)
from saga_engine.store._store import Append, NewSaga, check_new_saga_id, wake_slot
from saga_engine.telemetry._telemetry import detach_from_trace

__all__ = ["GroupCommitConfig", "GroupCommitStats", "PostgresEventStore", "StoreUnavailable"]

# --------------------------------------------------------------------------- config


@dataclass(frozen=True, slots=True)
class GroupCommitConfig:
    """How appends are batched.

    ``max_batch``: the most operations one transaction writes. ``enabled=False`` writes
    each create/append in its own transaction, on the caller's task (to measure what
    group commit buys, and as an escape hatch).
    """

    max_batch: int = 500
    enabled: bool = True

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, not {self.max_batch}")


@dataclass(frozen=True, slots=True)
class GroupCommitStats:
    """Counters since the store was opened: how well writes are being batched."""

    batches: int = 0
    operations: int = 0
    largest_batch: int = 0


# --------------------------------------------------------------------------- operations


@dataclass(slots=True, eq=False)
class _PreparedEvents:
    """A saga's new events, encoded in the caller's task (a bad value fails only it)."""

    kinds: list[str]
    data: list[_EncodedJson]
    #: The blobs of the payloads stored by reference (content hash -> bytes).
    blobs: dict[str, bytes] = field(default_factory=dict)
    #: What its event_awaited events wait for (the history row's ``awaits``), or None.
    awaits: _EncodedJson | None = None

    @classmethod
    def of(cls, events: Sequence[Event], codec: CodecChain | None) -> _PreparedEvents:
        kinds: list[str] = [e.kind for e in events]
        if codec is None:
            out = cls(kinds, [_EncodedJson(event_to_json(e)) for e in events])
        elif codec.reference is None:
            out = cls(
                kinds, [_EncodedJson(dumps(seal_event(codec, event_to_dict(e)))) for e in events]
            )
        else:
            with collecting() as blobs:
                data = [_EncodedJson(dumps(seal_event(codec, event_to_dict(e)))) for e in events]
            out = cls(kinds, data, blobs)
        if "event_awaited" in kinds:
            # Source and key are outside any codec (a wait is found by them).
            out.awaits = _EncodedJson(
                dumps(
                    [
                        {"source": e.source, "key": e.key}
                        for e in events
                        if isinstance(e, EventAwaited)
                    ]
                )
            )
        return out


def _error_json(error: JsonDict | None, codec: CodecChain | None) -> _EncodedJson | None:
    return _json(error if codec is None else seal_error(codec, error))


T = TypeVar("T")


class _Settles(Generic[T]):
    """Hands a batched write's outcome to its caller: only after the commit, or a failure."""

    __slots__ = ()
    future: asyncio.Future[T]
    outcome: T | BaseException | None

    def resolve(self) -> None:
        if self.future.done():
            return
        if isinstance(self.outcome, BaseException):
            self.future.set_exception(self.outcome)
        elif self.outcome is None:
            self.future.set_exception(RuntimeError("a write finished without an outcome"))
        else:
            self.future.set_result(self.outcome)

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)


@dataclass(slots=True, eq=False)
class _CreateOp(_Settles[bool]):
    new: NewSaga
    events: _PreparedEvents
    error: _EncodedJson | None
    at: datetime
    future: asyncio.Future[bool]
    #: Set by a write attempt; handed to the caller only once the transaction committed.
    outcome: bool | BaseException | None = None

    @property
    def saga_id(self) -> str:
        return self.new.saga_id


@dataclass(slots=True, eq=False)
class _AppendOp(_Settles[int]):
    append: Append
    events: _PreparedEvents
    error: _EncodedJson | None
    at: datetime | None
    future: asyncio.Future[int]
    outcome: int | BaseException | None = None

    @property
    def saga_id(self) -> str:
        return self.append.saga_id


_Op: TypeAlias = "_CreateOp | _AppendOp"


@dataclass(slots=True)
class _EventRows:
    """Columns of the history INSERT, one entry per operation written (a decision:
    migration 0022)."""

    saga_ids: list[str] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)
    last_seqs: list[int] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    events: list[_EncodedJson] = field(default_factory=list)
    awaits: list[_EncodedJson | None] = field(default_factory=list)
    #: (saga id, content hash) of every blob the events reference, and the blobs.
    references: list[tuple[str, str]] = field(default_factory=list)
    blobs: dict[str, bytes] = field(default_factory=dict)

    def add(self, saga_id: str, first_seq: int, events: _PreparedEvents) -> None:
        n = len(events.kinds)
        if not n:
            return  # an append of no events: its guard only
        self.saga_ids.append(saga_id)
        self.seqs.append(first_seq)
        self.last_seqs.append(first_seq + n - 1)
        self.kinds.append(",".join(events.kinds))
        self.events.append(_EncodedJson(b"[" + b",".join(events.data) + b"]"))
        self.awaits.append(events.awaits)
        if events.blobs:
            self.references.extend((saga_id, digest) for digest in events.blobs)
            self.blobs.update(events.blobs)


# --------------------------------------------------------------------------- the store


class PostgresEventStore(
    PostgresReads,
    PostgresListing,
    PostgresRetention,
    PostgresRollouts,
    PostgresKeySlots,
    PostgresInsights,
):
    """The EventStore port on Postgres. Open it with ``await PostgresEventStore.connect``."""

    def __init__(
        self,
        pool: asyncpg.Pool[asyncpg.Record],
        group_commit: GroupCommitConfig | None = None,
        codec: PayloadCodec | CodecChain | None = None,
        blob_store: BlobStore | None = None,
        fence: ShardFence | None = None,
    ) -> None:
        self._pool = pool
        #: The shard's fence (``_pgfence``): None in one database, whose writes never
        #: read ``shard_partitions``.
        self._fence = fence
        #: Seals the payloads of the events written, opens those read (None: stored as
        #: they are, and the write path is the one it always was).
        self._codec = CodecChain.of(codec)
        #: Where the blobs of payloads stored by reference live when not in this
        #: database's ``saga_blobs`` (None: there, written in the events' transaction).
        self._blob_store = blob_store
        self._config = group_commit or GroupCommitConfig()
        self._queue: deque[_Op] = deque()
        self._wakeup = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self._closed = False
        self._stats = GroupCommitStats()

    @classmethod
    async def connect(
        cls,
        settings: PostgresSettings,
        *,
        group_commit: GroupCommitConfig | None = None,
        codec: PayloadCodec | CodecChain | None = None,
        blob_store: BlobStore | None = None,
        fence: ShardFence | None = None,
    ) -> PostgresEventStore:
        """Opens a connection pool on ``settings.db_schema``, which must be migrated.
        ``codec``: seal the payloads of stored events (``CodecChain.from_settings``);
        ``blob_store``: where a ``ref`` codec's blobs live, if not in ``saga_blobs``;
        ``fence``: a shard's, past one database (``_pgfence``): every create and append
        is checked against ``shard_partitions`` and refused with ``StaleShardMap`` for a
        partition the shard does not hold as 'active'."""
        with _unavailable_as_transient():
            pool = await asyncpg.create_pool(
                settings.dsn.get_secret_value(),
                min_size=settings.pool_min_size,
                max_size=settings.pool_max_size,
                command_timeout=settings.command_timeout_s,
                server_settings={
                    # Unqualified table names resolve in the configured schema, as they
                    # did when the migrations created them.
                    "search_path": settings.db_schema,
                    # A plan for each execution, from the table's size now. asyncpg
                    # prepares every statement, and Postgres would otherwise settle on a
                    # generic plan after five runs: one made while the tables were small
                    # (a fresh deployment, right after start) is a sequential scan, and it
                    # stays cached as the tables grow until autovacuum's next ANALYZE.
                    # Measured under load: the batch's row-lock statement took 16 ms per
                    # call that way, against well under 1 ms. Planning a batch statement
                    # costs a few dozen microseconds.
                    "plan_cache_mode": "force_custom_plan",
                },
                init=_init_connection,
                reset=_keep_session,
            )
        try:
            with _unavailable_as_transient():
                migrated = await pool.fetchval(
                    "SELECT to_regclass('sagas') IS NOT NULL "
                    "AND to_regclass('saga_decisions') IS NOT NULL"
                )
        except BaseException:
            await pool.close()
            raise
        if not migrated:
            await pool.close()
            raise MigrationError(
                f"schema {settings.db_schema!r} has no saga tables (or not this release's): "
                "run `saga migrate` (or saga_engine.store._migrations.migrate) before "
                "starting the engine"
            )
        return cls(pool, group_commit, codec, blob_store, fence)

    async def seed_partitions(self, partitions: Collection[int], epoch: int) -> int:
        """Writes this shard's first ``shard_partitions`` rows if it has none (the rule:
        ``_pgfence``); how many it wrote."""
        with _unavailable_as_transient():
            async with self._pool.acquire() as conn:
                return await seed_partitions(conn, partitions, epoch)

    @property
    def stats(self) -> GroupCommitStats:
        return self._stats

    @property
    def group_commit(self) -> GroupCommitConfig:
        return self._config

    # ----------------------------------------------------------------------- writes

    async def create(self, new: NewSaga) -> bool:
        check_new_saga_id(new.saga_id)
        events = list(new.events)
        op = _CreateOp(
            new=new,
            events=_PreparedEvents.of(events, self._codec),
            error=_error_json(new.projection.error, self._codec),
            # Like the in-memory store: time moves with the saga's own events.
            at=events[-1].at if events else datetime.now(UTC),
            future=asyncio.get_running_loop().create_future(),
        )
        await self._put_blobs(op.events)
        await self._submit(op)
        return await op.future

    async def append(self, append: Append) -> int:
        events = list(append.events)
        op = _AppendOp(
            append=append,
            events=_PreparedEvents.of(events, self._codec),
            error=_error_json(append.projection.error, self._codec),
            # None keeps updated_at as it is (an append with no events).
            at=events[-1].at if events else None,
            future=asyncio.get_running_loop().create_future(),
        )
        await self._put_blobs(op.events)
        await self._submit(op)
        return await op.future

    async def _put_blobs(self, events: _PreparedEvents) -> None:
        # Another store's blobs go before the events that reference them; saga_blobs'
        # go in the events' transaction (_write).
        if events.blobs and self._blob_store is not None:
            await self._blob_store.put(events.blobs)

    async def _submit(self, op: _Op) -> None:
        if self._closed:
            raise StoreUnavailable("the event store is closed")
        if not self._config.enabled:
            await self._run_batch([op])
            return
        self._queue.append(op)
        if self._flusher is None:
            self._flusher = asyncio.create_task(
                self._flush_loop(), name="saga-engine event store group commit"
            )
        self._wakeup.set()

    async def _flush_loop(self) -> None:
        # No timer and no waiting for a batch to fill: the first write goes out at once,
        # and whatever queues up while a transaction commits forms the next batch. Under
        # light load a batch has one operation; under heavy load it has many.
        detach_from_trace()
        try:
            while True:
                batch = self._take_batch()
                if batch:
                    await self._run_batch(batch)
                    continue
                if self._closed:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
        finally:
            # Reached with a non-empty queue only if this task was cancelled (the event
            # loop is shutting down): nobody is left to write these.
            while self._queue:
                self._queue.popleft().fail(StoreUnavailable("the event store was shut down"))

    def _take_batch(self) -> list[_Op]:
        """The next batch: queue order, at most one operation per saga.

        A saga's second operation must see the first one's outcome (its expected_seq was
        computed from it), so it waits for the next batch, keeping its place in the queue.
        """
        batch: list[_Op] = []
        seen: set[str] = set()
        deferred: list[_Op] = []
        while self._queue and len(batch) < self._config.max_batch:
            op = self._queue.popleft()
            if op.future.done():
                continue  # the caller was cancelled before its write started: drop it
            if op.saga_id in seen:
                deferred.append(op)
            else:
                seen.add(op.saga_id)
                batch.append(op)
        self._queue.extendleft(reversed(deferred))
        return batch

    async def _run_batch(self, ops: list[_Op]) -> None:
        """Writes ``ops`` and settles each one's future. Raises only BaseExceptions."""
        self._stats = GroupCommitStats(
            batches=self._stats.batches + 1,
            operations=self._stats.operations + len(ops),
            largest_batch=max(self._stats.largest_batch, len(ops)),
        )
        try:
            async with self._pool.acquire() as conn:
                if await self._attempt(conn, ops):
                    return
                # The batch failed for a reason that may belong to one operation alone (a
                # value Postgres refuses, say). Write each on its own so that only the
                # faulty one fails.
                for op in ops:
                    await self._attempt(conn, [op])
        except BaseException as exc:
            # Connection trouble: the transaction's fate is unknown to us, so every
            # operation in it gets a retryable error (an already settled one keeps its
            # outcome; fail() does nothing to it).
            for op in ops:
                op.fail(_translate(exc))
            if not isinstance(exc, Exception):
                raise

    async def _attempt(self, conn: _Conn, ops: list[_Op]) -> bool:
        """Writes ``ops`` in one transaction and settles them after the commit.

        Returns False, settling nothing, when a transaction of several operations failed
        for a reason other than connection trouble (which propagates).
        """
        try:
            # READ COMMITTED explicitly, whatever the server's default: the guard's
            # reasoning (see _write_appends) is READ COMMITTED's, and under a stricter
            # level a lost race would surface as a serialization failure of the whole
            # batch instead of one ConcurrencyError.
            async with conn.transaction(isolation="read_committed"):
                await self._write(conn, ops)
        except Exception as exc:
            if transient_cause(exc) is not None:
                raise
            if _connection_lost(conn):
                raise StoreUnavailable(
                    f"lost the connection to Postgres: {type(exc).__name__}: {exc}"
                ) from exc
            if len(ops) > 1:
                return False
            if _lost_create(ops[0], exc):
                ops[0].outcome = False
                ops[0].resolve()
            else:
                ops[0].fail(_translate(exc))
            return True
        # Only now, after COMMIT returned, may a caller learn that its write is durable.
        for op in ops:
            op.resolve()
        return True

    async def _write(self, conn: _Conn, ops: list[_Op]) -> None:
        """The statements of one transaction: sets each op's outcome, commits nothing."""
        if self._fence is not None:
            # Before the guard, in its transaction: see _pgfence.
            refused = await self._fence.refused(conn, (op.saga_id for op in ops))
            for op in ops:
                op.outcome = refused.get(op.saga_id)
            ops = [op for op in ops if op.outcome is None]
        rows = _EventRows()
        creates = sorted((op for op in ops if isinstance(op, _CreateOp)), key=_by_id)
        appends = sorted((op for op in ops if isinstance(op, _AppendOp)), key=_by_id)
        # Lock order, so that engines writing overlapping batches cannot deadlock: all
        # creates first, then all appends, each in saga_id order. A create waits only on
        # another transaction inserting the same id; an append waits only on another
        # append's row lock (a row being created is invisible to it). Within each phase the
        # shared order rules out cycles, and no append-phase transaction can wait on one
        # still in its create phase, so no cycle spans the phases either.
        if creates:
            await self._write_creates(conn, creates, rows)
        if appends:
            await self._write_appends(conn, appends, rows)
        # The runs this transaction ends wait for the insights' roll-up (migration 0015).
        await record_ended(
            conn,
            [op.saga_id for op in creates if op.outcome is True and ends_saga(op.new.events)]
            + [
                op.saga_id
                for op in appends
                if type(op.outcome) is int and ends_saga(op.append.events)
            ],
        )
        if rows.saga_ids:
            await conn.execute(
                INSERT_DECISIONS,
                rows.saga_ids,
                rows.seqs,
                rows.last_seqs,
                rows.kinds,
                rows.events,
                rows.awaits,
            )
        if rows.references:
            own = rows.blobs if self._blob_store is None else None
            await write_blobs(conn, rows.references, own)
        await mark_received(
            conn, [e for op in appends if type(op.outcome) is int for e in op.append.events]
        )

    @staticmethod
    async def _write_creates(conn: _Conn, ops: list[_CreateOp], rows: _EventRows) -> None:
        # RETURNING can only name the inserted ids, so two creates of one id in a batch
        # would both look created; _take_batch never builds such a batch.
        if len({op.saga_id for op in ops}) != len(ops):
            raise RuntimeError("a batch holds two creates of the same saga id")
        inserted = await conn.fetch(
            INSERT_SAGAS,
            [op.saga_id for op in ops],
            [op.new.saga_type for op in ops],
            [SagaStatus(op.new.projection.status).value for op in ops],
            [len(op.events.kinds) for op in ops],
            [op.new.idempotency_key for op in ops],
            [op.at for op in ops],
            [op.new.projection.current_step for op in ops],
            [op.new.projection.next_wakeup for op in ops],
            [op.error for op in ops],
            [key_hash(op.saga_id) for op in ops],
            [_json(dict(op.new.search)) if op.new.search else None for op in ops],
            [wake_slot(op.new.projection.next_wakeup) for op in ops],
        )
        created = {r["saga_id"] for r in inserted}
        for op in ops:
            op.outcome = op.saga_id in created
            if op.outcome:
                rows.add(op.saga_id, 1, op.events)
        # Only sagas above version 1 (a second version deployed) pay for this statement;
        # the column's default is 1 (migration 0008), so no other create changes. The rows
        # are this transaction's own inserts: no other writer can see, let alone lock, them.
        versioned = [op.new for op in ops if op.outcome and op.new.saga_version > 1]
        if versioned:
            await conn.execute(
                SET_SAGA_VERSIONS,
                [new.saga_id for new in versioned],
                [new.saga_version for new in versioned],
            )

    @staticmethod
    async def _write_appends(conn: _Conn, ops: list[_AppendOp], rows: _EventRows) -> None:
        ids = [op.saga_id for op in ops]
        if len(ops) > 1:
            # The guard locks the batch's rows in saga_id order (see PLAN_GUARDS), so that
            # two engines' batches holding some of the same sagas cannot deadlock. A
            # single row needs no ordering.
            await conn.execute(PLAN_GUARDS)
        # The guard. Isolation is READ COMMITTED (Postgres's default), and that is enough:
        # the UPDATE takes the row lock, so a concurrent writer of the same saga blocks on
        # it until we commit or roll back; then Postgres re-checks its WHERE against the
        # row version we committed (EvalPlanQual), where last_seq is no longer the one it
        # expected, so it updates nothing and learns it lost. Exactly one writer per
        # expected_seq wins, without SERIALIZABLE and without retries. The events are
        # inserted only for the winners, after their guard row is locked and updated, so
        # sequences stay dense; the (saga_id, seq) primary key (a history row's first
        # event) would reject a second append at one position even from a writer that
        # bypassed the guard.
        won = await conn.fetch(
            UPDATE_GUARDS,
            ids,
            [op.append.expected_seq for op in ops],
            [op.append.expected_seq + len(op.events.kinds) for op in ops],
            [SagaStatus(op.append.projection.status).value for op in ops],
            [op.append.projection.current_step for op in ops],
            [op.append.projection.next_wakeup for op in ops],
            [op.error for op in ops],
            [op.at for op in ops],
            [wake_slot(op.append.projection.next_wakeup) for op in ops],
        )
        winners = {int(r["op"]) - 1 for r in won}
        # The saga's last seq once this transaction commits, for every saga updated.
        after = {
            ops[i].saga_id: ops[i].append.expected_seq + len(ops[i].events.kinds) for i in winners
        }
        losers = [op for i, op in enumerate(ops) if i not in winners]
        current: dict[str, int] | None = None
        if losers:
            # Same transaction, fresh snapshot (READ COMMITTED): the latest committed seq.
            found = await conn.fetch(CURRENT_SEQS, [op.saga_id for op in losers])
            current = {r["saga_id"]: r["last_seq"] for r in found}
        for i, op in enumerate(ops):
            expected = op.append.expected_seq
            if i in winners:
                rows.add(op.saga_id, expected + 1, op.events)
                op.outcome = after[op.saga_id]
                continue
            actual = after.get(op.saga_id, None if current is None else current.get(op.saga_id))
            op.outcome = (
                SagaNotFound(op.saga_id)
                if actual is None
                else ConcurrencyError(op.saga_id, expected, actual)
            )

    # ----------------------------------------------------------------------- blobs

    def record_blobs(self) -> PostgresRecordBlobs:
        """Where the blobs of Kafka records by reference are kept and read: this
        database's references, and this store's blob store."""
        return PostgresRecordBlobs(self._pool, self._blob_store)

    async def sweep_blobs(self, grace: timedelta, *, now: datetime | None = None) -> int:
        """Deletes the blobs of payloads stored by reference that no saga references any
        more, last written before ``now`` less ``grace``; returns how many."""
        return await sweep_blobs(self._pool, self._blob_store, grace, now=now)

    # ----------------------------------------------------------------------- lifecycle

    async def close(self) -> None:
        """Writes what is queued, then closes the pool. Later writes raise StoreUnavailable."""
        if self._closed:
            return
        self._closed = True
        self._wakeup.set()
        if self._flusher is not None:
            await self._flusher
        await self._pool.close()


def _by_id(op: _Op) -> str:
    return op.saga_id


def _lost_create(op: _Op, exc: Exception) -> bool:
    """Whether ``exc`` says a create lost to another transaction's create of its id,
    committed while it waited (INSERT_SAGAS): the answer "not created", as for an id that
    existed before."""
    return (
        isinstance(op, _CreateOp)
        and isinstance(exc, asyncpg.UniqueViolationError)
        and exc.constraint_name == SAGAS_KEY
    )
