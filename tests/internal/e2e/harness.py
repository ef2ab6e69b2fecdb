"""Real processes for crash tests: engines and participants, started, killed and restarted."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
from aiokafka import AIOKafkaConsumer, TopicPartition

from saga_engine import SagaStatus, Settings
from saga_engine.settings import EngineSettings, KafkaSettings, PostgresSettings
from saga_engine.transport._topics import Topics
from tests.integration.kafka_helpers import read_to_end
from tests.internal.e2e.app import LEDGER_DDL, PARTICIPANTS
from tests.waiting import eventually

ROOT = Path(__file__).resolve().parents[3]


@dataclass
class Cluster:
    database_dsn: str
    schema: str
    bootstrap: str
    prefix: str
    logs: Path
    partitions: int = 4
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def settings(self) -> Settings:
        return Settings(
            pg=PostgresSettings(dsn=self.database_dsn, db_schema=self.schema),
            kafka=KafkaSettings(
                bootstrap_servers=self.bootstrap,
                topic_prefix=self.prefix,
                group_id=f"{self.prefix}-engines",
                partitions=self.partitions,
                session_timeout_ms=6000,
                heartbeat_interval_ms=500,
            ),
            engine=EngineSettings(),
        )

    def participant_schema(self, name: str) -> str:
        return f"{self.schema}_{name}"

    def env(self, **extra: str) -> dict[str, str]:
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "SAGA_PG__DSN": self.database_dsn,
            "SAGA_PG__DB_SCHEMA": self.schema,
            "SAGA_KAFKA__BOOTSTRAP_SERVERS": self.bootstrap,
            "SAGA_KAFKA__TOPIC_PREFIX": self.prefix,
            "SAGA_KAFKA__GROUP_ID": f"{self.prefix}-engines",
            "SAGA_KAFKA__PARTITIONS": str(self.partitions),
            "SAGA_KAFKA__SESSION_TIMEOUT_MS": "6000",
            "SAGA_KAFKA__HEARTBEAT_INTERVAL_MS": "500",
            "SAGA_PARTICIPANT__DSN": self.database_dsn,
            # Several engines run at once: each serves its admin API on a free port.
            "SAGA_ADMIN__PORT": "0",
        }
        env.pop("SAGA_CRASH_AT", None)
        env.pop("E2E_BATCH_HANDLERS", None)
        env.update(extra)
        return env

    async def prepare(self) -> None:
        """Each participant gets its own schema with its ledger, as its own database would."""
        conn = await asyncpg.connect(self.database_dsn)
        try:
            for name in PARTICIPANTS:
                schema = self.participant_schema(name)
                await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
                await conn.execute(f'SET search_path TO "{schema}"')
                await conn.execute(LEDGER_DDL)
        finally:
            await conn.close()

    async def drop_participant_schemas(self) -> None:
        conn = await asyncpg.connect(self.database_dsn)
        try:
            for name in PARTICIPANTS:
                await conn.execute(
                    f'DROP SCHEMA IF EXISTS "{self.participant_schema(name)}" CASCADE'
                )
        finally:
            await conn.close()

    def _spawn(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        old = self.procs.get(name)
        if old is not None and old.poll() is None:
            raise RuntimeError(f"{name} is already running")
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
        proc = subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    def start_engine(self, name: str = "engine", crash_at: str | None = None) -> None:
        extra = {"SAGA_CRASH_AT": crash_at} if crash_at else {}
        self._spawn(
            name,
            ["-m", "saga_engine", "worker", "tests.internal.e2e.app", "--log-level", "INFO"],
            self.env(**extra),
        )

    def start_participant(
        self,
        name: str,
        crash_at: str | None = None,
        *,
        batch_handlers: bool = False,
        instance: str = "",
    ) -> None:
        """Starts participant ``name``; a second ``instance`` (a suffix of the process's
        name) joins the same group and shares its database."""
        extra = {"SAGA_PARTICIPANT__DB_SCHEMA": self.participant_schema(name)}
        if crash_at:
            extra["SAGA_CRASH_AT"] = crash_at
        if batch_handlers:
            extra["E2E_BATCH_HANDLERS"] = "1"
        self._spawn(
            f"participant-{name}{instance}",
            ["-m", "tests.internal.e2e.app", "participant", name],
            self.env(**extra),
        )

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    async def wait_exit(self, name: str, timeout: float = 90.0) -> int:
        proc = self.procs[name]
        returncode = await eventually(
            proc.poll,
            until=lambda code: code is not None,
            timeout=timeout,
            what=f"{name} to exit",
            context=lambda: f"log:\n{self.log_tail(name)}",
        )
        assert returncode is not None
        return returncode

    def log_tail(self, name: str, lines: int = 40) -> str:
        path = self.logs / f"{name}.log"
        return (
            "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
            if path.exists()
            else ""
        )

    async def wait_partitions_taken(self, *engines: str, timeout: float = 60.0) -> None:
        """Waits until each of ``engines`` logged taking partitions (two processes
        starting on a busy machine take a while)."""
        await eventually(
            lambda: [e for e in engines if "took partitions" not in self.log_tail(e, 300)],
            until=lambda waiting: not waiting,
            timeout=timeout,
            interval=0.1,
            what=f"{', '.join(engines)} to take partitions",
            context=self.logs_tail,
        )

    def logs_tail(self) -> str:
        """The end of every process's log."""
        return "\n".join(f"--- {n}\n{self.log_tail(n)}" for n in self.procs)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    # ------------------------------------------------------------------ observation

    async def query(self, sql: str, *args: object) -> list[asyncpg.Record]:
        """``sql``'s rows in the engine's schema (none while its tables do not exist)."""
        conn = await asyncpg.connect(
            self.database_dsn, server_settings={"search_path": self.schema}
        )
        try:
            return await conn.fetch(sql, *args)
        except asyncpg.UndefinedTableError:
            return []
        finally:
            await conn.close()

    async def statuses(self, saga_ids: list[str]) -> dict[str, SagaStatus]:
        conn = await asyncpg.connect(self.database_dsn)
        try:
            rows = await conn.fetch(
                f'SELECT saga_id, status FROM "{self.schema}".sagas WHERE saga_id = ANY($1)',
                saga_ids,
            )
        except asyncpg.UndefinedTableError:
            return {}
        finally:
            await conn.close()
        return {r["saga_id"]: SagaStatus(r["status"]) for r in rows}

    async def wait_settled(
        self, saga_ids: list[str], timeout: float = 120.0
    ) -> dict[str, SagaStatus]:
        found: dict[str, SagaStatus] = await eventually(
            lambda: self.statuses(saga_ids),
            until=lambda found: (
                len(found) == len(saga_ids)
                and all(s.is_terminal or s.is_parked for s in found.values())
            ),
            timeout=timeout,
            what="every saga terminal or parked",
            context=self.logs_tail,
        )
        return found

    async def commands_in_topic(self, participant: str) -> list[str]:
        """The saga id of every record now in the participant's command topic, read from
        Kafka (none while the engine has not created the topic: it does so before its first
        send there)."""
        topic = Topics(self.prefix).commands(participant)
        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            async with asyncio.timeout(30):
                if topic not in await consumer.topics():
                    return []
                parts = [TopicPartition(topic, p) for p in range(self.partitions)]
                return [r.key.decode() for r in await read_to_end(consumer, parts)]
        finally:
            await consumer.stop()

    async def wait_commands(
        self, participant: str, saga_ids: list[str], timeout: float = 30.0
    ) -> None:
        """Waits until a command of each of ``saga_ids`` is in the participant's topic."""

        async def missing() -> list[str]:
            return sorted(set(saga_ids) - set(await self.commands_in_topic(participant)))

        await eventually(
            missing,
            until=lambda left: not left,
            timeout=timeout,
            what=f"a command for {participant} of each saga",
            context=self.logs_tail,
        )

    async def ledger(self, participant: str) -> list[dict[str, Any]]:
        conn = await asyncpg.connect(self.database_dsn)
        try:
            rows = await conn.fetch(
                f'SELECT command_id, saga_id, kind, at FROM "{self.participant_schema(participant)}".ledger'
            )
        finally:
            await conn.close()
        return [dict(r) for r in rows]

    async def check_effects(self, expected: dict[str, SagaStatus], failing: dict[str, str]) -> None:
        """Exactly one effect per command id, and the effects each outcome implies."""
        for participant in PARTICIPANTS:
            rows = await self.ledger(participant)
            per_command = Counter(r["command_id"] for r in rows)
            duplicated = {c: n for c, n in per_command.items() if n != 1}
            assert not duplicated, f"{participant}: duplicated effects {duplicated}"
            for saga_id, status in expected.items():
                kinds = sorted(r["kind"] for r in rows if r["saga_id"] == saga_id)
                order = list(PARTICIPANTS)
                if status == SagaStatus.COMPLETED:
                    want = ["apply"]
                else:
                    refused_at = order.index(failing[saga_id])
                    mine = order.index(participant)
                    want = ["apply", "revert"] if mine < refused_at else []
                assert kinds == want, f"{participant} saga {saga_id} ({status}): {kinds} != {want}"


@contextlib.asynccontextmanager
async def participant_schema(cluster: Cluster, name: str, ddl: str) -> AsyncIterator[str]:
    """A schema of its own for a test application's participant ``name``, holding the
    table ``ddl`` creates; after, the processes stopped and the schema dropped."""
    schema = cluster.participant_schema(name)
    conn = await asyncpg.connect(cluster.database_dsn)
    try:
        await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        await conn.execute(f'SET search_path TO "{schema}"')
        await conn.execute(ddl)
    finally:
        await conn.close()
    try:
        yield schema
    finally:
        cluster.stop_all()
        conn = await asyncpg.connect(cluster.database_dsn)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()


def spawn_participant(cluster: Cluster, name: str, schema: str, module: str) -> None:
    """``python -m module participant``: the participant ``name`` of a test application."""
    cluster._spawn(
        f"participant-{name}",
        ["-m", module, "participant"],
        cluster.env(SAGA_PARTICIPANT__DB_SCHEMA=schema),
    )
