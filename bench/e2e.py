"""End-to-end saga throughput and latency over the real stack, with its ceiling.

    python -m bench.e2e [--sagas 500] [--concurrency 64] [--fetch-max-wait-ms 20 500]
                        [--partitions 8] [--no-group-commit] [--profile engine.prof]

Needs Postgres and Kafka (``make up``; ``SAGA_PG__DSN`` / ``SAGA_KAFKA__BOOTSTRAP_SERVERS``).
One run:

1. the ceiling: raw asyncpg single-row INSERTs into a scratch table, one commit each,
   sequential on one connection and then on ``--ceiling-connections`` at once;
2. for each ``--fetch-max-wait-ms`` value, a fresh schema and topic prefix, then an engine
   process and three participant processes (``bench.app``); a warm-up, a latency probe
   (sagas one at a time) and the measured load (``--sagas`` sagas, at most
   ``--concurrency`` in flight), while reading the processes' CPU time from /proc;
3. every process stopped (SIGTERM, then SIGKILL), the schemas dropped, the topics deleted.

Progress goes to stderr; stdout gets one JSON object. See bench/README.md for the fields.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import platform
import pstats
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

import asyncpg
from aiokafka.admin import AIOKafkaAdminClient

from bench.app import PARTICIPANTS, SAGA_NAME
from saga_engine import SagaStatus, Settings
from saga_engine._kafka import ensure_topics
from saga_engine._topics import Topics
from saga_engine.client import SagaClient
from saga_engine.settings import KafkaSettings, PostgresSettings

ROOT = Path(__file__).resolve().parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")
DONE_STATUSES = [s.value for s in SagaStatus if s.is_terminal or s.is_parked]
_T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"[bench {time.monotonic() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


class BenchError(Exception):
    """The run cannot go on; the message says why."""


# --------------------------------------------------------------------------- numbers


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def dist(values_s: Sequence[float]) -> dict[str, float | int]:
    """p50/p90/p99/max (and mean) in milliseconds of values given in seconds."""
    ms = [v * 1000 for v in values_s]
    if not ms:
        return {"n": 0}
    return {
        "n": len(ms),
        "p50": round(pct(ms, 50), 2),
        "p90": round(pct(ms, 90), 2),
        "p99": round(pct(ms, 99), 2),
        "max": round(max(ms), 2),
        "mean": round(sum(ms) / len(ms), 2),
    }


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a is not None and b else None


# --------------------------------------------------------------------------- /proc


def proc_cpu_split(pid: int) -> tuple[float, float] | None:
    """(utime, stime) of a process, in seconds (None if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def proc_cpu_s(pid: int) -> float | None:
    """utime + stime of a process, in seconds (None if it is gone)."""
    split = proc_cpu_split(pid)
    return None if split is None else split[0] + split[1]


def postgres_cpu_s() -> float:
    """All postgres processes on the machine (other clients' backends included)."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                raw = fh.read()
        except OSError:
            continue
        if raw.split("(", 1)[1].startswith("postgres)"):
            fields = raw.rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / CLK_TCK
    return total


def kafka_pid() -> int | None:
    try:
        state = json.loads((ROOT / ".dev" / "state.json").read_text())
    except (OSError, ValueError):
        return None
    pid = state.get("kafka_pid")
    return pid if isinstance(pid, int) and proc_cpu_s(pid) is not None else None


def self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def machine_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs together, from /proc/stat."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except OSError:
        return 0, 0
    ticks = [int(x) for x in first[1:9]]  # user nice system idle iowait irq softirq steal
    idle = ticks[3] + ticks[4]
    return sum(ticks) - idle, sum(ticks)


def loadavg() -> list[float]:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


# --------------------------------------------------------------------------- processes


@dataclass
class Proc:
    role: str
    popen: subprocess.Popen[bytes]
    log: Path


class Processes:
    """Every child process of the run; ``stop_all`` ends them all, SIGTERM then SIGKILL."""

    def __init__(self) -> None:
        self.procs: dict[str, Proc] = {}

    def spawn(self, role: str, args: list[str], env: dict[str, str], log: Path) -> Proc:
        with open(log, "ab") as out:
            popen = subprocess.Popen(
                [sys.executable, *args],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # our own signals only; killpg reaches just it
            )
        proc = Proc(role, popen, log)
        self.procs[role] = proc
        say(f"started {role} (pid {popen.pid})")
        return proc

    def check_alive(self) -> None:
        for proc in self.procs.values():
            code = proc.popen.poll()
            if code is not None:
                raise BenchError(f"{proc.role} exited with code {code}:\n{tail(proc.log)}")

    def send(self, role: str, sig: signal.Signals) -> None:
        proc = self.procs[role]
        if proc.popen.poll() is None:
            os.kill(proc.popen.pid, sig)

    def stop_all(self, grace_s: float = 20.0) -> None:
        live = [p for p in self.procs.values() if p.popen.poll() is None]
        for proc in live:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in live:
            try:
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                say(f"{proc.role} ignored SIGTERM for {grace_s:.0f}s; SIGKILL")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.popen.pid, signal.SIGKILL)
                proc.popen.wait(timeout=10)
        self.procs.clear()


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


# --------------------------------------------------------------------------- resources


@dataclass
class Resources:
    """What a run created outside itself, removed at the end whatever happened."""

    dsn: str
    bootstrap: str
    schemas: list[str] = field(default_factory=list)
    topics: list[str] = field(default_factory=list)


async def cleanup(res: Resources) -> None:
    if res.schemas:
        try:
            conn = await asyncpg.connect(res.dsn, timeout=10)
            try:
                await conn.execute("SET lock_timeout = '20s'")
                for schema in res.schemas:
                    await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            finally:
                await conn.close()
            say(f"dropped schemas {', '.join(res.schemas)}")
        except Exception as exc:
            say(f"WARNING: could not drop schemas {res.schemas}: {exc!r}")
    if res.topics:
        admin = AIOKafkaAdminClient(bootstrap_servers=res.bootstrap)
        try:
            await admin.start()
            existing = set(await admin.list_topics())
            doomed = [t for t in res.topics if t in existing]
            if doomed:
                await admin.delete_topics(doomed)
            say(f"deleted {len(doomed)} topics")
        except Exception as exc:
            say(f"WARNING: could not delete topics {res.topics}: {exc!r}")
        finally:
            await admin.close()


# --------------------------------------------------------------------------- peer


async def measure_peer(
    res: Resources, run_id: str, workflows: int, concurrencies: list[int]
) -> dict[str, Any]:
    """DBOS Transact doing the same shaped work on the same Postgres (bench/peer_dbos.py),
    once per concurrency; the best run is the peer's figure."""
    if importlib.util.find_spec("dbos") is None:
        return {"skipped": "dbos is not installed: pip install 'saga-engine[bench]'"}
    runs: list[dict[str, Any]] = []
    for concurrency in concurrencies:
        schema = f"bench_{run_id}_dbos{concurrency}"
        res.schemas.extend([schema, f"{schema}_ledger"])
        say(f"peer: DBOS, {workflows} workflows, {concurrency} in flight")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.peer_dbos", "--dsn", res.dsn, "--schema", schema,
            "--workflows", str(workflows), "--concurrency", str(concurrency),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout=300)
        except TimeoutError:
            proc.kill()
            raise BenchError("the DBOS peer did not finish within 300 s") from None
        if proc.returncode != 0:
            raise BenchError(f"the DBOS peer failed:\n{err.decode(errors='replace')[-3000:]}")
        run = json.loads(out.decode().strip().splitlines()[-1])
        say(f"peer: {run['workflows_per_s']} workflows/s, {run['cpu_ms_per_workflow']} ms CPU each")
        runs.append(run)
    return {"best": max(runs, key=lambda r: r["workflows_per_s"]), "runs": runs}


# --------------------------------------------------------------------------- ceiling


async def pg_info(conn: asyncpg.Connection[Any]) -> dict[str, Any]:
    info: dict[str, Any] = {"server_version": await conn.fetchval("SHOW server_version")}
    for name in (
        "synchronous_commit",
        "fsync",
        "wal_sync_method",
        "commit_delay",
        "max_connections",
    ):
        info[name] = await conn.fetchval(f"SHOW {name}")
    return info


async def pg_counters(conn: asyncpg.Connection[Any]) -> dict[str, int]:
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    db = await conn.fetchrow(
        "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = current_database()"
    )
    wal = await conn.fetchrow("SELECT wal_records, wal_bytes, wal_sync FROM pg_stat_wal")
    assert db is not None
    assert wal is not None
    return {
        "xact_commit": int(db["xact_commit"]),
        "wal_records": int(wal["wal_records"]),
        "wal_bytes": int(wal["wal_bytes"]),
        "wal_sync": int(wal["wal_sync"]),
    }


async def measure_ceiling(
    dsn: str, schema: str, seconds: float, connections: int
) -> dict[str, Any]:
    """Single-row INSERTs, each its own transaction (autocommit: one round trip, one WAL
    flush), into a table shaped like saga_events (text key, int, jsonb)."""
    table = f'"{schema}".scratch'
    payload = json.dumps(
        {"kind": "command_issued", "at": datetime.now(UTC).isoformat(), "x": "y" * 150}
    )
    insert = f"INSERT INTO {table} (k, n, data) VALUES ($1, $2, $3::jsonb)"
    setup = await asyncpg.connect(dsn, timeout=10)
    try:
        await setup.execute(f'CREATE SCHEMA "{schema}"')
        await setup.execute(
            f"CREATE TABLE {table} (id bigserial PRIMARY KEY, k text NOT NULL, "
            "n int NOT NULL, data jsonb NOT NULL)"
        )
        info = await pg_info(setup)
    finally:
        await setup.close()

    async def worker(conn: asyncpg.Connection[Any], until: float) -> int:
        n = 0
        key = uuid.uuid4().hex
        while time.perf_counter() < until:
            await conn.execute(insert, key, n, payload)
            n += 1
        return n

    conns = [await asyncpg.connect(dsn, timeout=10) for _ in range(connections)]
    try:
        await worker(conns[0], time.perf_counter() + 0.3)  # warm the statement cache
        t0 = time.perf_counter()
        single = await worker(conns[0], t0 + seconds)
        single_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        counts = await asyncio.gather(*(worker(c, t0 + seconds) for c in conns))
        conc_s = time.perf_counter() - t0
    finally:
        for c in conns:
            await c.close()
    single_rate = single / single_s
    return {
        "pg_single_insert_per_s": round(single_rate, 1),
        "pg_single_commit_ms": round(1000 / single_rate, 3),
        "pg_concurrent_insert_per_s": round(sum(counts) / conc_s, 1),
        "concurrent_connections": connections,
        "seconds_each": seconds,
        "postgres": info,
    }


# --------------------------------------------------------------------------- one run


@dataclass
class RunConfig:
    sagas: int
    concurrency: int
    warmup: int
    probe: int
    partitions: int
    fetch_max_wait_ms: int
    group_commit: bool
    timeout_s: float
    start_timeout_s: float
    poll_s: float
    profile: Path | None
    profile_clock: str
    profile_role: str
    idle_s: float


class SagaRun:
    """One engine and three participants on a fresh schema and topic prefix."""

    def __init__(
        self, cfg: RunConfig, res: Resources, procs: Processes, logs: Path, tag: str
    ) -> None:
        self.cfg = cfg
        self.res = res
        self.procs = procs
        self.tag = tag
        self.schema = f"bench_{tag}"
        self.prefix = f"bench-{tag}"
        self.dir = logs / tag
        self.dir.mkdir(parents=True)
        self.settings = Settings(
            pg=PostgresSettings(dsn=res.dsn, db_schema=self.schema),
            kafka=KafkaSettings(
                bootstrap_servers=res.bootstrap,
                topic_prefix=self.prefix,
                group_id=f"{self.prefix}-engines",
                partitions=cfg.partitions,
                fetch_max_wait_ms=cfg.fetch_max_wait_ms,
            ),
        )
        self.roles = ["engine", *(f"participant-{p}" for p in PARTICIPANTS)]
        self._stats_requests = 0

    # ----------------------------------------------------------------- processes

    def _env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SAGA_", "BENCH_"))}
        env.update(
            {
                "PYTHONPATH": str(ROOT),
                "SAGA_PG__DSN": self.res.dsn,
                "SAGA_PG__DB_SCHEMA": self.schema,
                "SAGA_KAFKA__BOOTSTRAP_SERVERS": self.res.bootstrap,
                "SAGA_KAFKA__TOPIC_PREFIX": self.prefix,
                "SAGA_KAFKA__GROUP_ID": f"{self.prefix}-engines",
                "SAGA_KAFKA__PARTITIONS": str(self.cfg.partitions),
                "SAGA_KAFKA__FETCH_MAX_WAIT_MS": str(self.cfg.fetch_max_wait_ms),
                "SAGA_PARTICIPANT__DSN": self.res.dsn,
                "SAGA_ADMIN__PORT": "0",
                "BENCH_STATE_DIR": str(self.dir),
                "BENCH_GROUP_COMMIT": "1" if self.cfg.group_commit else "0",
                **extra,
            }
        )
        return env

    def _spawn_all(self) -> None:
        def profiling(role: str) -> dict[str, str]:
            if self.cfg.profile is None or self.cfg.profile_role != role:
                return {}
            return {
                "BENCH_PROFILE": str(self.cfg.profile),
                "BENCH_PROFILE_CLOCK": self.cfg.profile_clock,
            }

        self.procs.spawn(
            "engine",
            ["-m", "bench.app", "engine"],
            self._env(**profiling("engine")),
            self.dir / "engine.log",
        )
        for p in PARTICIPANTS:
            self.procs.spawn(
                f"participant-{p}",
                ["-m", "bench.app", "participant", p],
                self._env(SAGA_PARTICIPANT__DB_SCHEMA=f"{self.schema}_{p}", **profiling(p)),
                self.dir / f"participant-{p}.log",
            )

    async def _wait_files(self, names: list[str], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not all((self.dir / n).exists() for n in names):
            self.procs.check_alive()
            if time.monotonic() > deadline:
                missing = [n for n in names if not (self.dir / n).exists()]
                raise BenchError(f"timed out after {timeout_s:.0f}s waiting for {what}: {missing}")
            await asyncio.sleep(0.05)

    async def _stats(self) -> dict[str, dict[str, Any]]:
        """Asks every role for its counters (SIGUSR1) and reads them."""
        self._stats_requests += 1
        n = self._stats_requests
        for role in self.roles:
            self.procs.send(role, signal.SIGUSR1)
        names = [f"{role}.stats.{n}.json" for role in self.roles]
        await self._wait_files(names, 15, "counters")
        return {role: read_json(self.dir / f"{role}.stats.{n}.json") or {} for role in self.roles}

    def _cpu(self) -> dict[str, float | None]:
        out: dict[str, float | None] = {
            role: proc_cpu_s(proc.popen.pid) for role, proc in self.procs.procs.items()
        }
        kpid = kafka_pid()
        out["kafka"] = proc_cpu_s(kpid) if kpid else None
        out["postgres_all"] = postgres_cpu_s()
        out["bench"] = self_cpu_s()
        busy, total = machine_cpu()
        out["machine.busy"], out["machine.total"] = float(busy), float(total)
        for role, proc in self.procs.procs.items():
            split = proc_cpu_split(proc.popen.pid)
            if split is not None:
                out[f"{role}.user"], out[f"{role}.sys"] = split
        return out

    # ----------------------------------------------------------------- sagas

    async def _count_done(self, conn: asyncpg.Connection[Any]) -> int:
        value = await conn.fetchval(
            "SELECT count(*) FROM sagas WHERE status = ANY($1::text[])", DONE_STATUSES
        )
        return int(value)

    def _start(self, client: SagaClient, sent: dict[str, float]) -> asyncio.Task[str]:
        saga_id = str(uuid.uuid4())
        sent[saga_id] = time.time()
        return asyncio.get_running_loop().create_task(
            client.start(SAGA_NAME, {"amount": 1}, saga_id=saga_id)
        )

    async def _drive(
        self,
        client: SagaClient,
        conn: asyncpg.Connection[Any],
        n: int,
        concurrency: int,
        timeout_s: float,
        poll_s: float,
    ) -> dict[str, float]:
        """Starts ``n`` sagas, at most ``concurrency`` unfinished at a time (0: all at
        once), and returns once all are done. Returns saga id -> wall time of the start."""
        sent: dict[str, float] = {}
        sends: list[asyncio.Task[str]] = []
        base = await self._count_done(conn)
        done = 0
        deadline = time.monotonic() + timeout_s
        last_report = time.monotonic()
        try:
            while done < n:
                window = n if concurrency <= 0 else min(n, done + concurrency)
                while len(sent) < window:
                    sends.append(self._start(client, sent))
                for task in sends:
                    if task.done() and task.exception() is not None:
                        raise BenchError(f"a start request failed: {task.exception()!r}")
                if time.monotonic() > deadline:
                    raise BenchError(f"only {done}/{n} sagas done after {timeout_s:.0f}s")
                self.procs.check_alive()
                await asyncio.sleep(poll_s)
                done = await self._count_done(conn) - base
                if time.monotonic() - last_report > 5:
                    last_report = time.monotonic()
                    say(f"  {done}/{n} sagas done, {len(sent) - done} in flight")
            await asyncio.gather(*sends)
        finally:
            for task in sends:
                task.cancel()
        return sent

    async def _probe(
        self, client: SagaClient, conn: asyncpg.Connection[Any], n: int
    ) -> dict[str, float]:
        """Sagas one at a time: the latency of an idle pipeline."""
        sent: dict[str, float] = {}
        for _ in range(n):
            task = self._start(client, sent)
            saga_id = await asyncio.wait_for(task, 15)
            deadline = time.monotonic() + 30
            while True:
                status = await conn.fetchval("SELECT status FROM sagas WHERE saga_id = $1", saga_id)
                if status in DONE_STATUSES:
                    break
                if time.monotonic() > deadline:
                    raise BenchError(f"probe saga {saga_id} still {status} after 30s")
                self.procs.check_alive()
                await asyncio.sleep(0.005)
        return sent

    # ----------------------------------------------------------------- analysis

    async def _timings(
        self, conn: asyncpg.Connection[Any], sent: dict[str, float]
    ) -> dict[str, Any]:
        """Per-saga latency from the events' timestamps (see README: what is measured)."""
        ids = list(sent)
        rows = await conn.fetch(
            """
            SELECT saga_id, kind, data->>'step' AS step, data->>'command_id' AS command_id,
                   extract(epoch FROM (data->>'at')::timestamptz)::float8 AS at,
                   extract(epoch FROM recorded_at)::float8 AS rec
            FROM saga_events WHERE saga_id = ANY($1::text[]) ORDER BY saga_id, seq
            """,
            ids,
        )
        handled: dict[str, float] = {}
        for p in PARTICIPANTS:
            for r in await conn.fetch(
                f'SELECT command_id, extract(epoch FROM at)::float8 AS at FROM "{self.schema}_{p}".ledger '
                "WHERE saga_id = ANY($1::text[])",
                ids,
            ):
                handled[r["command_id"]] = r["at"]
        by_saga: dict[str, list[asyncpg.Record]] = {}
        for r in rows:
            by_saga.setdefault(r["saga_id"], []).append(r)
        total: list[float] = []
        inbox: list[float] = []
        out_leg: list[float] = []
        back_leg: list[float] = []
        hop: list[float] = []
        final_wait: list[float] = []
        first_sent = min(sent.values()) if sent else 0.0
        last_end = 0.0
        completed = 0
        events = len(rows)
        for saga_id, evs in by_saga.items():
            kinds = {e["kind"]: e for e in evs}
            end = kinds.get("saga_completed")
            started = kinds.get("saga_started")
            if end is None or started is None:
                continue
            completed += 1
            t0 = sent[saga_id]
            total.append(end["rec"] - t0)
            last_end = max(last_end, end["rec"])
            inbox.append(started["at"] - t0)
            final_wait.append(end["rec"] - end["at"])
            issued = {e["command_id"]: e for e in evs if e["kind"] == "command_issued"}
            for e in evs:
                if e["kind"] != "reply_received" or e["command_id"] not in issued:
                    continue
                cmd = issued[e["command_id"]]
                hop.append(e["at"] - cmd["at"])
                at_participant = handled.get(e["command_id"])
                if at_participant is not None:
                    out_leg.append(at_participant - cmd["at"])
                    back_leg.append(e["at"] - at_participant)
        wall = last_end - first_sent if completed else 0.0
        return {
            "completed": completed,
            "events": events,
            "wall_s": round(wall, 3),
            "sagas_per_s": round(completed / wall, 2) if wall > 0 else None,
            "latency_ms": dist(total),
            "breakdown_ms": {
                "start_to_engine": dist(inbox),
                "step_round_trip": dist(hop),
                "step_outbound": dist(out_leg),
                "step_return": dist(back_leg),
                "final_append_queue": dist(final_wait),
            },
        }

    async def _status_counts(self, conn: asyncpg.Connection[Any], ids: list[str]) -> dict[str, int]:
        rows = await conn.fetch(
            "SELECT status, count(*) AS n FROM sagas WHERE saga_id = ANY($1::text[]) GROUP BY status",
            ids,
        )
        return {r["status"]: int(r["n"]) for r in rows}

    # ----------------------------------------------------------------- the run

    async def run(self) -> dict[str, Any]:
        cfg = self.cfg
        self.res.schemas += [self.schema, *(f"{self.schema}_{p}" for p in PARTICIPANTS)]
        kafka = self.settings.kafka
        topics = Topics.of(kafka)
        names = [topics.inbox, topics.dlq, *(topics.commands(p) for p in PARTICIPANTS)]
        self.res.topics += names
        await ensure_topics(kafka, names)
        say(
            f"run {self.tag}: fetch_max_wait_ms={cfg.fetch_max_wait_ms} partitions={cfg.partitions} "
            f"group_commit={cfg.group_commit} sagas={cfg.sagas} concurrency={cfg.concurrency}"
        )
        self._spawn_all()
        await self._wait_files(
            [f"{r}.ready" for r in self.roles], cfg.start_timeout_s, "the processes to be ready"
        )
        say("all processes own their partitions")
        conn = await asyncpg.connect(
            self.res.dsn, timeout=10, server_settings={"search_path": self.schema}
        )
        try:
            async with SagaClient(self.settings, source="/bench") as client:
                if cfg.warmup:
                    say(f"warm-up: {cfg.warmup} sagas")
                    await self._drive(client, conn, cfg.warmup, 0, cfg.start_timeout_s, 0.05)
                probe_sent: dict[str, float] = {}
                if cfg.probe:
                    say(f"latency probe: {cfg.probe} sagas, one at a time")
                    probe_sent = await self._probe(client, conn, cfg.probe)
                idle = await self._idle_cpu(cfg.idle_s)
                pg0 = await pg_counters(conn)
                stats0 = await self._stats()
                cpu0 = self._cpu()
                say(f"load: {cfg.sagas} sagas, concurrency {cfg.concurrency or 'unbounded'}")
                t0 = time.monotonic()
                sent = await self._drive(
                    client, conn, cfg.sagas, cfg.concurrency, cfg.timeout_s, cfg.poll_s
                )
                elapsed = time.monotonic() - t0
                cpu1 = self._cpu()
                stats1 = await self._stats()
            say(f"load done in {elapsed:.1f}s; stopping the processes")
            self.procs.stop_all()
            pg1 = await pg_counters(conn)
            timings = await self._timings(conn, sent)
            probe = await self._timings(conn, probe_sent) if probe_sent else None
            statuses = await self._status_counts(conn, list(sent))
        finally:
            await conn.close()
        final = {r: read_json(self.dir / f"{r}.stats.final.json") for r in self.roles}
        report = self._report(timings, probe, statuses, cpu0, cpu1, stats0, stats1, final, pg0, pg1)
        report["idle_cpu_fraction_of_core"] = idle
        return report

    async def _idle_cpu(self, seconds: float) -> dict[str, float | None] | None:
        """CPU each process burns with nothing to do (consumer polling, relays, timers)."""
        if seconds <= 0:
            return None
        before = self._cpu()
        t0 = time.monotonic()
        await asyncio.sleep(seconds)
        after = self._cpu()
        elapsed = time.monotonic() - t0
        keys = [*self.roles, "kafka", "postgres_all"]
        out: dict[str, float | None] = {}
        for key in keys:
            a, b = before.get(key), after.get(key)
            out[key] = round((b - a) / elapsed, 4) if a is not None and b is not None else None
        return out

    def _report(
        self,
        timings: dict[str, Any],
        probe: dict[str, Any] | None,
        statuses: dict[str, int],
        cpu0: dict[str, float | None],
        cpu1: dict[str, float | None],
        stats0: dict[str, dict[str, Any]],
        stats1: dict[str, dict[str, Any]],
        final: dict[str, dict[str, Any] | None],
        pg0: dict[str, int],
        pg1: dict[str, int],
    ) -> dict[str, Any]:
        cfg = self.cfg
        n = timings["completed"]

        def cpu_delta(role: str) -> float | None:
            a, b = cpu0.get(role), cpu1.get(role)
            return round(b - a, 3) if a is not None and b is not None else None

        engine_cpu = cpu_delta("engine")
        part_cpu = {p: cpu_delta(f"participant-{p}") for p in PARTICIPANTS}
        part_total = (
            round(sum(v for v in part_cpu.values() if v is not None), 3)
            if all(v is not None for v in part_cpu.values())
            else None
        )
        gc0 = stats0["engine"].get("group_commit", {})
        gc1 = stats1["engine"].get("group_commit", {})
        batches = gc1.get("batches", 0) - gc0.get("batches", 0)
        operations = gc1.get("operations", 0) - gc0.get("operations", 0)

        def participant_delta(key: str) -> int:
            return sum(
                stats1[f"participant-{p}"].get("participant", {}).get(key, 0)
                - stats0[f"participant-{p}"].get("participant", {}).get(key, 0)
                for p in PARTICIPANTS
            )

        processed = participant_delta("processed")
        wall = timings["wall_s"] or None
        # Each participant command: its transaction; and per batch of commands, one
        # statement marking their outbox rows published.
        participant_commits = processed + participant_delta("mark_published_statements")
        pg_delta = {k: pg1[k] - pg0[k] for k in pg0}
        total_cpu = sum(
            v
            for v in [
                engine_cpu,
                part_total,
                *(cpu_delta(k) for k in ("kafka", "postgres_all", "bench")),
            ]
            if v is not None
        )
        busy_d = (cpu1.get("machine.busy") or 0) - (cpu0.get("machine.busy") or 0)
        total_d = (cpu1.get("machine.total") or 0) - (cpu0.get("machine.total") or 0)
        busy_frac = busy_d / total_d if total_d > 0 else None
        engine_final = final.get("engine") or {}
        return {
            "settings": {
                "fetch_max_wait_ms": cfg.fetch_max_wait_ms,
                "partitions": cfg.partitions,
                "group_commit": cfg.group_commit,
                "group_commit_max_batch": gc1.get("max_batch"),
                "concurrency": cfg.concurrency,
                "warmup_sagas": cfg.warmup,
                "probe_sagas": cfg.probe,
                "engine_pg_pool_max": self.settings.pg.pool_max_size,
                "participant_pg_pool_max": self.settings.participant.pool_max_size,
                "profiled": f"{cfg.profile_role} ({cfg.profile_clock} clock)"
                if cfg.profile is not None
                else False,
            },
            "sagas": n,
            "statuses": statuses,
            "sagas_per_s": timings["sagas_per_s"],
            "wall_s": timings["wall_s"],
            "latency_ms": timings["latency_ms"],
            "latency_breakdown_ms": timings["breakdown_ms"],
            "idle_latency_ms": probe["latency_ms"] if probe else None,
            "idle_latency_breakdown_ms": probe["breakdown_ms"] if probe else None,
            "engine_cpu_s": engine_cpu,
            "participant_cpu_s": part_total,
            "participant_cpu_s_each": part_cpu,
            "engine_cpu_ms_per_saga": round(1000 * engine_cpu / n, 3) if engine_cpu and n else None,
            "participant_cpu_ms_per_saga": round(1000 * part_total / n, 3)
            if part_total and n
            else None,
            "other_cpu_s": {k: cpu_delta(k) for k in ("kafka", "postgres_all", "bench")},
            "cpu_total_ms_per_saga": round(1000 * total_cpu / n, 2) if n else None,
            "machine_cpu_busy_fraction": round(busy_frac, 3) if busy_frac is not None else None,
            "cpu_user_sys_s": {
                role: [cpu_delta(f"{role}.user"), cpu_delta(f"{role}.sys")] for role in self.roles
            },
            "events_per_saga": round(timings["events"] / n, 2) if n else None,
            "engine_group_commit": {
                "batches": batches,
                "operations": operations,
                "avg_batch": round(operations / batches, 2) if batches else None,
                "largest_batch_whole_run": gc1.get("largest_batch"),
                "transactions_per_saga": round(batches / n, 3) if n else None,
                "transactions_per_s": round(batches / wall, 1) if wall else None,
            },
            "participant_commits_per_s": round(participant_commits / wall, 1) if wall else None,
            "engine_counters": stats1["engine"].get("engine"),
            "engine_counters_final": engine_final.get("engine"),
            "dead_lettered": engine_final.get(
                "dead_lettered", stats1["engine"].get("dead_lettered")
            ),
            "participant_counters": {
                p: stats1[f"participant-{p}"].get("participant") for p in PARTICIPANTS
            },
            "pg_db_wide_delta": {
                **pg_delta,
                "note": "whole database and cluster, load phase to process exit; other "
                "clients of the same server count too",
            },
        }


# --------------------------------------------------------------------------- main


def profile_top(path: Path, n: int = 15) -> dict[str, Any]:
    stats = pstats.Stats(str(path))
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]

    def rows(key: int) -> list[dict[str, Any]]:
        ordered = sorted(raw.items(), key=lambda kv: kv[1][key], reverse=True)[:n]
        out = []
        for (file, line, func), (_cc, nc, tt, ct, _callers) in ordered:
            short = file.replace(str(ROOT) + "/", "")
            if "site-packages/" in short:
                short = short.split("site-packages/", 1)[1]
            out.append(
                {
                    "function": f"{short}:{line}({func})",
                    "ncalls": nc,
                    "tottime_s": round(tt, 3),
                    "cumtime_s": round(ct, 3),
                }
            )
        return out

    total = sum(v[2] for v in raw.values())
    return {
        "path": str(path),
        "total_tottime_s": round(total, 3),
        "top_cumulative": rows(3),
        "top_tottime": rows(2),
    }


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.e2e", description=__doc__.split("\n")[0])
    ap.add_argument("--sagas", type=int, default=500, help="sagas in the measured load")
    ap.add_argument(
        "--concurrency", type=int, default=64, help="most sagas unfinished at once (0: all)"
    )
    ap.add_argument("--warmup", type=int, default=20, help="sagas run before measuring")
    ap.add_argument("--probe", type=int, default=20, help="sagas run one at a time (idle latency)")
    ap.add_argument(
        "--fetch-max-wait-ms",
        type=int,
        nargs="+",
        default=[20],
        help="one run per value (the first is the headline)",
    )
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--no-group-commit", action="store_true", help="engine writes one op per txn")
    ap.add_argument(
        "--peer-concurrency",
        type=int,
        nargs="*",
        default=None,
        help="DBOS peer runs, one per value (default: 8 and --concurrency; none: skip)",
    )
    ap.add_argument("--ceiling-seconds", type=float, default=3.0)
    ap.add_argument("--ceiling-connections", type=int, default=16)
    ap.add_argument("--timeout", type=float, default=120.0, help="limit for the measured load")
    ap.add_argument("--start-timeout", type=float, default=60.0)
    ap.add_argument("--poll-ms", type=float, default=20.0, help="completion polling interval")
    ap.add_argument("--max-seconds", type=float, default=420.0, help="limit for the whole run")
    ap.add_argument(
        "--profile", type=Path, help="cProfile the engine during the first run's load, to PATH"
    )
    ap.add_argument(
        "--profile-role",
        choices=["engine", *PARTICIPANTS],
        default="engine",
        help="which process --profile profiles",
    )
    ap.add_argument(
        "--idle-seconds",
        type=float,
        default=2.0,
        help="measure each process's CPU while idle for this long (0: skip)",
    )
    ap.add_argument(
        "--profile-clock",
        choices=["wall", "cpu"],
        default="wall",
        help="the profiler's timer: wall clock (cheap) or process CPU time (~0.5us a call)",
    )
    ap.add_argument("--keep", action="store_true", help="keep schemas, topics and logs")
    ap.add_argument("--json-out", type=Path, help="also write the JSON result to this file")
    args = ap.parse_args(argv)
    if args.sagas < 1:
        ap.error("--sagas must be at least 1")
    return args


def machine() -> dict[str, Any]:
    return {
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "loadavg_at_start": loadavg(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


async def bench(args: argparse.Namespace, res: Resources, procs: Processes, logs: Path) -> Any:
    date = datetime.now(UTC).isoformat(timespec="seconds")
    run_id = uuid.uuid4().hex[:8]
    host = machine()
    ceiling_schema = f"bench_{run_id}_ceiling"
    res.schemas.append(ceiling_schema)
    say(f"ceiling: {args.ceiling_seconds:g}s sequential + {args.ceiling_seconds:g}s on "
        f"{args.ceiling_connections} connections")  # fmt: skip
    ceiling = await measure_ceiling(
        res.dsn, ceiling_schema, args.ceiling_seconds, args.ceiling_connections
    )
    say(
        f"ceiling: {ceiling['pg_single_insert_per_s']:.0f} commits/s sequential, "
        f"{ceiling['pg_concurrent_insert_per_s']:.0f} concurrent"
    )
    peer_concurrency = (
        args.peer_concurrency
        if args.peer_concurrency is not None
        else sorted({8, args.concurrency})
    )
    peer: dict[str, Any] = (
        await measure_peer(res, run_id, args.sagas, peer_concurrency)
        if peer_concurrency
        else {"skipped": "--peer-concurrency given no values"}
    )
    runs: list[dict[str, Any]] = []
    for i, wait_ms in enumerate(args.fetch_max_wait_ms):
        cfg = RunConfig(
            sagas=args.sagas,
            concurrency=args.concurrency,
            warmup=args.warmup,
            probe=args.probe,
            partitions=args.partitions,
            fetch_max_wait_ms=wait_ms,
            group_commit=not args.no_group_commit,
            timeout_s=args.timeout,
            start_timeout_s=args.start_timeout,
            poll_s=args.poll_ms / 1000,
            profile=args.profile.resolve() if args.profile and i == 0 else None,
            profile_clock=args.profile_clock,
            profile_role=args.profile_role,
            idle_s=args.idle_seconds,
        )
        run = SagaRun(cfg, res, procs, logs, f"{run_id}{i}")
        result = await run.run()
        say(
            f"run {i}: {result['sagas']} sagas at {result['sagas_per_s']}/s, latency p50 "
            f"{result['latency_ms'].get('p50')} ms p99 {result['latency_ms'].get('p99')} ms, "
            f"idle p50 {(result['idle_latency_ms'] or {}).get('p50')} ms, "
            f"engine cpu {result['engine_cpu_s']}s"
        )
        runs.append(result)
    head = runs[0]
    single = ceiling["pg_single_insert_per_s"]
    concurrent = ceiling["pg_concurrent_insert_per_s"]
    gc = head["engine_group_commit"]
    commits_per_s = (gc["transactions_per_s"] or 0) + (head["participant_commits_per_s"] or 0)
    # What the machine could do if the whole stack had every core to itself and spent the
    # same CPU per saga as measured: a ceiling of its own, next to the commit rate.
    per_saga = head["cpu_total_ms_per_saga"]
    cpu_bound = host["cpus_usable"] * 1000 / per_saga if per_saga else None
    best_peer: dict[str, Any] = peer.get("best") or {}
    same_peer: dict[str, Any] = next(
        (r for r in peer.get("runs", []) if r["concurrency"] == args.concurrency), {}
    )
    python_cpu_ms = (head["engine_cpu_ms_per_saga"] or 0) + (
        head["participant_cpu_ms_per_saga"] or 0
    )
    out: dict[str, Any] = {
        "benchmark": "e2e-3-step-saga",
        "date": date,
        "machine": host,
        "sagas": head["sagas"],
        "sagas_per_s": head["sagas_per_s"],
        "latency_ms": head["latency_ms"],
        "idle_latency_ms": head["idle_latency_ms"],
        "engine_cpu_s": head["engine_cpu_s"],
        "participant_cpu_s": head["participant_cpu_s"],
        "engine_cpu_ms_per_saga": head["engine_cpu_ms_per_saga"],
        "participant_cpu_ms_per_saga": head["participant_cpu_ms_per_saga"],
        "cpu_total_ms_per_saga": head["cpu_total_ms_per_saga"],
        "machine_cpu_busy_fraction": head["machine_cpu_busy_fraction"],
        "ceiling": ceiling,
        "ratio": {
            "sagas_per_s_vs_single_insert": ratio(head["sagas_per_s"], single),
            "sagas_per_s_vs_concurrent_insert": ratio(head["sagas_per_s"], concurrent),
            "db_commits_per_s_vs_single_insert": ratio(commits_per_s, single),
            "db_commits_per_s_vs_concurrent_insert": ratio(commits_per_s, concurrent),
            "sagas_per_s_vs_cpu_bound_estimate": ratio(head["sagas_per_s"], cpu_bound),
            # > 1: faster than the peer; its steps stay in-process, ours cross Kafka.
            "sagas_per_s_vs_peer_workflows_per_s": ratio(
                head["sagas_per_s"], best_peer.get("workflows_per_s")
            ),
            # < 1: less CPU per transaction in the engine and participant processes
            # together than the peer's one process.
            "python_cpu_ms_per_saga_vs_peer": ratio(
                python_cpu_ms, best_peer.get("cpu_ms_per_workflow")
            ),
            # The peer with as many transactions in flight as the sagas had.
            "sagas_per_s_vs_peer_same_concurrency": ratio(
                head["sagas_per_s"], same_peer.get("workflows_per_s")
            ),
        },
        "peer": peer,
        "cpu_bound_sagas_per_s_estimate": round(cpu_bound, 1) if cpu_bound else None,
        "db_commits_per_s": round(commits_per_s, 1),
        "settings": head["settings"],
        "run": head,
    }
    if len(runs) > 1:
        out["compare_fetch_max_wait_ms"] = [
            {
                "fetch_max_wait_ms": r["settings"]["fetch_max_wait_ms"],
                "sagas_per_s": r["sagas_per_s"],
                "latency_ms": r["latency_ms"],
                "idle_latency_ms": r["idle_latency_ms"],
                "engine_cpu_s": r["engine_cpu_s"],
                "participant_cpu_s": r["participant_cpu_s"],
                "ratio_sagas_per_s_vs_single_insert": ratio(r["sagas_per_s"], single),
                "run": r,
            }
            for r in runs[1:]
        ]
    if args.profile:
        out["profile"] = profile_top(args.profile.resolve())
    return out


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def _handle_sigterm() -> Iterator[None]:
    old = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    settings = Settings()
    res = Resources(settings.pg.dsn.get_secret_value(), settings.kafka.bootstrap_servers)
    procs = Processes()
    logs = Path(tempfile.mkdtemp(prefix="saga-bench-"))
    result: Any = None
    ok = False
    with _handle_sigterm():
        try:

            async def bounded() -> Any:
                async with asyncio.timeout(args.max_seconds):
                    return await bench(args, res, procs, logs)

            result = asyncio.run(bounded())
            ok = True
        except (BenchError, TimeoutError) as exc:
            say(f"FAILED: {exc}")
        except KeyboardInterrupt:
            say("interrupted")
        except Exception as exc:
            say(f"FAILED: {type(exc).__name__}: {exc}")
            import traceback

            traceback.print_exc(file=sys.stderr)
        finally:
            if not ok:
                for proc in procs.procs.values():
                    say(f"--- {proc.role} log tail:\n{tail(proc.log)}")
            procs.stop_all()
            if not args.keep:
                asyncio.run(cleanup(res))
                if ok:
                    shutil.rmtree(logs, ignore_errors=True)
            if not ok or args.keep:
                say(f"logs kept in {logs}")
    if result is None:
        return 1
    text = json.dumps(result, indent=2)
    if args.json_out:
        args.json_out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
