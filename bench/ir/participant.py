"""The participant kit's one path against an in-memory transaction: the engine's
command records (``fixtures``), a wave of sagas' commands to a batch, through the kit's
``RecordBatchRunner`` (read and decode, the claim, the handler, its reply, the outcome
row, the reply sent after commit). The database and Kafka are stand-ins that answer at
once (every statement succeeds, no row is stored before, every reply is acknowledged),
so what is counted is the kit's own work and asyncpg's and aiokafka's is not. The
handler runs one statement through its ``Transaction``, as a ledger insert would; the
third steps of failing sagas are refused (``Rejected``), which rolls their batch back
and runs it again with savepoints, as the kit does. Unit: a command."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from aiokafka import AIOKafkaProducer, TopicPartition

from bench.ir import fixtures
from bench.ir.shape import Do, Undo
from saga_engine.kernel._mainloop import run as run_loop
from saga_engine.participant import Participant, Rejected, Transaction
from saga_engine.settings import Settings

INSERT = "INSERT INTO ledger (command_id, saga_id, amount) VALUES ($1, $2, $3)"


@dataclass(frozen=True, slots=True)
class Record:
    """A consumed record, as aiokafka hands it over (what the kit reads of one)."""

    topic: str
    partition: int
    offset: int
    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]
    timestamp: int = 0


class MemoryConnection:
    """Every statement succeeds at once; an ``INSERT ... RETURNING command_id`` returns
    each id it was given (none was stored before), any other query no rows."""

    def transaction(self, **_: Any) -> Any:
        return _nothing()

    async def execute(self, query: str, *args: Any, **_: Any) -> str:
        return "OK"

    async def executemany(self, query: str, args: Any, **_: Any) -> None:
        return None

    async def fetch(self, query: str, *args: Any, **_: Any) -> list[dict[str, Any]]:
        if "RETURNING command_id" in query:
            return [{"command_id": c} for c in args[0]]
        return []

    async def fetchrow(self, query: str, *args: Any, **_: Any) -> None:
        return None

    async def fetchval(self, query: str, *args: Any, **_: Any) -> None:
        return None


@asynccontextmanager
async def _nothing() -> AsyncIterator[None]:
    yield


class MemoryPool(MemoryConnection):
    def acquire(self) -> Any:
        return _holding(self)

    async def close(self) -> None:
        return None


@asynccontextmanager
async def _holding(conn: MemoryConnection) -> AsyncIterator[MemoryConnection]:
    yield conn


class MemoryProducer:
    """Takes every record and acknowledges it at once."""

    _closed = False

    def __init__(self) -> None:
        self.sent = 0

    async def send(self, topic: str, value: bytes, **_: Any) -> asyncio.Future[None]:
        self.sent += 1
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async def send_and_wait(self, topic: str, value: bytes, **kw: Any) -> None:
        await self.send(topic, value, **kw)

    async def stop(self) -> None:
        return None


class InMemoryParticipant(Participant):
    """The kit with its database and Kafka in memory: no group joined, nothing consumed;
    batches are handed to its runner directly."""

    def __init__(self, name: str, settings: Settings) -> None:
        super().__init__(name, settings)
        self.producer = MemoryProducer()

    async def _connect(self) -> Any:
        return cast(Any, MemoryPool()), cast(AIOKafkaProducer, self.producer)

    async def _join_group(self) -> None:
        return None


def participant() -> InMemoryParticipant:
    kit = InMemoryParticipant("p", Settings())

    @kit.handles(Do)
    async def do(cmd: Do, tx: Transaction) -> dict[str, Any]:
        if cmd.fail:
            raise Rejected("refused")
        await tx.execute(INSERT, tx.command_id, tx.saga_id, cmd.n)
        return {}

    @kit.handles(Undo)
    async def undo(cmd: Undo, tx: Transaction) -> dict[str, Any]:
        await tx.execute(INSERT, tx.command_id, tx.saga_id, -cmd.n)
        return {}

    return kit


def batches(fixture: dict[str, Any], n: int) -> list[list[tuple[TopicPartition, Record]]]:
    """The fixture's waves of the first ``n`` sagas, as consumed records."""
    tp = TopicPartition("saga.commands.p", 0)
    out: list[list[tuple[TopicPartition, Record]]] = []
    offset = 0
    for wave in fixture["batches"]:
        rows = []
        for k, key, value, headers in wave:
            if k >= n:
                continue
            hs = [(h, v.encode()) for h, v in headers]
            rows.append((tp, Record(tp.topic, 0, offset, key.encode(), value.encode(), hs)))
            offset += 1
        if rows:
            out.append(rows)
    return out


async def drive(fixture: dict[str, Any], n: int) -> int:
    kit = participant()
    await kit._open()
    runner = kit._batches
    assert runner is not None
    commands = 0
    for batch in batches(fixture, n):
        await runner.run(batch)
        commands += len(batch)
    await kit._close(graceful=False)
    if kit.producer.sent != commands:
        raise RuntimeError(f"{kit.producer.sent} replies sent for {commands} commands")
    return commands


def run(n: int, fixture_path: Path) -> int:
    return run_loop(drive(fixtures.read(fixture_path), n), tune_gc=False)
