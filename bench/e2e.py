"""End-to-end saga throughput, CPU and cost per saga over the real stack, against its ceiling.

    python -m bench.e2e [--load-seconds 30] [--points 64 512] [--peer-concurrency 8 64]
                        [--partitions 8] [--no-group-commit] [--profile engine.prof]

Needs Postgres and Kafka (``make up``; ``SAGA_PG__DSN`` / ``SAGA_KAFKA__BOOTSTRAP_SERVERS``).
One run:

1. the commit ceiling: raw asyncpg single-row INSERTs into a scratch table, one commit
   each, sequential on one connection and then on ``--ceiling-connections`` at once;
2. the peer, DBOS Transact (bench/peer_dbos.py), once per ``--peer-concurrency``;
3. for each concurrency point (``--points``), two pipelines one after the other, each on
   a fresh schema and topic prefix with one engine process and three participant
   processes: the saga engine (``bench.app``) and the bare, hand-written batched
   pipeline (``bench.bare``). Each gets a warm-up, a latency probe (sagas one at a
   time), idle CPU, and the measured load: ``--load-seconds`` of starting sagas to keep
   the point's number in flight, then waiting for the rest. Over the load: CPU of every
   process from /proc, Kafka requests counted in every process, Postgres transactions
   from pg_stat_database;
4. after each pipeline: its processes stopped (SIGTERM, then SIGKILL), its schemas
   dropped, its topics deleted (also on failure or Ctrl-C).

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
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

import asyncpg
from aiokafka.admin import AIOKafkaAdminClient

from bench import bare
from bench.app import PARTICIPANTS, SAGA_NAME
from bench.wal_window import WalWindow
from saga_engine import SagaStatus, Settings
from saga_engine.client import SagaClient
from saga_engine.settings import KafkaSettings, PostgresSettings
from saga_engine.transport._kafka import ensure_topics
from saga_engine.transport._topics import Topics

ROOT = Path(__file__).resolve().parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")
DONE_STATUSES = [s.value for s in SagaStatus if s.is_terminal or s.is_parked]
_T0 = time.monotonic()
#: Postgres backends flush their statistics to pg_stat_database at most once a second
#: (and when they go idle, after that second): wait this long before reading them.
PG_STATS_FLUSH_S = 1.5
#: The driver's completion poll (see ``_done``): LATERAL with OFFSET 0 keeps the planner
#: from turning the per-id probes into a hash join over a sequential scan.
DONE_SQL = """
SELECT s.saga_id FROM unnest($1::text[]) AS u(saga_id)
CROSS JOIN LATERAL (
    SELECT saga_id, status FROM sagas WHERE saga_id = u.saga_id OFFSET 0
) AS s
WHERE s.status = ANY($2::text[])
"""

#: The engine's events ``EngineRun.timings`` reads, each saga's in order.
EVENT_ROWS_SQL = """
SELECT saga_id, kind, data->>'step' AS step, data->>'command_id' AS command_id,
       extract(epoch FROM (data->>'at')::timestamptz)::float8 AS at,
       extract(epoch FROM recorded_at)::float8 AS rec
FROM saga_events WHERE saga_id = ANY($1::text[]) ORDER BY saga_id, seq
"""


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


def _rows_per_saga(delta: dict[str, int], n: int) -> dict[str, dict[str, float]]:
    """``rows.<table>.<kind>`` deltas as {table: {kind: rows per saga}}; ``hot_upd`` is
    the share of updates that were HOT (no index entry written)."""
    out: dict[str, dict[str, float]] = {}
    for key, value in delta.items():
        if not key.startswith("rows.") or not n:
            continue
        _, table, kind = key.split(".")
        out.setdefault(table, {})[kind] = round(value / n, 3)
    for counts in out.values():
        upd, hot = counts.get("upd") or 0, counts.pop("hot_upd", 0)
        counts["hot_share"] = round(hot / upd, 3) if upd else 0.0
    return out


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


def postgres_processes() -> Iterator[tuple[int, int, float]]:
    """(pid, parent pid, utime + stime in seconds) of every postgres process on the
    machine: each cluster's postmaster, and its backends and workers (its children)."""
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
            yield int(entry), int(fields[1]), (int(fields[11]) + int(fields[12])) / CLK_TCK


def postgres_cpu_s() -> float:
    """All postgres processes on the machine (other clients' backends included)."""
    return sum(cpu for _, _, cpu in postgres_processes())


def kafka_pid(bootstrap: str) -> int | None:
    """The broker's pid, from the state file of the dev stack whose broker listens on
    ``bootstrap``'s port (each stack of the checkout has its own, keyed by its ports:
    scripts/devstack_base.py)."""
    port = bootstrap.split(",")[0].rsplit(":", 1)[-1]
    for path in sorted((ROOT / ".dev").glob("state*.json")):
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        pid = state.get("kafka_pid")
        if str(state.get("kafka_port")) == port and isinstance(pid, int):
            return pid if proc_cpu_s(pid) is not None else None
    return None


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
    #: Databases created on other servers: (an address on that server, database name).
    databases: list[tuple[str, str]] = field(default_factory=list)


async def cleanup(res: Resources) -> None:
    """Drops every schema and database and deletes every topic registered so far
    (forgetting those that are gone, so it can run after each run and once more at the
    end)."""
    for server, database in list(res.databases):
        try:
            conn = await asyncpg.connect(server, timeout=10)
            try:
                await conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
            finally:
                await conn.close()
            res.databases.remove((server, database))
            say(f"dropped database {database}")
        except Exception as exc:
            say(f"WARNING: could not drop database {database}: {exc!r}")
    if res.schemas:
        try:
            conn = await asyncpg.connect(res.dsn, timeout=10)
            try:
                await conn.execute("SET lock_timeout = '20s'")
                for schema in list(res.schemas):
                    await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
                    res.schemas.remove(schema)
            finally:
                await conn.close()
            say("dropped the schemas")
        except Exception as exc:
            say(f"WARNING: could not drop schemas {res.schemas}: {exc!r}")
    if res.topics:
        admin = AIOKafkaAdminClient(bootstrap_servers=res.bootstrap)
        try:
            await admin.start()
            existing = set(await admin.list_topics())
            doomed = [t for t in res.topics if t in existing]
            if doomed:
                await asyncio.wait_for(admin.delete_topics(doomed), 30)
            res.topics.clear()
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
            sys.executable,
            "-m",
            "bench.peer_dbos",
            "--dsn",
            res.dsn,
            "--schema",
            schema,
            "--workflows",
            str(workflows),
            "--concurrency",
            str(concurrency),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
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


#: The pipeline's tables whose row writes each point reports (``pg_rows_per_saga``): the
#: engine's history and saga rows, the participants' claims, outbox and business rows.
_COUNTED_TABLES = (
    "sagas",
    "saga_decisions",
    "saga_processed_commands",
    "saga_reply_outbox",
    "ledger",
)


async def pg_counters(conn: asyncpg.Connection[Any], schema: str | None = None) -> dict[str, int]:
    """The database's transactions, the cluster's WAL and, with ``schema``, the row writes
    to the pipeline's tables (its schema and its participants' ``{schema}_*``), summed per
    table name: ``rows.<table>.<ins|upd|hot_upd|del>``. A HOT update writes no index entry."""
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    rows: dict[str, int] = {}
    if schema is not None:
        for r in await conn.fetch(
            "SELECT relname, sum(n_tup_ins)::int8 AS ins, sum(n_tup_upd)::int8 AS upd, "
            "sum(n_tup_hot_upd)::int8 AS hot_upd, sum(n_tup_del)::int8 AS del "
            "FROM pg_stat_user_tables WHERE (schemaname = $1 OR schemaname LIKE $1 || '\\_%') "
            "AND relname = ANY($2::text[]) GROUP BY relname",
            schema,
            list(_COUNTED_TABLES),
        ):
            for k in ("ins", "upd", "hot_upd", "del"):
                rows[f"rows.{r['relname']}.{k}"] = int(r[k])
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
        **rows,
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
    concurrency: int
    load_s: float
    warmup: int
    probe: int
    partitions: int
    fetch_max_wait_ms: int
    group_commit: bool
    uvloop: bool
    drain_timeout_s: float
    start_timeout_s: float
    poll_s: float
    profile: Path | None
    profile_clock: str
    profile_role: str
    idle_s: float
    #: Read the load's WAL by relation and kind (pg_walinspect): ``pg_wal_breakdown``.
    wal_breakdown: bool = False


def engine_config(
    args: argparse.Namespace, *, load_s: float, probe: int, idle_s: float
) -> RunConfig:
    """An engine pipeline's run from the options of a benchmark of it alone
    (bench/failover.py, bench/shards.py): ``--in-flight``, ``--warmup``, ``--partitions``,
    ``--fetch-max-wait-ms``, ``--drain-timeout``, ``--start-timeout``, ``--poll-ms``;
    group commit and uvloop on, no profile."""
    return RunConfig(
        concurrency=args.in_flight,
        load_s=load_s,
        warmup=args.warmup,
        probe=probe,
        partitions=args.partitions,
        fetch_max_wait_ms=args.fetch_max_wait_ms,
        group_commit=True,
        uvloop=True,
        drain_timeout_s=args.drain_timeout,
        start_timeout_s=args.start_timeout,
        poll_s=args.poll_ms / 1000,
        profile=None,
        profile_clock="wall",
        profile_role="engine",
        idle_s=idle_s,
    )


class PipelineRun:
    """One pipeline (an engine and three participants) on a fresh schema and topic
    prefix: spawned, warmed up, probed, loaded, measured, stopped. Subclasses say how
    sagas are started, when one is done and how its latency is read back."""

    pipeline = ""
    module = ""
    done_statuses: list[str] = []
    #: Transactions of the first counter read (``_pg_counters``) that its own snapshot
    #: counts: they are the driver's, not the pipeline's.
    counter_read_transactions = 2

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
        self.roles = ["engine", *(f"participant-{p}" for p in PARTICIPANTS)]
        self._stats_requests = 0
        #: Start requests handed to Kafka and not yet acknowledged (tasks or futures).
        self._pending: list[asyncio.Future[Any]] = []
        #: Transactions the driver ran on its connection (completion polls), so that
        #: they can be taken out of the database's commit count.
        self.driver_queries = 0

    # ----------------------------------------------------------------- pipeline-specific

    def topic_names(self) -> list[str]:
        raise NotImplementedError

    async def open_starter(self) -> None:
        """Opens what starts sagas (a client, a producer)."""

    async def close_starter(self) -> None:
        pass

    async def start_one(self, saga_id: str) -> None:
        """Hands one start request to Kafka without waiting for its acknowledgement."""
        raise NotImplementedError

    def check_starts(self) -> None:
        """Raises if a start request failed; forgets the acknowledged ones."""
        pending: list[asyncio.Future[Any]] = []
        for fut in self._pending:
            if not fut.done():
                pending.append(fut)
            elif fut.exception() is not None:
                raise BenchError(f"a start request failed: {fut.exception()!r}")
        self._pending = pending

    async def settle_starts(self, timeout_s: float) -> None:
        """Waits for every start request to be acknowledged."""
        if self._pending:
            await asyncio.wait_for(asyncio.gather(*self._pending), timeout_s)
        self.check_starts()

    async def timings(
        self, conn: asyncpg.Connection[Any], sent: dict[str, float]
    ) -> dict[str, Any]:
        raise NotImplementedError

    def extra_report(
        self,
        n: int,
        wall: float | None,
        stats0: dict[str, dict[str, Any]],
        stats1: dict[str, dict[str, Any]],
        final: dict[str, dict[str, Any] | None],
    ) -> dict[str, Any]:
        return {"counters": {role: stats1[role].get("counters") for role in self.roles}}

    def load_report(
        self,
        n: int,
        cpu0: dict[str, float | None],
        cpu1: dict[str, float | None],
        pg_delta: dict[str, int],
    ) -> dict[str, Any]:
        """More figures of the load (none here), over any of the report's: ``n`` sagas
        completed, ``cpu0`` and ``cpu1`` the ``_cpu`` reads at its start and end,
        ``pg_delta`` of the ``_pg_counters``."""
        return {}

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
                "BENCH_UVLOOP": "1" if self.cfg.uvloop else "0",
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
            ["-m", self.module, "engine"],
            self._env(**profiling("engine")),
            self.dir / "engine.log",
        )
        for p in PARTICIPANTS:
            self.procs.spawn(
                f"participant-{p}",
                ["-m", self.module, "participant", p],
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
        """Asks every role for its counters (SIGUSR1) and reads them; the driver's own
        Kafka requests are read at the same moment, as role ``driver``."""
        self._stats_requests += 1
        n = self._stats_requests
        for role in self.roles:
            self.procs.send(role, signal.SIGUSR1)
        driver = {"kafka_requests": bare.kafka_requests()}
        names = [f"{role}.stats.{n}.json" for role in self.roles]
        await self._wait_files(names, 15, "counters")
        out = {role: read_json(self.dir / f"{role}.stats.{n}.json") or {} for role in self.roles}
        out["driver"] = driver
        return out

    def _cpu(self) -> dict[str, float | None]:
        out: dict[str, float | None] = {
            role: proc_cpu_s(proc.popen.pid) for role, proc in self.procs.procs.items()
        }
        kpid = kafka_pid(self.res.bootstrap)
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

    async def _done(self, conn: asyncpg.Connection[Any], ids: Iterable[str]) -> set[str]:
        """Which of ``ids`` are finished: one query, one transaction.

        One primary-key probe per id, whatever the statistics: the schema is new, and
        until its first ANALYZE the planner would scan every saga on each poll (in one
        run, the driver's polls were the most expensive statement Postgres ran, and how
        much depended on when autovacuum got to the table, not on the engine)."""
        self.driver_queries += 1
        rows = await conn.fetch(DONE_SQL, list(ids), self.done_statuses)
        return {r["saga_id"] for r in rows}

    async def _start(self, sent: dict[str, float]) -> str:
        saga_id = str(uuid.uuid4())
        sent[saga_id] = time.time()
        await self.start_one(saga_id)
        return saga_id

    async def _drive(
        self,
        conn: asyncpg.Connection[Any],
        *,
        count: int | None,
        seconds: float,
        concurrency: int,
        timeout_s: float,
        poll_s: float,
    ) -> dict[str, float]:
        """Keeps ``concurrency`` sagas unfinished: starts a new one as soon as the
        completion poll sees room, ``count`` sagas in all (if given) or for ``seconds``;
        then waits for the rest. Returns saga id -> wall time of its start."""
        sent: dict[str, float] = {}
        inflight: set[str] = set()
        t0 = time.monotonic()
        stop_starting = t0 + seconds
        deadline = stop_starting + timeout_s
        last_report = t0
        while True:
            now = time.monotonic()
            starting = now < stop_starting if count is None else len(sent) < count
            if starting:
                room = concurrency - len(inflight)
                if count is not None:
                    room = min(room, count - len(sent))
                for _ in range(room):
                    inflight.add(await self._start(sent))
            elif not inflight:
                break
            self.check_starts()
            if now > deadline:
                raise BenchError(
                    f"{len(inflight)} of {len(sent)} sagas still unfinished after {now - t0:.0f}s"
                )
            self.procs.check_alive()
            await asyncio.sleep(poll_s)
            if inflight:
                inflight -= await self._done(conn, inflight)
            if time.monotonic() - last_report > 5:
                last_report = time.monotonic()
                say(
                    f"  {len(sent) - len(inflight)}/{len(sent)} sagas done, {len(inflight)} in flight"
                )
        await self.settle_starts(30)
        return sent

    async def _probe(self, conn: asyncpg.Connection[Any], n: int) -> dict[str, float]:
        """Sagas one at a time: the latency of an idle pipeline."""
        sent: dict[str, float] = {}
        for _ in range(n):
            saga_id = await self._start(sent)
            deadline = time.monotonic() + 30
            while not await self._done(conn, [saga_id]):
                if time.monotonic() > deadline:
                    raise BenchError(f"probe saga {saga_id} not done after 30s")
                self.check_starts()
                self.procs.check_alive()
                await asyncio.sleep(0.005)
            await self.settle_starts(15)
        return sent

    async def _pg_counters(self, conn: asyncpg.Connection[Any]) -> dict[str, int]:
        """The Postgres counters the load's figures are deltas of (``pg_counters``)."""
        return await pg_counters(conn, self.schema)

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
        names = self.topic_names()
        self.res.topics += names
        kafka = KafkaSettings(
            bootstrap_servers=self.res.bootstrap,
            topic_prefix=self.prefix,
            partitions=cfg.partitions,
        )
        await ensure_topics(kafka, names)
        say(
            f"{self.pipeline} {self.tag}: {cfg.concurrency} in flight for {cfg.load_s:g}s, "
            f"fetch_max_wait_ms={cfg.fetch_max_wait_ms} partitions={cfg.partitions}"
            + (f" group_commit={cfg.group_commit}" if self.pipeline == "engine" else "")
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
            await self.open_starter()
            try:
                if cfg.warmup:
                    say(f"warm-up: {cfg.warmup} sagas")
                    await self._drive(
                        conn,
                        count=cfg.warmup,
                        seconds=0,
                        concurrency=cfg.warmup,
                        timeout_s=cfg.start_timeout_s,
                        poll_s=0.05,
                    )
                probe_sent: dict[str, float] = {}
                if cfg.probe:
                    say(f"latency probe: {cfg.probe} sagas, one at a time")
                    probe_sent = await self._probe(conn, cfg.probe)
                idle = await self._idle_cpu(cfg.idle_s)
                await asyncio.sleep(max(0.0, PG_STATS_FLUSH_S - cfg.idle_s))
                window = WalWindow(conn) if cfg.wal_breakdown else None
                if window is not None:
                    await window.open()
                pg0 = await self._pg_counters(conn)
                queries0 = self.driver_queries
                stats0 = await self._stats()
                cpu0 = self._cpu()
                say(f"load: {cfg.load_s:g}s, {cfg.concurrency} in flight")
                t0 = time.monotonic()
                sent = await self._drive(
                    conn,
                    count=None,
                    seconds=cfg.load_s,
                    concurrency=cfg.concurrency,
                    timeout_s=cfg.drain_timeout_s,
                    poll_s=cfg.poll_s,
                )
                elapsed = time.monotonic() - t0
                cpu1 = self._cpu()
                stats1 = await self._stats()
                # Every backend's counts are in pg_stat_database a second after it idles.
                await asyncio.sleep(PG_STATS_FLUSH_S)
                pg1 = await self._pg_counters(conn)
                wal = await window.read(self._wal_labels()) if window is not None else None
                # The first counter read's statements, then every completion poll.
                driver_xacts = self.counter_read_transactions + self.driver_queries - queries0
            finally:
                await self.close_starter()
            say(f"load done in {elapsed:.1f}s ({len(sent)} sagas); stopping the processes")
            self.procs.stop_all()
            timings = await self.timings(conn, sent)
            probe = await self.timings(conn, probe_sent) if probe_sent else None
            statuses = await self._status_counts(conn, list(sent))
        finally:
            await conn.close()
        final = {r: read_json(self.dir / f"{r}.stats.final.json") for r in self.roles}
        report = self._report(
            timings, probe, statuses, cpu0, cpu1, stats0, stats1, final, pg0, pg1, driver_xacts
        )
        report["sagas_started"] = len(sent)
        report["load_s"] = round(elapsed, 2)
        report["idle_cpu_fraction_of_core"] = idle
        if wal is not None and timings["completed"]:
            report["pg_wal_breakdown"] = wal.per_saga(timings["completed"])
        return report

    def _wal_labels(self) -> dict[str, str]:
        """The pipeline's schemas, each named as ``pg_wal_breakdown`` names it."""
        return {self.schema: "engine", **{f"{self.schema}_{p}": p for p in PARTICIPANTS}}

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

    def _kafka_requests(
        self, n: int, wall: float | None, stats0: dict[str, Any], stats1: dict[str, Any]
    ) -> dict[str, Any]:
        """Requests every process of the pipeline (the driver included) sent over the
        load, by API and by process."""
        by_role: dict[str, int] = {}
        by_api: dict[str, int] = {}
        for role in [*self.roles, "driver"]:
            before = stats0.get(role, {}).get("kafka_requests") or {}
            after = stats1.get(role, {}).get("kafka_requests") or {}
            for api in after:
                d = after[api] - before.get(api, 0)
                if d:
                    by_api[api] = by_api.get(api, 0) + d
                    by_role[role] = by_role.get(role, 0) + d
        total = sum(by_api.values())

        def per_saga(x: int) -> float | None:
            return round(x / n, 3) if n else None

        return {
            "total": total,
            "per_saga": per_saga(total),
            "per_s": round(total / wall, 1) if wall else None,
            "by_api_per_saga": {k: per_saga(v) for k, v in bare.group_requests(by_api).items()},
            "by_role_per_saga": {k: per_saga(v) for k, v in sorted(by_role.items())},
            "by_api": dict(sorted(by_api.items(), key=lambda kv: -kv[1])),
        }

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
        driver_xacts: int,
    ) -> dict[str, Any]:
        cfg = self.cfg
        n = timings["completed"]

        def cpu_delta(role: str) -> float | None:
            a, b = cpu0.get(role), cpu1.get(role)
            return round(b - a, 3) if a is not None and b is not None else None

        def per_saga_ms(seconds: float | None) -> float | None:
            return round(1000 * seconds / n, 3) if seconds is not None and n else None

        engine_cpu = cpu_delta("engine")
        part_cpu = {p: cpu_delta(f"participant-{p}") for p in PARTICIPANTS}
        part_total = (
            round(sum(v for v in part_cpu.values() if v is not None), 3)
            if all(v is not None for v in part_cpu.values())
            else None
        )
        others = {k: cpu_delta(k) for k in ("kafka", "postgres_all", "bench")}
        total_cpu = sum(v for v in [engine_cpu, part_total, *others.values()] if v is not None)
        busy_d = (cpu1.get("machine.busy") or 0) - (cpu0.get("machine.busy") or 0)
        total_d = (cpu1.get("machine.total") or 0) - (cpu0.get("machine.total") or 0)
        busy_frac = busy_d / total_d if total_d > 0 else None
        wall = timings["wall_s"] or None
        pg_delta = {k: pg1[k] - pg0[k] for k in pg0}
        pipeline_xacts = pg_delta["xact_commit"] - driver_xacts
        kafka_requests = self._kafka_requests(n, wall, stats0, stats1)
        return {
            "pipeline": self.pipeline,
            "settings": {
                "concurrency": cfg.concurrency,
                "load_seconds": cfg.load_s,
                "fetch_max_wait_ms": cfg.fetch_max_wait_ms,
                "partitions": cfg.partitions,
                "warmup_sagas": cfg.warmup,
                "probe_sagas": cfg.probe,
                "poll_ms": cfg.poll_s * 1000,
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
            "other_cpu_s": others,
            "engine_cpu_ms_per_saga": per_saga_ms(engine_cpu),
            "participant_cpu_ms_per_saga": per_saga_ms(part_total),
            "kafka_cpu_ms_per_saga": per_saga_ms(others["kafka"]),
            "postgres_cpu_ms_per_saga": per_saga_ms(others["postgres_all"]),
            "bench_cpu_ms_per_saga": per_saga_ms(others["bench"]),
            "cpu_total_ms_per_saga": round(1000 * total_cpu / n, 3) if n else None,
            "machine_cpu_busy_fraction": round(busy_frac, 3) if busy_frac is not None else None,
            "cpu_user_sys_s": {
                role: [cpu_delta(f"{role}.user"), cpu_delta(f"{role}.sys")] for role in self.roles
            },
            "kafka_requests_per_saga": kafka_requests["per_saga"],
            "kafka_requests": kafka_requests,
            "pg_transactions_per_saga": round(pipeline_xacts / n, 3) if n else None,
            "pg_transactions": {
                "xact_commit_delta": pg_delta["xact_commit"],
                "driver_transactions": driver_xacts,
                "pipeline_transactions": pipeline_xacts,
                "per_s": round(pipeline_xacts / wall, 1) if wall else None,
            },
            "pg_wal_records_per_saga": round(pg_delta["wal_records"] / n, 1) if n else None,
            "pg_wal_bytes_per_saga": round(pg_delta["wal_bytes"] / n) if n else None,
            "pg_rows_per_saga": _rows_per_saga(pg_delta, n),
            "pg_db_wide_delta": {
                **{k: v for k, v in pg_delta.items() if not k.startswith("rows.")},
                "note": "the whole database (xact_*) and cluster (wal_*) over the load and "
                f"{PG_STATS_FLUSH_S:g}s after it; other clients of the server count too",
            },
            **self.extra_report(n, wall, stats0, stats1, final),
            **self.load_report(n, cpu0, cpu1, pg_delta),
        }


class EngineRun(PipelineRun):
    """The saga engine: ``bench.app`` processes, sagas started through ``SagaClient``."""

    pipeline = "engine"
    module = "bench.app"
    done_statuses = DONE_STATUSES

    def __init__(
        self, cfg: RunConfig, res: Resources, procs: Processes, logs: Path, tag: str
    ) -> None:
        super().__init__(cfg, res, procs, logs, tag)
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
        self.client: SagaClient | None = None

    def topic_names(self) -> list[str]:
        topics = Topics.of(self.settings.kafka)
        return [topics.inbox, topics.dlq, *(topics.commands(p) for p in PARTICIPANTS)]

    async def open_starter(self) -> None:
        self.client = SagaClient(self.settings, source="/bench")
        await self.client.start_client()

    async def close_starter(self) -> None:
        for task in self._pending:
            task.cancel()
        self._pending.clear()
        if self.client is not None:
            await self.client.close()
            self.client = None

    async def _event_rows(
        self, conn: asyncpg.Connection[Any], ids: list[str]
    ) -> list[asyncpg.Record]:
        """The events of the sagas ``ids`` that ``timings`` reads, each saga's in order."""
        return await conn.fetch(EVENT_ROWS_SQL, ids)

    async def start_one(self, saga_id: str) -> None:
        assert self.client is not None
        self._pending.append(
            asyncio.get_running_loop().create_task(
                self.client.start(SAGA_NAME, {"amount": 1}, saga_id=saga_id)
            )
        )

    async def timings(
        self, conn: asyncpg.Connection[Any], sent: dict[str, float]
    ) -> dict[str, Any]:
        """Per-saga latency from the events' timestamps (see README: what is measured)."""
        ids = list(sent)
        rows = await self._event_rows(conn, ids)
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

    def extra_report(
        self,
        n: int,
        wall: float | None,
        stats0: dict[str, dict[str, Any]],
        stats1: dict[str, dict[str, Any]],
        final: dict[str, dict[str, Any] | None],
    ) -> dict[str, Any]:
        gc0 = stats0["engine"].get("group_commit") or {}
        gc1 = stats1["engine"].get("group_commit") or {}
        batches = gc1.get("batches", 0) - gc0.get("batches", 0)
        operations = gc1.get("operations", 0) - gc0.get("operations", 0)
        engine_final = final.get("engine") or {}
        return {
            "engine_group_commit": {
                "enabled": self.cfg.group_commit,
                "max_batch": gc1.get("max_batch"),
                "batches": batches,
                "operations": operations,
                "avg_batch": round(operations / batches, 2) if batches else None,
                "largest_batch_whole_run": gc1.get("largest_batch"),
                "transactions_per_saga": round(batches / n, 3) if n else None,
                "transactions_per_s": round(batches / wall, 1) if wall else None,
            },
            "engine_counters": stats1["engine"].get("engine"),
            "engine_counters_final": engine_final.get("engine"),
            "dead_lettered": engine_final.get(
                "dead_lettered", stats1["engine"].get("dead_lettered")
            ),
            "participant_counters": {
                p: stats1[f"participant-{p}"].get("participant") for p in PARTICIPANTS
            },
            "profiled": f"{self.cfg.profile_role} ({self.cfg.profile_clock} clock)"
            if self.cfg.profile is not None
            else False,
        }


class BareRun(PipelineRun):
    """The bare pipeline: ``bench.bare`` processes, start records produced directly."""

    pipeline = "bare"
    module = "bench.bare"
    done_statuses = ["completed"]

    def __init__(
        self, cfg: RunConfig, res: Resources, procs: Processes, logs: Path, tag: str
    ) -> None:
        super().__init__(cfg, res, procs, logs, tag)
        self.producer: Any = None
        self.inbox = bare.inbox_topic(self.prefix)

    def topic_names(self) -> list[str]:
        return bare.topics(self.prefix)

    async def open_starter(self) -> None:
        self.producer = bare.make_producer(self.res.bootstrap)
        await self.producer.start()

    async def close_starter(self) -> None:
        self._pending.clear()
        if self.producer is not None:
            await self.producer.stop()
            self.producer = None

    async def start_one(self, saga_id: str) -> None:
        fut = await self.producer.send(self.inbox, bare.start_record(saga_id), key=saga_id.encode())
        self._pending.append(fut)

    async def timings(
        self, conn: asyncpg.Connection[Any], sent: dict[str, float]
    ) -> dict[str, Any]:
        """Latency from the ``sagas`` row: start sent -> ``completed_at``
        (``clock_timestamp()`` in the batch transaction that marked it)."""
        ids = list(sent)
        rows = await conn.fetch(
            """
            SELECT saga_id, extract(epoch FROM created_at)::float8 AS created,
                   extract(epoch FROM completed_at)::float8 AS done
            FROM sagas WHERE saga_id = ANY($1::text[]) AND status = 'completed'
            """,
            ids,
        )
        total = [r["done"] - sent[r["saga_id"]] for r in rows]
        inbox = [r["created"] - sent[r["saga_id"]] for r in rows]
        first_sent = min(sent.values()) if sent else 0.0
        last_end = max((r["done"] for r in rows), default=0.0)
        wall = last_end - first_sent if rows else 0.0
        return {
            "completed": len(rows),
            "wall_s": round(wall, 3),
            "sagas_per_s": round(len(rows) / wall, 2) if wall > 0 else None,
            "latency_ms": dist(total),
            "breakdown_ms": {"start_to_engine": dist(inbox)},
        }

    def extra_report(
        self,
        n: int,
        wall: float | None,
        stats0: dict[str, dict[str, Any]],
        stats1: dict[str, dict[str, Any]],
        final: dict[str, dict[str, Any] | None],
    ) -> dict[str, Any]:
        def delta(role: str) -> dict[str, float]:
            a = stats0[role].get("counters") or {}
            b = stats1[role].get("counters") or {}
            out: dict[str, float] = {k: v - a.get(k, 0) for k, v in b.items()}
            if out.get("batches"):
                out["avg_batch"] = round(out.get("records", 0) / out["batches"], 2)
            return out

        return {"bare_counters": {role: delta(role) for role in self.roles}}


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
    ap.add_argument(
        "--load-seconds",
        type=float,
        default=30.0,
        help="how long each measured load keeps starting sagas",
    )
    ap.add_argument(
        "--points",
        type=int,
        nargs="+",
        default=[64, 512],
        help="sagas in flight, one measured load per value and pipeline (the largest "
        "is the headline)",
    )
    ap.add_argument(
        "--pipelines",
        nargs="+",
        choices=["engine", "bare"],
        default=["engine", "bare"],
        help="which pipelines to measure at each point",
    )
    ap.add_argument("--warmup", type=int, default=20, help="sagas run before measuring")
    ap.add_argument("--probe", type=int, default=20, help="sagas run one at a time (idle latency)")
    ap.add_argument("--fetch-max-wait-ms", type=int, default=20)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--no-group-commit", action="store_true", help="engine writes one op per txn")
    ap.add_argument(
        "--no-uvloop", action="store_true", help="engine pipeline on asyncio's own event loop"
    )
    ap.add_argument(
        "--peer-concurrency",
        type=int,
        nargs="*",
        default=[8, 64],
        help="DBOS peer runs, one per value (none: skip)",
    )
    ap.add_argument("--peer-workflows", type=int, default=500, help="workflows per peer run")
    ap.add_argument("--ceiling-seconds", type=float, default=3.0)
    ap.add_argument("--ceiling-connections", type=int, default=16)
    ap.add_argument(
        "--drain-timeout",
        type=float,
        default=120.0,
        help="limit for the sagas of a load to finish once it stops starting them",
    )
    ap.add_argument("--start-timeout", type=float, default=60.0)
    ap.add_argument("--poll-ms", type=float, default=20.0, help="completion polling interval")
    ap.add_argument("--max-seconds", type=float, default=900.0, help="limit for the whole run")
    ap.add_argument(
        "--profile",
        type=Path,
        help="cProfile the engine pipeline's --profile-role during the headline load, to PATH",
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
    ap.add_argument(
        "--wal-breakdown",
        action="store_true",
        help="read each load's WAL with pg_walinspect, by relation and record kind "
        "(pg_wal_breakdown)",
    )
    ap.add_argument("--keep", action="store_true", help="keep schemas, topics and logs")
    ap.add_argument("--json-out", type=Path, help="also write the JSON result to this file")
    args = ap.parse_args(argv)
    if args.load_seconds <= 0:
        ap.error("--load-seconds must be positive")
    if min(args.points) < 1:
        ap.error("--points must be at least 1")
    return args


def machine() -> dict[str, Any]:
    return {
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "loadavg_at_start": loadavg(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


#: The figures of a run repeated in its point's summary (the rest stays in the run).
SUMMARY_KEYS = (
    "sagas",
    "sagas_per_s",
    "latency_ms",
    "idle_latency_ms",
    "cpu_total_ms_per_saga",
    "engine_cpu_ms_per_saga",
    "participant_cpu_ms_per_saga",
    "kafka_cpu_ms_per_saga",
    "postgres_cpu_ms_per_saga",
    "bench_cpu_ms_per_saga",
    "kafka_requests_per_saga",
    "pg_transactions_per_saga",
    "pg_wal_records_per_saga",
    "pg_wal_bytes_per_saga",
    "machine_cpu_busy_fraction",
)


def point_summary(
    concurrency: int,
    engine: dict[str, Any] | None,
    bare_run: dict[str, Any] | None,
    peer: dict[str, Any],
    ceiling: dict[str, Any],
    cpus: int,
) -> dict[str, Any]:
    """One concurrency point: the engine's figures at the top, the bare pipeline's under
    ``bare``, the ratios, then both runs in full."""
    e = engine or {}
    b = bare_run or {}
    best_peer: dict[str, Any] = peer.get("best") or {}
    same_peer: dict[str, Any] = next(
        (r for r in peer.get("runs", []) if r["concurrency"] == concurrency), {}
    )
    per_saga = e.get("cpu_total_ms_per_saga")
    cpu_bound = cpus * 1000 / per_saga if per_saga else None
    python_cpu_ms = (
        (e.get("engine_cpu_ms_per_saga") or 0) + (e.get("participant_cpu_ms_per_saga") or 0)
        if engine
        else None
    )

    def summary(run: dict[str, Any]) -> dict[str, Any]:
        out = {k: run.get(k) for k in SUMMARY_KEYS}
        out["kafka_requests_by_api_per_saga"] = (run.get("kafka_requests") or {}).get(
            "by_api_per_saga"
        )
        return out

    return {
        "concurrency": concurrency,
        **summary(e),
        "bare": summary(b),
        "ratio": {
            # < 1: slower than the hand-written batched pipeline on the same stack.
            "sagas_per_s_vs_bare": ratio(e.get("sagas_per_s"), b.get("sagas_per_s")),
            # > 1: more CPU per saga (all processes, broker and Postgres) than bare.
            "cpu_per_saga_vs_bare": ratio(per_saga, b.get("cpu_total_ms_per_saga")),
            "kafka_requests_per_saga_vs_bare": ratio(
                e.get("kafka_requests_per_saga"), b.get("kafka_requests_per_saga")
            ),
            "pg_transactions_per_saga_vs_bare": ratio(
                e.get("pg_transactions_per_saga"), b.get("pg_transactions_per_saga")
            ),
            # > 1: faster than the peer at its best; its steps stay in-process.
            "sagas_per_s_vs_peer_workflows_per_s": ratio(
                e.get("sagas_per_s"), best_peer.get("workflows_per_s")
            ),
            "bare_sagas_per_s_vs_peer_workflows_per_s": ratio(
                b.get("sagas_per_s"), best_peer.get("workflows_per_s")
            ),
            # The peer with as many workflows in flight (when it ran at this number).
            "sagas_per_s_vs_peer_same_concurrency": ratio(
                e.get("sagas_per_s"), same_peer.get("workflows_per_s")
            ),
            # < 1: less CPU in the engine and participant processes together than in
            # the peer's one process, per transaction.
            "python_cpu_ms_per_saga_vs_peer": ratio(
                python_cpu_ms, best_peer.get("cpu_ms_per_workflow")
            ),
            "sagas_per_s_vs_single_insert": ratio(
                e.get("sagas_per_s"), ceiling["pg_single_insert_per_s"]
            ),
            "sagas_per_s_vs_concurrent_insert": ratio(
                e.get("sagas_per_s"), ceiling["pg_concurrent_insert_per_s"]
            ),
            "sagas_per_s_vs_cpu_bound_estimate": ratio(e.get("sagas_per_s"), cpu_bound),
        },
        "cpu_bound_sagas_per_s_estimate": round(cpu_bound, 1) if cpu_bound else None,
        "engine_run": engine,
        "bare_run": bare_run,
    }


async def run_pipeline(run: PipelineRun, *, keep: bool) -> dict[str, Any]:
    """One pipeline's run; then its processes stopped and (unless ``keep``) what it
    created removed, whatever happened (the processes' log tails shown on failure)."""
    try:
        return await run.run()
    except BaseException:
        for proc in run.procs.procs.values():
            say(f"--- {proc.role} log tail:\n{tail(proc.log)}")
        raise
    finally:
        run.procs.stop_all()
        if not keep:
            await cleanup(run.res)


async def bench(args: argparse.Namespace, res: Resources, procs: Processes, logs: Path) -> Any:
    date = datetime.now(UTC).isoformat(timespec="seconds")
    run_id = uuid.uuid4().hex[:8]
    host = machine()
    bare.count_kafka_requests()
    ceiling_schema = f"bench_{run_id}_ceiling"
    res.schemas.append(ceiling_schema)
    say(
        f"ceiling: {args.ceiling_seconds:g}s sequential + {args.ceiling_seconds:g}s on "
        f"{args.ceiling_connections} connections"
    )
    ceiling = await measure_ceiling(
        res.dsn, ceiling_schema, args.ceiling_seconds, args.ceiling_connections
    )
    say(
        f"ceiling: {ceiling['pg_single_insert_per_s']:.0f} commits/s sequential, "
        f"{ceiling['pg_concurrent_insert_per_s']:.0f} concurrent"
    )
    peer: dict[str, Any] = (
        await measure_peer(res, run_id, args.peer_workflows, args.peer_concurrency)
        if args.peer_concurrency
        else {"skipped": "--peer-concurrency given no values"}
    )
    if not args.keep:
        await cleanup(res)
    headline = max(args.points)
    points: dict[str, dict[str, Any]] = {}
    for i, concurrency in enumerate(args.points):
        runs: dict[str, dict[str, Any]] = {}
        for kind in args.pipelines:
            profiling = args.profile is not None and kind == "engine" and concurrency == headline
            cfg = RunConfig(
                concurrency=concurrency,
                load_s=args.load_seconds,
                warmup=args.warmup,
                probe=args.probe,
                partitions=args.partitions,
                fetch_max_wait_ms=args.fetch_max_wait_ms,
                group_commit=not args.no_group_commit,
                uvloop=not args.no_uvloop,
                drain_timeout_s=args.drain_timeout,
                start_timeout_s=args.start_timeout,
                poll_s=args.poll_ms / 1000,
                profile=args.profile.resolve() if profiling else None,
                profile_clock=args.profile_clock,
                profile_role=args.profile_role,
                idle_s=args.idle_seconds,
                wal_breakdown=args.wal_breakdown,
            )
            cls = EngineRun if kind == "engine" else BareRun
            result = await run_pipeline(
                cls(cfg, res, procs, logs, f"{run_id}{i}{kind[0]}"), keep=args.keep
            )
            say(
                f"{kind} at {concurrency}: {result['sagas']} sagas at {result['sagas_per_s']}/s, "
                f"latency p50 {result['latency_ms'].get('p50')} ms, idle p50 "
                f"{(result['idle_latency_ms'] or {}).get('p50')} ms, CPU "
                f"{result['cpu_total_ms_per_saga']} ms/saga, Kafka requests "
                f"{result['kafka_requests_per_saga']}/saga, Postgres transactions "
                f"{result['pg_transactions_per_saga']}/saga"
            )
            runs[kind] = result
        points[str(concurrency)] = point_summary(
            concurrency, runs.get("engine"), runs.get("bare"), peer, ceiling, host["cpus_usable"]
        )
    head = points[str(headline)]
    out: dict[str, Any] = {
        "benchmark": "e2e-3-step-saga",
        "date": date,
        "machine": host,
        "headline_point": str(headline),
        **{k: v for k, v in head.items() if k not in ("engine_run", "bare_run")},
        "points": points,
        "ceiling": ceiling,
        "peer": peer,
        "settings": {
            "load_seconds": args.load_seconds,
            "points": args.points,
            "pipelines": args.pipelines,
            "fetch_max_wait_ms": args.fetch_max_wait_ms,
            "partitions": args.partitions,
            "group_commit": not args.no_group_commit,
            "uvloop": not args.no_uvloop,
            "warmup_sagas": args.warmup,
            "probe_sagas": args.probe,
            "poll_ms": args.poll_ms,
            "peer_concurrency": args.peer_concurrency,
            "peer_workflows": args.peer_workflows,
        },
    }
    if args.profile and "engine" in args.pipelines:
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


BenchFn = Callable[[argparse.Namespace, Resources, Processes, Path], Awaitable[Any]]


def run_bench(
    args: argparse.Namespace,
    bench_fn: BenchFn,
    *,
    log_prefix: str,
    extra: dict[str, Any] | None = None,
) -> int:
    """Runs one benchmark (``bench_fn``) within ``--max-seconds`` on the dev stack's
    servers, then prints its JSON (with ``extra``) and writes ``--json-out``. Whatever it
    started is stopped and, unless ``--keep``, its schemas, topics and logs removed; a
    failure shows the processes' log tails and keeps their logs."""
    settings = Settings()
    res = Resources(settings.pg.dsn.get_secret_value(), settings.kafka.bootstrap_servers)
    procs = Processes()
    logs = Path(tempfile.mkdtemp(prefix=log_prefix))
    result: Any = None
    ok = False
    with _handle_sigterm():
        try:

            async def bounded() -> Any:
                async with asyncio.timeout(args.max_seconds):
                    return await bench_fn(args, res, procs, logs)

            result = asyncio.run(bounded())
            ok = result is not None
        except (BenchError, TimeoutError) as exc:
            say(f"FAILED: {exc or f'no result within --max-seconds {args.max_seconds:g}'}")
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
    if not ok:
        return 1
    text = json.dumps({**result, **(extra or {})}, indent=2)
    if args.json_out:
        args.json_out.write_text(text + "\n")
    print(text)
    return 0


def main(argv: list[str]) -> int:
    return run_bench(parse_args(argv), bench, log_prefix="saga-bench-")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
