"""The EventStore contract, run against every adapter.

``memory`` is the in-memory store; ``postgres`` is the Postgres store with group commit
(its default); ``postgres-unbatched`` is the Postgres store writing each operation in its
own transaction, so that concurrent writers really meet on the database's row locks
rather than in the group-commit queue. The Postgres variants need the real server (the
``pg`` fixture fails loudly without it).

``memory-codec`` and ``postgres-codec`` are the same stores with a payload codec
(zstd then AES-GCM) sealing every stored payload: the contract must not change.

``sharded-memory`` and ``sharded-postgres`` are the sharded store (``ShardedEventStore``)
over two stores, in memory or on two Postgres databases (``pg_shards``), its inbox's
partitions split between them unevenly: one store's contract, kept across shards.

The tests at the end are Postgres-only: batching, failure isolation inside a batch,
connection loss and closing.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from pydantic import SecretStr

from saga_engine.core.history._codec import AesGcmCodec, CodecChain, ZstdCodec
from saga_engine.core.history._events import (
    CommandIssued,
    CompensationStarted,
    ErrorInfo,
    Event,
    ParentLink,
    ProgressEmitted,
    ReplyReceived,
    RunContinued,
    SagaCompleted,
    SagaStarted,
    SideEffectRecorded,
    SignalReceived,
    TimerFired,
    TimerStarted,
)
from saga_engine.core.history._status import SagaStatus
from saga_engine.kernel._errors import (
    ConcurrencyError,
    InvalidSagaId,
    SagaNotFound,
    SerializationError,
    StoreUnavailable,
    TransientError,
)
from saga_engine.kernel._partitioning import partition_for
from saga_engine.kernel._shards import ShardMap
from saga_engine.settings import PostgresSettings
from saga_engine.store import _pgwrites
from saga_engine.store._memstore import InMemoryEventStore
from saga_engine.store._migrations import migrate
from saga_engine.store._pgfence import ShardFence
from saga_engine.store._pgrollouts import PostgresRolloutStore
from saga_engine.store._pgstore import GroupCommitConfig, PostgresEventStore
from saga_engine.store._shard_router import ShardOpener
from saga_engine.store._sharded import ShardedEventStore
from saga_engine.store._sharded_control import ControlOpener, ControlStore
from saga_engine.store._store import (
    WAKE_GRID,
    Append,
    ArchivedSaga,
    EventStore,
    NewSaga,
    OpenSummary,
    Projection,
    RunSpan,
    SagaFilter,
    SagaRecord,
    wake_slot,
)
from tests.conftest import PgTarget
from tests.waiting import eventually

RUNNING = Projection(SagaStatus.RUNNING)
HOUR = timedelta(hours=1)


@dataclass(frozen=True)
class Backend:
    name: str
    pg: PgTarget | None
    codec: CodecChain | None = None
    #: The shards' databases of ``sharded-postgres``.
    shards: tuple[PgTarget, ...] = ()
    #: Its control database (rollouts and flow policies).
    control: PgTarget | None = None


def contract_codec() -> CodecChain:
    return CodecChain(ZstdCodec(threshold=64), AesGcmCodec({"k1": bytes(range(32))}, "k1"))


#: The sharded variants' map: eight inbox partitions, split unevenly between two shards.
CONTRACT_SHARDS = ShardMap.build({"a": "0-2,5", "b": "3-4,6-7"}, 8)


#: Every adapter the contract runs against (see the module's docstring).
BACKENDS = (
    "memory",
    "postgres",
    "postgres-unbatched",
    "memory-codec",
    "postgres-codec",
    "sharded-memory",
    "sharded-postgres",
)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Backend:
    return backend_of(request)


def backend_of(request: pytest.FixtureRequest) -> Backend:
    """The backend named by ``request.param`` (a suite that narrows ``BACKENDS`` makes
    its own ``backend`` fixture with this)."""
    codec = contract_codec() if request.param.endswith("-codec") else None
    if request.param in ("memory", "memory-codec", "sharded-memory"):
        return Backend(request.param, None, codec)
    if request.param == "sharded-postgres":
        shards: tuple[PgTarget, ...] = request.getfixturevalue("pg_shards")
        control: PgTarget = request.getfixturevalue("pg")
        return Backend(request.param, shards[0], shards=shards, control=control)
    # Requested only here, so the in-memory variant needs no server.
    pg: PgTarget = request.getfixturevalue("pg")
    return Backend(request.param, pg, codec)


def _settings(pg: PgTarget) -> PostgresSettings:
    return PostgresSettings(dsn=SecretStr(pg.database_dsn), db_schema=pg.schema)


async def _open_pg(
    pg: PgTarget, *, enabled: bool = True, codec: CodecChain | None = None
) -> PostgresEventStore:
    await migrate(pg.database_dsn, pg.schema)
    return await PostgresEventStore.connect(
        _settings(pg), group_commit=GroupCommitConfig(enabled=enabled), codec=codec
    )


async def _open_shard(pg: PgTarget, name: str) -> PostgresEventStore:
    """A shard's store with its fence, seeded as ``connect_event_store`` seeds it: every
    write of the contract is checked against ``shard_partitions``."""
    await migrate(pg.database_dsn, pg.schema)
    store = await PostgresEventStore.connect(
        _settings(pg), fence=ShardFence(CONTRACT_SHARDS.partitions, name)
    )
    await store.seed_partitions(CONTRACT_SHARDS.partitions_of(name), CONTRACT_SHARDS.epoch)
    return store


@pytest.fixture
async def store(backend: Backend) -> AsyncIterator[EventStore]:
    s: EventStore
    if backend.name == "sharded-memory":
        s = _sharded([_memory_opener() for _ in CONTRACT_SHARDS.names], _memory_control)
    elif backend.name == "sharded-postgres":
        # Each shard's store opens when first used, as an engine's do.
        assert backend.control is not None
        s = _sharded(
            [
                functools.partial(_open_shard, pg, name)
                for pg, name in zip(backend.shards, CONTRACT_SHARDS.names, strict=True)
            ],
            functools.partial(_open_control, backend.control),
        )
    elif backend.pg is None:
        s = InMemoryEventStore(codec=backend.codec)
    else:
        s = await _open_pg(
            backend.pg, enabled=backend.name != "postgres-unbatched", codec=backend.codec
        )
    assert isinstance(s, EventStore)
    try:
        yield s
    finally:
        await s.close()


def _sharded(openers: Sequence[ShardOpener], control: ControlOpener) -> ShardedEventStore:
    """``CONTRACT_SHARDS`` over the stores ``openers`` open (one per shard, in order),
    with the control database's store ``control`` opens."""
    return ShardedEventStore(
        CONTRACT_SHARDS,
        dict(zip(CONTRACT_SHARDS.names, openers, strict=True)),
        control=control,
    )


async def _memory_control() -> ControlStore:
    return InMemoryEventStore()


async def _open_control(pg: PgTarget) -> ControlStore:
    await migrate(pg.database_dsn, pg.schema)
    return await PostgresRolloutStore.connect(_settings(pg))


def _memory_opener() -> ShardOpener:
    store = InMemoryEventStore()

    async def opened() -> EventStore:
        return store

    return opened


@pytest.fixture
async def pg_store(pg: PgTarget) -> AsyncIterator[PostgresEventStore]:
    """The Postgres store with group commit, for the Postgres-only tests."""
    s = await _open_pg(pg)
    try:
        yield s
    finally:
        await s.close()


# --------------------------------------------------------------------------- helpers


def _now() -> datetime:
    return datetime.now(UTC)


def _started(saga_type: str = "order") -> SagaStarted:
    return SagaStarted(at=_now(), saga_type=saga_type, input={"order": 1})


def _fired(timer_id: str) -> TimerFired:
    return TimerFired(at=_now(), timer_id=timer_id)


def _new(
    saga_id: str, saga_type: str = "order", status: SagaStatus = SagaStatus.RUNNING
) -> NewSaga:
    return NewSaga(saga_id, saga_type, [_started(saga_type)], Projection(status))


def _append(saga_id: str, expected: int, *events: Event) -> Append:
    return Append(saga_id, expected, list(events), RUNNING)


async def _try_append(store: EventStore, append: Append) -> int | ConcurrencyError:
    try:
        return await store.append(append)
    except ConcurrencyError as exc:
        return exc


async def _seqs(store: EventStore, saga_id: str) -> list[int]:
    return [e.seq for e in (await store.load(saga_id)).events]


# --------------------------------------------------------------------------- create / load


async def test_create_and_load_round_trip_of_several_event_kinds(store: EventStore) -> None:
    at = _now()
    events: Sequence[Event] = [
        SagaStarted(
            at=at,
            saga_type="checkout",
            input={"cart": [1, 2], "total": "12.50", "nested": {"ok": True, "none": None}},
            idempotency_key="idem-1",
            deadline_at=at + timedelta(hours=1),
            trace_context={
                "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
            },
        ),
        CommandIssued(
            at=at,
            step="reserve",
            participant="inventory",
            command_type="Reserve",
            payload={"sku": "ä-ß-€", "qty": 3},
            payload_hash="abc123",
            command_id="cmd-1",
            attempt=1,
            timeout_at=at + timedelta(seconds=30),
        ),
        ReplyReceived(
            at=at, step="reserve", command_id="cmd-1", outcome="success", payload={"id": 7}
        ),
        TimerStarted(at=at, timer_id="t1", purpose="sleep", fire_at=at + timedelta(minutes=5)),
        SideEffectRecorded(at=at, op_id="uuid-1", value=[1, "two", None, 3.5, {"k": False}]),
        SignalReceived(at=at, signal_id="sig-1", name="approve", payload={"by": "bob"}),
        CompensationStarted(
            at=at,
            reason="failure",
            error=ErrorInfo(type="StepFailed", message="no stock", step="reserve"),
            owed=["reserve"],
        ),
    ]
    assert await store.create(
        NewSaga("saga-1", "checkout", events, Projection(SagaStatus.RUNNING), "idem-1")
    )

    loaded = await store.load("saga-1")
    assert [e.seq for e in loaded.events] == list(range(1, len(events) + 1))
    assert [e.event for e in loaded.events] == list(events)
    assert [type(e.event) for e in loaded.events] == [type(e) for e in events]
    record = loaded.record
    assert record.saga_id == "saga-1"
    assert record.saga_type == "checkout"
    assert record.status is SagaStatus.RUNNING
    assert record.last_seq == len(events)
    assert record.idempotency_key == "idem-1"
    # Time moves with the saga's own events.
    assert record.created_at == at
    assert record.updated_at == at
    assert await store.get("saga-1") == record


async def test_first_event_reads_the_start_alone(store: EventStore) -> None:
    assert await store.create(_new("f"))
    await store.append(_append("f", 1, _fired("later")))
    first = await store.first_event("f")
    assert first.seq == 1
    assert first.event == (await store.load("f")).events[0].event
    assert isinstance(first.event, SagaStarted)


async def test_load_after_reads_the_new_events_of_the_kinds_asked(store: EventStore) -> None:
    assert await store.create(_new("la"))
    item = ProgressEmitted(at=_now(), number=1, topic="status", payload={"stage": "ä"})
    await store.append(_append("la", 1, _fired("t1"), item, _fired("t2")))
    whole = [s.event for s in (await store.load("la")).events]
    after = await store.load_after("la", 1)
    assert [s.seq for s in after.events] == [2, 3, 4]
    assert [s.event for s in after.events] == whole[1:]
    assert after.record == await store.get("la")
    only = await store.load_after("la", 0, kinds=["progress_emitted"])
    assert [(s.seq, s.event) for s in only.events] == [(3, item)]
    assert (await store.load_after("la", 3, kinds=["progress_emitted"])).events == []
    assert (await store.load_after("la", 4)).events == []
    with pytest.raises(SagaNotFound):
        await store.load_after("nope", 0)


def _continued(run: int, first_seq: int) -> RunContinued:
    return RunContinued(at=_now(), run=run, first_seq=first_seq, input={"n": run})


async def test_load_run_reads_the_start_and_the_current_run_only(store: EventStore) -> None:
    assert await store.create(_new("runs"))
    assert (await store.runs("runs")) == [RunSpan(1, 1, 1)]
    assert [s.seq for s in (await store.load_run("runs")).events] == [1]
    await store.append(_append("runs", 1, _fired("a"), _fired("b")))
    assert [s.seq for s in (await store.load_run("runs")).events] == [1, 2, 3]
    await store.append(_append("runs", 3, _continued(2, 4), _fired("c")))
    await store.append(_append("runs", 5, _fired("d"), _continued(3, 7), _fired("e")))
    loaded = await store.load_run("runs")
    assert [s.seq for s in loaded.events] == [1, 7, 8]
    opened = loaded.events[1].event
    assert isinstance(opened, RunContinued)
    assert opened.run == 3
    assert loaded.record == await store.get("runs")
    assert await store.runs("runs") == [RunSpan(1, 1, 3), RunSpan(2, 4, 3), RunSpan(3, 7, 2)]
    assert len((await store.load("runs")).events) == 8  # the whole history stays readable
    with pytest.raises(SagaNotFound):
        await store.load_run("nope")
    with pytest.raises(SagaNotFound):
        await store.runs("nope")


async def test_create_with_existing_id_returns_false_and_changes_nothing(
    store: EventStore,
) -> None:
    assert await store.create(_new("dup", "first"))
    before = await store.load("dup")

    other = NewSaga(
        "dup",
        "second",
        [_started("second"), _fired("x")],
        Projection(SagaStatus.COMPENSATING, current_step="s", error={"e": 1}),
        "key",
    )
    assert await store.create(other) is False

    after = await store.load("dup")
    assert after == before
    assert after.record.saga_type == "first"
    assert after.record.last_seq == 1


async def test_concurrent_creates_of_one_id_exactly_one_wins(store: EventStore) -> None:
    results = await asyncio.gather(*(store.create(_new("same", f"type-{i}")) for i in range(10)))
    assert sorted(results) == [False] * 9 + [True]
    record = await store.get("same")
    assert record.saga_type == f"type-{results.index(True)}"
    assert await _seqs(store, "same") == [1]


async def test_create_with_no_events_starts_at_zero(store: EventStore) -> None:
    assert await store.create(NewSaga("empty", "order", [], RUNNING))
    loaded = await store.load("empty")
    assert loaded.record.last_seq == 0
    assert loaded.events == []
    assert await store.append(_append("empty", 0, _started())) == 1
    assert await _seqs(store, "empty") == [1]


# --------------------------------------------------------------------------- append


async def test_append_with_the_expected_seq(store: EventStore) -> None:
    assert await store.create(_new("a"))
    created = await store.get("a")

    first, second = _fired("t1"), _fired("t2")
    assert await store.append(_append("a", 1, first, second)) == 3

    loaded = await store.load("a")
    assert [(e.seq, e.event) for e in loaded.events][1:] == [(2, first), (3, second)]
    assert loaded.record.last_seq == 3
    assert loaded.record.created_at == created.created_at
    assert loaded.record.updated_at == second.at

    third = _fired("t3")
    assert await store.append(_append("a", 3, third)) == 4
    assert await _seqs(store, "a") == [1, 2, 3, 4]


async def test_append_of_no_events_updates_the_projection_only(store: EventStore) -> None:
    assert await store.create(_new("p"))
    before = await store.get("p")

    projection = Projection(SagaStatus.COMPENSATING, current_step="undo")
    assert await store.append(Append("p", 1, [], projection)) == 1

    after = await store.get("p")
    assert after.last_seq == 1
    assert after.status is SagaStatus.COMPENSATING
    assert after.current_step == "undo"
    assert after.updated_at == before.updated_at
    assert await _seqs(store, "p") == [1]


@pytest.mark.parametrize("stale", [0, 1, 5])
async def test_stale_expected_seq_raises_concurrency_error(store: EventStore, stale: int) -> None:
    assert await store.create(_new("c"))
    assert await store.append(_append("c", 1, _fired("t"))) == 2
    before = await store.load("c")

    with pytest.raises(ConcurrencyError) as info:
        await store.append(Append("c", stale, [_fired("late")], Projection(SagaStatus.FAILED)))
    assert info.value.saga_id == "c"
    assert info.value.expected_seq == stale
    assert info.value.actual_seq == 2
    assert isinstance(info.value, TransientError)
    # Nothing of the losing append was stored: neither events nor projection.
    assert await store.load("c") == before


async def test_unknown_saga_raises_saga_not_found(store: EventStore) -> None:
    with pytest.raises(SagaNotFound) as info:
        await store.get("nope")
    assert info.value.saga_id == "nope"
    with pytest.raises(SagaNotFound):
        await store.load("nope")
    with pytest.raises(SagaNotFound):
        await store.first_event("nope")
    # Ids the store could never hold are not found either (not an encoding error).
    for impossible in ("a\x00b", "x" * 201, ""):
        for read in (store.get, store.load, store.first_event):
            with pytest.raises(SagaNotFound):
                await read(impossible)
    with pytest.raises(SagaNotFound):
        await store.append(_append("nope", 0, _started()))
    with pytest.raises(SagaNotFound):
        await store.append(_append("nope", 3, _fired("t")))
    # The failed append created nothing.
    assert await store.list_sagas() == []


async def test_concurrent_appends_to_one_saga_exactly_one_wins(store: EventStore) -> None:
    assert await store.create(_new("race"))

    results = await asyncio.gather(
        *(
            store.append(_append("race", 1, _fired(f"w{i}-a"), _fired(f"w{i}-b")))
            for i in range(20)
        ),
        return_exceptions=True,
    )

    winners = [i for i, r in enumerate(results) if not isinstance(r, BaseException)]
    assert len(winners) == 1
    assert results[winners[0]] == 3
    losers = [r for r in results if isinstance(r, BaseException)]
    assert len(losers) == 19
    for exc in losers:
        assert isinstance(exc, ConcurrencyError)
        assert exc.expected_seq == 1
        assert exc.actual_seq == 3

    loaded = await store.load("race")
    assert [e.seq for e in loaded.events] == [1, 2, 3]
    w = winners[0]
    assert [getattr(e.event, "timer_id", None) for e in loaded.events[1:]] == [
        f"w{w}-a",
        f"w{w}-b",
    ]


async def test_racing_writers_keep_the_history_dense(store: EventStore) -> None:
    """Writers that reload and retry on conflict: every success lands where it says."""
    assert await store.create(_new("dense"))
    target = 40
    successes: dict[int, str] = {}
    conflicts: list[ConcurrencyError] = []

    async def writer(name: str) -> None:
        attempt = 0
        while len(successes) < target:
            attempt += 1
            last = (await store.get("dense")).last_seq
            tag = f"{name}-{attempt}"
            outcome = await _try_append(store, _append("dense", last, _fired(tag)))
            if isinstance(outcome, ConcurrencyError):
                assert outcome.actual_seq is not None
                assert outcome.actual_seq > last
                conflicts.append(outcome)
                continue
            seq = outcome
            assert seq == last + 1
            assert seq not in successes
            successes[seq] = tag

    await asyncio.gather(*(writer(f"w{i}") for i in range(8)))

    loaded = await store.load("dense")
    seqs = [e.seq for e in loaded.events]
    assert seqs == list(range(1, len(seqs) + 1))
    assert loaded.record.last_seq == seqs[-1]
    assert len(successes) >= target
    # Each writer that was told "you are seq N" is the one whose event is at N.
    stored = {e.seq: getattr(e.event, "timer_id", None) for e in loaded.events[1:]}
    assert stored == successes


async def test_concurrent_operations_on_different_sagas_succeed_or_fail_alone(
    store: EventStore,
) -> None:
    ids = [f"s{i}" for i in range(10)]
    for saga_id in [*ids, "taken"]:
        assert await store.create(_new(saga_id))
    group_commit = isinstance(store, PostgresEventStore) and store.group_commit.enabled
    batches_before = store.stats.batches if isinstance(store, PostgresEventStore) else 0

    # Even sagas append on the current seq, odd ones on a stale one; one saga is
    # unknown; one create is new and one collides. With group commit these are queued
    # together and written as one batch.
    ops = [
        *(
            store.append(_append(saga_id, 1 if i % 2 == 0 else 0, _fired(f"ok-{saga_id}")))
            for i, saga_id in enumerate(ids)
        ),
        store.append(_append("ghost", 1, _fired("ghost"))),
        store.create(_new("fresh")),
        store.create(_new("taken", "other-type")),
    ]
    results = await asyncio.gather(*ops, return_exceptions=True)

    if group_commit:
        assert isinstance(store, PostgresEventStore)
        assert store.stats.batches == batches_before + 1, "expected a single batch"
    for i, saga_id in enumerate(ids):
        result = results[i]
        if i % 2 == 0:
            assert result == 2
            assert await _seqs(store, saga_id) == [1, 2]
        else:
            assert isinstance(result, ConcurrencyError)
            assert result.actual_seq == 1
            assert await _seqs(store, saga_id) == [1]
    assert isinstance(results[10], SagaNotFound)
    assert results[11] is True
    assert results[12] is False
    assert (await store.get("taken")).saga_type == "order"
    assert await _seqs(store, "fresh") == [1]
    with pytest.raises(SagaNotFound):
        await store.get("ghost")


# --------------------------------------------------------------------------- projection


async def test_projection_fields_round_trip(store: EventStore) -> None:
    wakeup = datetime(2031, 5, 17, 8, 30, 15, 123456, tzinfo=UTC)
    error = {"type": "StepFailed", "message": "no stock", "details": {"sku": ["a", 1, None]}}
    assert await store.create(
        NewSaga(
            "proj",
            "order",
            [_started()],
            Projection(SagaStatus.COMPENSATING, "release", wakeup, error),
        )
    )
    record = await store.get("proj")
    assert record.status is SagaStatus.COMPENSATING
    assert record.current_step == "release"
    assert record.next_wakeup == wakeup
    assert record.error == error

    later = wakeup + timedelta(days=1)
    projection = Projection(SagaStatus.COMPENSATION_STUCK, "refund", later, {"n": 2})
    assert await store.append(Append("proj", 1, [_fired("t")], projection)) == 2
    record = await store.get("proj")
    assert (record.status, record.current_step, record.next_wakeup, record.error) == (
        SagaStatus.COMPENSATION_STUCK,
        "refund",
        later,
        {"n": 2},
    )

    done = Projection(SagaStatus.COMPLETED)
    assert await store.append(Append("proj", 2, [SagaCompleted(at=_now(), output={})], done)) == 3
    record = await store.get("proj")
    assert record.status is SagaStatus.COMPLETED
    assert (record.current_step, record.next_wakeup, record.error) == (None, None, None)


# --------------------------------------------------------------------------- listing


async def test_list_sagas_filters_and_paginates(store: EventStore) -> None:
    # Ids whose order differs between collations: the store must order like sorted().
    sagas = {
        "B-2": ("order", SagaStatus.RUNNING),
        "a-1": ("order", SagaStatus.COMPLETED),
        "A-1": ("payment", SagaStatus.RUNNING),
        "_x": ("payment", SagaStatus.FAILED),
        "b-3": ("order", SagaStatus.COMPENSATION_STUCK),
        "ä-9": ("order", SagaStatus.RUNNING),
        "a-10": ("payment", SagaStatus.COMPENSATING),
    }
    for saga_id, (saga_type, status) in sagas.items():
        assert await store.create(_new(saga_id, saga_type, status))
    every = sorted(sagas)

    assert [r.saga_id for r in await store.list_sagas()] == every

    running = await store.list_sagas(SagaFilter(statuses=frozenset({SagaStatus.RUNNING})))
    assert [r.saga_id for r in running] == sorted(k for k, v in sagas.items() if v[1] == "running")
    assert all(r.status is SagaStatus.RUNNING for r in running)

    stuck_or_failed = await store.list_sagas(
        SagaFilter(statuses=frozenset({SagaStatus.COMPENSATION_STUCK, SagaStatus.FAILED}))
    )
    assert [r.saga_id for r in stuck_or_failed] == ["_x", "b-3"]

    payments = await store.list_sagas(SagaFilter(saga_type="payment"))
    assert [r.saga_id for r in payments] == ["A-1", "_x", "a-10"]

    both = await store.list_sagas(
        SagaFilter(statuses=frozenset({SagaStatus.RUNNING}), saga_type="order")
    )
    assert [r.saga_id for r in both] == ["B-2", "ä-9"]

    assert await store.list_sagas(SagaFilter(statuses=frozenset())) == []
    assert await store.list_sagas(SagaFilter(saga_type="nothing")) == []

    # Page through with the cursor.
    pages: list[list[str]] = []
    after: str | None = None
    while True:
        page = await store.list_sagas(limit=3, after_id=after)
        if not page:
            break
        pages.append([r.saga_id for r in page])
        after = page[-1].saga_id
    assert pages == [every[0:3], every[3:6], every[6:]]

    # The cursor combines with the filters.
    orders = await store.list_sagas(SagaFilter(saga_type="order"), after_id="B-2", limit=2)
    assert [r.saga_id for r in orders] == ["a-1", "b-3"]

    # The rows are the same records get() returns.
    for record in await store.list_sagas():
        assert record == await store.get(record.saga_id)


async def test_open_saga_ids_excludes_terminal_statuses(store: EventStore) -> None:
    for status in SagaStatus:
        assert await store.create(_new(f"saga-{status.value}", status=status))

    open_ids = await store.open_saga_ids()

    assert open_ids == [
        "saga-compensating",
        "saga-compensation_stuck",
        "saga-nondeterministic",
        "saga-running",
        "saga-step_stuck",
    ]
    # A saga that finishes drops out.
    assert (
        await store.append(
            Append(
                "saga-running",
                1,
                [SagaCompleted(at=_now(), output={})],
                Projection(SagaStatus.COMPLETED),
            )
        )
        == 2
    )
    assert "saga-running" not in await store.open_saga_ids()


async def test_list_sagas_by_time_range_and_search(store: EventStore) -> None:
    base = datetime(2026, 1, 1, tzinfo=UTC)
    for n, key in enumerate([None, "order-1", None, "order-2"]):
        at = base + timedelta(hours=n)
        events: list[Event] = [SagaStarted(at=at, saga_type="order", input={})]
        assert await store.create(
            NewSaga(f"s-{n}", "order", events, Projection(SagaStatus.RUNNING), key)
        )
    later = base + timedelta(hours=2)

    def ids(rows: list[SagaRecord]) -> list[str]:
        return [r.saga_id for r in rows]

    assert ids(await store.list_sagas(SagaFilter(created_after=later))) == [
        "s-2",
        "s-3",
    ]  # inclusive
    assert ids(await store.list_sagas(SagaFilter(created_before=later))) == [
        "s-0",
        "s-1",
    ]  # exclusive
    # A naive bound is UTC.
    naive = later.replace(tzinfo=None)
    assert ids(
        await store.list_sagas(SagaFilter(updated_after=naive, updated_before=naive + HOUR))
    ) == ["s-2"]
    assert ids(await store.list_sagas(SagaFilter(search="s-"))) == ["s-0", "s-1", "s-2", "s-3"]
    assert ids(await store.list_sagas(SagaFilter(search="s-3"))) == ["s-3"]
    assert ids(await store.list_sagas(SagaFilter(search="-3"))) == []  # a prefix, not a substring
    assert ids(await store.list_sagas(SagaFilter(search="order-2"))) == ["s-3"]  # the key, whole
    assert ids(await store.list_sagas(SagaFilter(search="order"))) == []
    assert ids(await store.list_sagas(SagaFilter(search="s-", created_after=later), limit=1)) == [
        "s-2"
    ]
    assert ids(await store.list_sagas(SagaFilter(search="s-"), after_id="s-2")) == ["s-3"]


async def test_list_sagas_by_search_attributes(store: EventStore) -> None:
    attrs: list[dict[str, str] | None] = [
        {"order_id": "o-1", "tenant": "acme"},
        {"order_id": "o-2", "tenant": "acme"},
        None,
        {"order_id": "o-1", "tenant": "globex"},
    ]
    for n, search in enumerate(attrs):
        new = NewSaga(f"a-{n}", "order", [_started("order")], RUNNING, search=search)
        assert await store.create(new)

    async def ids(**wanted: str) -> list[str]:
        return [r.saga_id for r in await store.list_sagas(SagaFilter(attributes=wanted))]

    assert await ids(order_id="o-1") == ["a-0", "a-3"]
    assert await ids(order_id="o-1", tenant="acme") == ["a-0"]  # all of them must match
    assert await ids(tenant="acme") == ["a-0", "a-1"]
    assert await ids(order_id="o-9") == []
    assert await ids(order_id="O-1") == []  # exact, not case-folded
    assert [r.saga_id for r in await store.list_sagas(SagaFilter(attributes={}))] == [
        "a-0",
        "a-1",
        "a-2",
        "a-3",
    ]
    # They are the saga record's, as written.
    assert (await store.get("a-3")).search == {"order_id": "o-1", "tenant": "globex"}
    assert (await store.get("a-2")).search is None
    found = await store.list_sagas(
        SagaFilter(attributes={"order_id": "o-1"}, statuses=frozenset({SagaStatus.RUNNING}))
    )
    assert [r.saga_id for r in found] == ["a-0", "a-3"]


async def test_open_sagas_of_given_partitions(store: EventStore) -> None:
    ids = [f"saga-{n}" for n in range(40)]
    for saga_id in ids:
        assert await store.create(_new(saga_id))
    assert await store.create(_new("saga-done", status=SagaStatus.COMPLETED))
    mine = {1, 3}
    expected = sorted(i for i in ids if partition_for(i, 4) in mine)
    assert expected  # 40 keys over 4 partitions: some land in these two
    assert await store.open_saga_ids(mine, 4) == expected
    assert await store.open_saga_ids(set(), 4) == []
    assert await store.open_saga_ids(range(4), 4) == sorted(ids)


async def test_open_summary_counts_open_sagas_and_the_oldest_parked(store: EventStore) -> None:
    assert await store.open_summary() == OpenSummary({}, None)
    base = datetime(2026, 1, 1, tzinfo=UTC)
    statuses = [
        SagaStatus.RUNNING,
        SagaStatus.RUNNING,
        SagaStatus.COMPENSATION_STUCK,
        SagaStatus.STEP_STUCK,
        SagaStatus.COMPLETED,
    ]
    for n, status in enumerate(statuses):
        events: list[Event] = [SagaStarted(at=base + timedelta(minutes=n), saga_type="o", input={})]
        assert await store.create(NewSaga(f"s-{n}", "o", events, Projection(status)))
    summary = await store.open_summary()
    assert {k: v for k, v in summary.by_status.items() if v} == {
        SagaStatus.RUNNING: 2,
        SagaStatus.COMPENSATION_STUCK: 1,
        SagaStatus.STEP_STUCK: 1,
    }
    assert summary.oldest_parked_at == base + timedelta(minutes=2)


async def test_retention_finds_old_finished_sagas_archives_and_removes_only_them(
    store: EventStore,
) -> None:
    base = datetime(2026, 1, 1, tzinfo=UTC)
    plan = [
        ("old-done", "order", SagaStatus.COMPLETED, 0),
        ("old-failed", "payment", SagaStatus.FAILED, 1),
        ("old-open", "order", SagaStatus.RUNNING, 2),
        ("new-done", "order", SagaStatus.COMPLETED, 48),
    ]
    for saga_id, saga_type, status, hours in plan:
        events: list[Event] = [
            SagaStarted(at=base + timedelta(hours=hours), saga_type=saga_type, input={})
        ]
        assert await store.create(NewSaga(saga_id, saga_type, events, Projection(status)))
    cutoff = base + timedelta(hours=24)
    assert await store.finished_before(cutoff) == ["old-done", "old-failed"]  # oldest first
    assert await store.finished_before(cutoff, saga_types={"payment"}) == ["old-failed"]
    assert await store.finished_before(cutoff, other_than={"payment"}) == ["old-done"]
    assert await store.finished_before(cutoff, limit=1) == ["old-done"]

    [loaded] = await store.histories(["old-done", "nobody"])
    assert loaded.record.saga_id == "old-done"
    assert [e.event.kind for e in loaded.events] == ["saga_started"]

    archive = [ArchivedSaga(loaded.record, b"gzipped export")]
    # An open saga passed by mistake is not deleted.
    assert await store.remove_finished(["old-done", "old-open"], archive) == 1
    assert await store.archived_history("old-done") == b"gzipped export"
    assert await store.archived_history("old-open") is None
    with pytest.raises(SagaNotFound):
        await store.load("old-done")
    assert (await store.get("old-open")).status is SagaStatus.RUNNING
    # Archived again (a pass that died before its delete): the first copy stays.
    assert await store.remove_finished(["old-done"], [ArchivedSaga(loaded.record, b"x")]) == 0
    assert await store.archived_history("old-done") == b"gzipped export"


async def test_retention_keeps_a_finished_child_while_its_parent_exists(
    store: EventStore,
) -> None:
    """A parent may still undo (or ask again) a completed child: the child stays while
    the parent's row does, however old it is."""
    base = datetime(2026, 1, 1, tzinfo=UTC)

    async def saga(saga_id: str, status: SagaStatus, parent: str | None = None) -> None:
        link = ParentLink(saga_id=parent, command_id="c-1") if parent else None
        started = SagaStarted(at=base, saga_type="t", input={}, parent=link)
        assert await store.create(NewSaga(saga_id, "t", [started], Projection(status)))

    await saga("open-parent", SagaStatus.RUNNING)
    await saga("child-of-open", SagaStatus.COMPLETED, parent="open-parent")
    await saga("done-parent", SagaStatus.COMPLETED)
    await saga("child-of-done", SagaStatus.COMPLETED, parent="done-parent")
    cutoff = base + timedelta(days=30)
    # Only the finished parent: its child waits for it, the open parent's child for ever.
    assert await store.finished_before(cutoff) == ["done-parent"]
    assert await store.remove_finished(["done-parent"]) == 1
    assert await store.finished_before(cutoff) == ["child-of-done"]


async def test_due_wakeups_soonest_first_paged_by_partition(store: EventStore) -> None:
    base = datetime(2026, 1, 1, tzinfo=UTC)
    wakeups = {f"w-{n}": base + timedelta(minutes=n % 5) for n in range(20)}
    for saga_id, at in wakeups.items():
        assert await store.create(
            NewSaga(saga_id, "o", [_started("o")], Projection(SagaStatus.RUNNING, next_wakeup=at))
        )
    assert await store.create(_new("no-wakeup"))
    parked_at = base - timedelta(hours=1)
    assert await store.create(
        NewSaga(
            "parked",
            "o",
            [_started("o")],
            Projection(SagaStatus.NONDETERMINISTIC, next_wakeup=parked_at),
        )
    )
    until = base + timedelta(minutes=2)
    expected = sorted((at, i) for i, at in wakeups.items() if at <= until)
    # Soonest first, then by id; a parked nondeterministic saga is never due.
    assert [(at, i) for i, at in await store.due_wakeups(until, limit=100)] == expected
    # Paged with the last pair as the cursor: every due saga once.
    seen: list[tuple[datetime, str]] = []
    after: tuple[datetime, str] | None = None
    while page := await store.due_wakeups(until, limit=5, after=after):
        seen += [(at, i) for i, at in page]
        after = (page[-1][1], page[-1][0])
    assert seen == expected
    mine = {0, 2}
    assert [i for i, _ in await store.due_wakeups(until, mine, 3, limit=100)] == [
        i for _, i in expected if partition_for(i, 3) in mine
    ]


async def test_a_wake_up_is_found_by_its_slot_never_after_it_is_due(store: EventStore) -> None:
    slot = datetime(2026, 1, 1, 12, 0, 5, tzinfo=UTC)  # on the 5-second grid
    wakeup = slot + timedelta(seconds=2, milliseconds=250)
    projection = Projection(SagaStatus.RUNNING, next_wakeup=wakeup)
    assert await store.create(NewSaga("w", "o", [_started("o")], projection))
    assert await store.due_wakeups(slot - timedelta(microseconds=1)) == []
    # Found as soon as its slot begins (early by less than WAKE_GRID), by the slot.
    assert await store.due_wakeups(slot) == [("w", slot)]
    assert wake_slot(wakeup) == slot <= wakeup < slot + WAKE_GRID
    assert (await store.get("w")).next_wakeup == wakeup  # operators see the exact time
    # A later step in the same slot leaves the slot; one in the next slot moves it.
    later = Projection(SagaStatus.RUNNING, next_wakeup=wakeup + timedelta(milliseconds=30))
    assert await store.append(Append("w", 1, [_fired("a")], later)) == 2
    assert await store.due_wakeups(slot) == [("w", slot)]
    moved = Projection(SagaStatus.RUNNING, next_wakeup=slot + WAKE_GRID)
    assert await store.append(Append("w", 2, [_fired("b")], moved)) == 3
    assert await store.due_wakeups(slot + WAKE_GRID - timedelta(microseconds=1)) == []


async def test_retention_takes_sagas_by_when_they_ended(store: EventStore) -> None:
    # A saga that ended long ago and one that ended now, created in the other order.
    assert await store.create(_new("late"))
    assert await store.create(_new("early"))
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    done = Projection(SagaStatus.COMPLETED)
    for saga_id, at in (("early", t0), ("late", t0 + HOUR)):
        assert await store.append(Append(saga_id, 1, [SagaCompleted(at=at, output={})], done)) == 2
    assert await store.finished_before(t0 + 2 * HOUR) == ["early", "late"]
    assert await store.finished_before(t0 + HOUR) == ["early"]


# --------------------------------------------------------------------------- Postgres only


async def test_group_commit_writes_concurrent_appends_in_few_batches(
    pg_store: PostgresEventStore,
) -> None:
    ids = [f"g{i:03d}" for i in range(100)]
    assert all(await asyncio.gather(*(pg_store.create(_new(i)) for i in ids)))
    before = pg_store.stats

    results = await asyncio.gather(*(pg_store.append(_append(i, 1, _fired(i))) for i in ids))

    assert results == [2] * len(ids)
    after = pg_store.stats
    assert after.operations - before.operations == len(ids)
    assert after.batches - before.batches < len(ids)
    assert after.largest_batch > 1
    for saga_id in ids[::17]:
        assert await _seqs(pg_store, saga_id) == [1, 2]


async def test_two_queued_appends_for_one_saga_see_each_other(
    pg_store: PostgresEventStore,
) -> None:
    """The second append was computed from the first: they must not share a batch."""
    assert await pg_store.create(_new("pipelined"))
    results = await asyncio.gather(
        pg_store.append(_append("pipelined", 1, _fired("first"))),
        pg_store.append(_append("pipelined", 2, _fired("second"))),
        pg_store.append(_append("pipelined", 2, _fired("loser"))),
        return_exceptions=True,
    )
    # Taken in queue order, one per batch: 1 -> 2 wins, 2 -> 3 wins, the third is stale.
    assert list(results[:2]) == [2, 3]
    assert isinstance(results[2], ConcurrencyError)
    assert results[2].actual_seq == 3
    loaded = await pg_store.load("pipelined")
    assert [getattr(e.event, "timer_id", None) for e in loaded.events] == [None, "first", "second"]


async def test_a_batch_guard_probes_the_primary_key_on_a_table_never_analyzed(
    pg: PgTarget,
) -> None:
    """A fresh schema has no statistics: without the plan settings the guard of a batch
    hashes a sequential scan of every saga (once per batch); with them, one index probe
    per saga."""
    await migrate(pg.database_dsn, pg.schema)
    store = await PostgresEventStore.connect(
        PostgresSettings(dsn=SecretStr(pg.database_dsn), db_schema=pg.schema)
    )
    try:
        ids = [f"g-{n:04}" for n in range(2000)]
        await asyncio.gather(*(store.create(_new(i)) for i in ids))
    finally:
        await store.close()
    conn = await asyncpg.connect(pg.database_dsn, server_settings={"search_path": pg.schema})
    try:
        n = 50
        args = (
            ids[:n],
            [1] * n,
            [2] * n,
            ["running"] * n,
            [None] * n,
            [None] * n,
            [None] * n,
            [None] * n,
            [None] * n,
        )

        async def plan() -> str:
            rows = await conn.fetch("EXPLAIN " + _pgwrites.UPDATE_GUARDS, *args)
            return "\n".join(r[0] for r in rows)

        async with conn.transaction():
            assert "Seq Scan on sagas" in await plan()  # what the settings are for
            await conn.execute(_pgwrites.PLAN_GUARDS)
            guarded = await plan()
            assert "Index Scan using sagas_pkey" in guarded
            assert "Seq Scan" not in guarded
        # LOCAL: the connection's next transaction plans as it likes again.
        assert await conn.fetchval("SHOW enable_hashjoin") == "on"
    finally:
        await conn.close()


async def test_two_group_commit_stores_contending_on_the_same_sagas(pg: PgTarget) -> None:
    """Several engines' batches lock overlapping rows: one winner each, no deadlock."""
    stores = [await _open_pg(pg) for _ in range(3)]
    try:
        ids = [f"x{i:03d}" for i in range(60)]
        assert all(await asyncio.gather(*(stores[0].create(_new(i)) for i in ids)))

        # Each store submits the same sagas in a different order.
        orders = [ids, ids[::-1], ids[30:] + ids[:30]]
        results = await asyncio.gather(
            *(
                s.append(_append(saga_id, 1, _fired(f"{n}-{saga_id}")))
                for n, (s, order) in enumerate(zip(stores, orders, strict=True))
                for saga_id in order
            ),
            return_exceptions=True,
        )

        assert all(r == 2 or isinstance(r, ConcurrencyError) for r in results), results
        assert sum(1 for r in results if r == 2) == len(ids)
        for saga_id in ids:
            assert await _seqs(stores[1], saga_id) == [1, 2]
    finally:
        for s in stores:
            await s.close()


@pytest.mark.parametrize("alone", [False, True], ids=["in-a-batch", "alone"])
async def test_a_create_that_waited_on_a_committed_create_of_its_id_is_not_created(
    pg: PgTarget, alone: bool
) -> None:
    """Another transaction inserts the id while a batch of creates holding it is written:
    the batch waits on the primary key, finds the id taken once the other commits, and
    that create answers "not created" (no error), the others of the batch created. Alone
    in its transaction, the unique violation is that answer."""
    ids = ("taken",) if alone else ("free-1", "taken", "free-2")
    store = await _open_pg(pg)
    conn = await asyncpg.connect(pg.database_dsn)
    try:
        tx = conn.transaction()
        await tx.start()
        await conn.execute(
            f'INSERT INTO "{pg.schema}".sagas (saga_id, saga_type, status, last_seq, '
            "created_at, updated_at) VALUES ('taken', 'other', 'running', 0, now(), now())"
        )
        creates = asyncio.gather(*(store.create(_new(i)) for i in ids))

        async def waiting() -> int:
            found: int = await store._pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE '%INSERT INTO sagas%'"
            )
            return found

        await eventually(waiting, until=lambda n: n > 0, what="the create to wait on the key")
        await tx.commit()
        assert await creates == [i != "taken" for i in ids]
    finally:
        await conn.close()
        await store.close()
    loaded = await _open_pg(pg)
    try:
        assert (await loaded.get("taken")).saga_type == "other"
        assert await _seqs(loaded, "taken") == []
        assert [await _seqs(loaded, i) for i in ids] == [[1] if i != "taken" else [] for i in ids]
    finally:
        await loaded.close()


async def test_an_unstorable_value_fails_only_its_own_operation(store: EventStore) -> None:
    pg_store = store
    for saga_id in ("good-1", "bad", "good-2"):
        assert await pg_store.create(_new(saga_id))

    results = await asyncio.gather(
        pg_store.append(_append("good-1", 1, _fired("fine"))),
        # Postgres's jsonb refuses \u0000, and the in-memory store refuses it the same way.
        pg_store.append(_append("bad", 1, _fired("nul\x00byte"))),
        pg_store.append(_append("good-2", 1, _fired("fine"))),
        return_exceptions=True,
    )

    assert results[0] == 2
    assert isinstance(results[1], SerializationError)
    assert results[2] == 2
    assert await _seqs(pg_store, "bad") == [1]
    assert await _seqs(pg_store, "good-2") == [1, 2]


async def test_a_backslash_before_u0000_is_text_not_a_nul(store: EventStore) -> None:
    """A string holding a backslash and then "u0000" is stored as it is: its JSON (an
    escaped backslash) contains the bytes of a NUL's escape, which only a walk tells
    apart (the in-memory store looks at the bytes first)."""
    assert await store.create(_new("backslash"))
    text = "C:\\u0000\\dir"
    assert await store.append(_append("backslash", 1, _fired(text))) == 2
    [_, fired] = (await store.load("backslash")).events
    assert isinstance(fired.event, TimerFired)
    assert fired.event.timer_id == text


async def test_saga_id_longer_than_the_column_allows_is_refused(store: EventStore) -> None:
    with pytest.raises(InvalidSagaId, match="1 to 200"):
        await store.create(_new("x" * 201))
    assert await store.create(_new("x" * 200))


async def _wait_for(conn: asyncpg.Connection, sql: str, *args: object) -> object:
    """Polls ``sql`` until it returns a non-null value (a real condition, not a sleep)."""
    return await eventually(
        lambda: conn.fetchval(sql, *args), until=lambda v: v is not None, interval=0.01, what=sql
    )


async def test_a_batch_whose_connection_dies_fails_every_operation_retryably(
    pg: PgTarget, pg_store: PostgresEventStore
) -> None:
    ids = [f"lost{i}" for i in range(5)]
    for saga_id in ids:
        assert await pg_store.create(_new(saga_id))

    admin = await asyncpg.connect(pg.dsn)
    try:
        # Hold one saga's row lock so that the batch stops inside its transaction.
        blocker = admin.transaction()
        await blocker.start()
        await admin.execute("SELECT 1 FROM sagas WHERE saga_id = 'lost2' FOR UPDATE")
        pending = asyncio.gather(
            *(pg_store.append(_append(i, 1, _fired(i))) for i in ids), return_exceptions=True
        )
        flusher_pid = await _wait_for(
            admin,
            "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database() AND pid <> pg_backend_pid() LIMIT 1",
        )
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", flusher_pid)
        results = await pending
        await blocker.rollback()
    finally:
        await admin.close()

    assert all(isinstance(r, StoreUnavailable) for r in results), results
    assert all(isinstance(r, TransientError) for r in results)
    # Nothing was committed, and a retry with the same expected seq goes through.
    for saga_id in ids:
        assert await _seqs(pg_store, saga_id) == [1]
    assert await asyncio.gather(*(pg_store.append(_append(i, 1, _fired(i))) for i in ids)) == [
        2
    ] * len(ids)


async def test_the_store_reconnects_after_its_connections_are_terminated(
    pg: PgTarget, pg_store: PostgresEventStore
) -> None:
    assert await pg_store.create(_new("survivor"))
    admin = await asyncpg.connect(pg.dsn)
    try:
        killed = await admin.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'"
        )
    finally:
        await admin.close()
    assert killed >= 1

    # The first write may meet a dead connection: then it must fail retryably, and the
    # retry must go through on a fresh one.
    outcome: int | None = None
    for _ in range(5):
        try:
            outcome = await pg_store.append(_append("survivor", 1, _fired("after")))
            break
        except StoreUnavailable:
            continue
    assert outcome == 2
    assert await _seqs(pg_store, "survivor") == [1, 2]


async def test_connect_to_an_unreachable_server_raises_store_unavailable() -> None:
    settings = PostgresSettings(
        dsn=SecretStr("postgresql://postgres@127.0.0.1:1/nowhere"), db_schema="saga"
    )
    with pytest.raises(StoreUnavailable):
        await PostgresEventStore.connect(settings)


async def test_close_writes_what_is_queued_then_refuses_writes(pg: PgTarget) -> None:
    store = await _open_pg(pg)
    ids = [f"q{i}" for i in range(20)]
    # The creates are queued first (gather starts tasks in order), then close runs.
    *created, _ = await asyncio.gather(*(store.create(_new(i)) for i in ids), store.close())
    assert created == [True] * len(ids)
    with pytest.raises(StoreUnavailable, match="closed"):
        await store.append(_append("q0", 1, _fired("late")))

    reopened = await _open_pg(pg)
    try:
        assert [r.saga_id for r in await reopened.list_sagas()] == sorted(ids)
    finally:
        await reopened.close()


async def test_a_running_sagas_row_is_updated_without_index_entries(
    pg_store: PostgresEventStore, pg: PgTarget
) -> None:
    """HOT updates (migration 0010): the steps of a running saga move its exact wake-up
    within one slot and change nothing else that is indexed, so Postgres keeps each new
    row version on the page and writes no index entry. Its end changes the status (an
    indexed column): that update is not HOT."""
    slot = datetime(2030, 1, 1, tzinfo=UTC)
    ids = [f"hot-{n}" for n in range(20)]
    for saga_id in ids:
        assert await pg_store.create(
            NewSaga(saga_id, "o", [_started("o")], Projection(SagaStatus.RUNNING, "a", slot))
        )
    for step in range(1, 4):
        projection = Projection(
            SagaStatus.RUNNING, f"step-{step}", slot + timedelta(milliseconds=10 * step)
        )
        for saga_id in ids:
            assert await pg_store.append(Append(saga_id, step, [_fired(str(step))], projection))
    conn = await asyncpg.connect(pg.database_dsn)
    try:

        async def counts() -> asyncpg.Record:
            await conn.execute("SELECT pg_stat_clear_snapshot()")
            row = await conn.fetchrow(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                "WHERE schemaname = $1 AND relname = 'sagas'",
                pg.schema,
            )
            assert row is not None
            return row

        # The backends publish their counts within about a second.
        row = await eventually(
            counts,
            until=lambda row: row["n_tup_upd"] >= 3 * len(ids),
            interval=0.1,
            what="the sagas table's update counts",
        )
        assert row["n_tup_upd"] == 3 * len(ids)
        assert row["n_tup_hot_upd"] == row["n_tup_upd"]
    finally:
        await conn.close()
