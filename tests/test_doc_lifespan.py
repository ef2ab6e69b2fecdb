"""docs/getting-started.md's participant inside a FastAPI app runs as written.

The guide's ``myapp/sagas.py``, ``myapp/accounts.py`` and ``myapp/api.py`` are written into
an empty folder and the app is served by uvicorn on the real Postgres and Kafka, in topics
and a schema of this test's own. The test checks what the guide says of it: the lifespan's
start creates the participant's topics with ``SAGA_KAFKA__PARTITIONS`` partitions and
consumes; a command sent as the engine sends it is applied and answered; a command still
in hand when the app shuts down is answered and its offset committed before the
participant closes, and after the shutdown the participant holds no partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import re
import socket
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import uvicorn
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from saga_engine.protocol import Envelope, ReplyBody, Topics, decode, encode
from saga_engine.settings import KafkaSettings
from tests.doc_blocks import ROOT, code_blocks
from tests.participant.helpers import command, delete_topics
from tests.waiting import eventually

GUIDE = ROOT / "docs" / "getting-started.md"
_FILE = re.compile(r"# ([\w./-]+\.py)")
#: The guide's files the app needs: the commands, the participant, the app.
_NEEDED = ("myapp/sagas.py", "myapp/accounts.py", "myapp/api.py")


def _write_app(folder: Path) -> None:
    files = {
        m.group(1): b.code
        for b in code_blocks(GUIDE, "python")
        if (m := _FILE.fullmatch(b.first_line))
    }
    for name in _NEEDED:
        assert name in files, f"the guide has no {name}"
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files[name])


@contextlib.contextmanager
def _imported(project: Path, env: dict[str, str]) -> Iterator[Any]:
    """The project's ``myapp.api``, imported under ``env`` (its modules read their
    settings at import), and forgotten afterwards."""
    saved_env = dict(os.environ)
    os.environ.update(env)
    sys.path.insert(0, str(project))
    try:
        yield importlib.import_module("myapp.api")
    finally:
        sys.path.remove(str(project))
        for name in [m for m in sys.modules if m == "myapp" or m.startswith("myapp.")]:
            del sys.modules[name]
        os.environ.clear()
        os.environ.update(saved_env)


@contextlib.asynccontextmanager
async def _admin(bootstrap: str) -> AsyncIterator[AIOKafkaAdminClient]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        yield admin
    finally:
        await admin.close()


class _Replies:
    """The inbox read from its start, without a consumer group, as the engine would."""

    def __init__(self, kafka: KafkaSettings) -> None:
        self._consumer = AIOKafkaConsumer(
            Topics.of(kafka).inbox,
            bootstrap_servers=kafka.bootstrap_servers,
            group_id=None,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=20,
        )
        self.by_command: dict[str, Envelope] = {}

    async def __aenter__(self) -> _Replies:
        await self._consumer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._consumer.stop()

    async def of(self, command_id: str, *, timeout: float = 20.0) -> ReplyBody:
        async def answered() -> bool:
            for records in (await self._consumer.getmany(timeout_ms=100)).values():
                for r in records:
                    reply = decode(r.key, r.value, list(r.headers), max_bytes=10_000_000)
                    self.by_command[reply.command_id] = reply
            return command_id in self.by_command

        await eventually(answered, timeout=timeout, interval=0)
        return ReplyBody.model_validate(self.by_command[command_id].body)


async def _waiting_on_a_lock(conn: asyncpg.Connection) -> bool:
    waiting = await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    return bool(waiting)


@pytest.mark.integration
async def test_the_fastapi_lifespan_starts_and_stops_the_participant(
    tmp_path: Path, pg_database: str, kafka_bootstrap: str
) -> None:
    _write_app(tmp_path)
    uid = uuid.uuid4().hex[:8]
    prefix, schema = f"ls{uid}", f"accounts_{uid}"
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix, partitions=2)
    topics = Topics.of(kafka)
    ours = sorted([topics.commands("accounts"), topics.inbox, topics.dlq])
    env = {
        "SAGA_PG__DSN": pg_database,  # the participant's database too, by default
        "SAGA_PARTICIPANT__DB_SCHEMA": schema,
        "SAGA_PARTICIPANT__STARTUP_TIMEOUT_S": "30",  # fail, not hang, if it cannot start
        "SAGA_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
        "SAGA_KAFKA__TOPIC_PREFIX": prefix,
        "SAGA_KAFKA__PARTITIONS": str(kafka.partitions),
    }
    # Bound here and handed to uvicorn: no window in which another socket takes the port.
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    db = await asyncpg.connect(pg_database)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    with _imported(tmp_path, env) as api:
        accounts = api.accounts
        server = uvicorn.Server(
            uvicorn.Config(api.app, lifespan="on", log_level="warning", access_log=False)
        )
        task: asyncio.Task[None] | None = None
        try:
            async with _admin(kafka_bootstrap) as admin:
                assert not set(ours) & set(await admin.list_topics())

            # Startup: uvicorn runs the lifespan's start before it serves.
            task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
            await eventually(lambda: _started(server, task), timeout=60)
            async with _admin(kafka_bootstrap) as admin:
                described = {t["topic"]: t for t in await admin.describe_topics(ours)}
            assert sorted(described) == ours
            for name in ours:
                assert len(described[name]["partitions"]) == kafka.partitions, name

            async def send(envelope: Envelope) -> None:
                key, value, headers = encode(envelope)
                await producer.send_and_wait(
                    topics.commands("accounts"), value, key=key, headers=headers
                )

            async with _Replies(kafka) as replies:
                # A command sent as the engine sends it is applied and answered.
                first = command("Withdraw", {"account": "alice", "amount": 30}, step="withdraw")
                await send(first)
                assert await replies.of(first.command_id) == ReplyBody(
                    outcome="success", payload={"balance": 9970}
                )

                # A command in hand at shutdown: its handler waits on a row lock we hold.
                lock = await asyncpg.connect(pg_database)
                try:
                    async with lock.transaction():
                        await lock.execute(
                            f'SELECT 1 FROM "{schema}".accounts WHERE id = $1 FOR UPDATE',
                            "alice",
                        )
                        second = command(
                            "Withdraw", {"account": "alice", "amount": 20}, step="withdraw"
                        )
                        await send(second)
                        await eventually(lambda: _waiting_on_a_lock(db), timeout=20)
                        server.should_exit = True
                        # The shutdown is under way: stop() waits for the handler.
                        await eventually(
                            lambda: accounts._stopping.is_set(), what="the participant's stop()"
                        )
                    # The lock is released here; the handler goes on.
                finally:
                    await lock.close()
                await asyncio.wait_for(task, timeout=30)

                assert await replies.of(second.command_id) == ReplyBody(
                    outcome="success", payload={"balance": 9950}
                )

            # stop() ran: the participant holds no partition, and committed both offsets.
            assert accounts.assignment == set()
            assert accounts.stats["processed"] == 2
            async with _admin(kafka_bootstrap) as admin:
                committed = await admin.list_consumer_group_offsets(
                    topics.participant_group("accounts")
                )
            assert sum(o.offset for o in committed.values()) == 2, committed
            balance = await db.fetchval(
                f'SELECT balance FROM "{schema}".accounts WHERE id = $1', "alice"
            )
            assert balance == 10000 - 30 - 20
        finally:
            server.should_exit = True
            if task is not None and not task.done():
                await asyncio.wait({task}, timeout=30)
            await accounts.stop()  # idempotent; closes it if the lifespan did not
            await producer.stop()
            sock.close()
            await db.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            await db.close()
            await delete_topics(kafka_bootstrap, prefix)


async def _started(server: uvicorn.Server, task: asyncio.Task[None]) -> bool:
    if task.done():  # the lifespan's start failed: uvicorn gave up
        task.result()
        pytest.fail("uvicorn exited before it started the app")
    return server.started
