"""One Postgres cluster against two (a sharded store), the same engine and participants
and the same load, side by side in one run (issue 43).

    python -m bench.shards [--in-flight 512] [--load-seconds 30] [--rounds 2] [--quick]

Needs Postgres and Kafka with a second cluster: ``SAGA_DEV_PG_CLUSTERS=2 make up`` (it
prints ``SAGA_DEV_PG_SHARD_DSNS``; ``--second-cluster`` names another server). Each round
runs bench/e2e.py's engine pipeline twice, in this order (A B A B ...):

- ``one``: as bench/e2e.py runs it: the store in ``SAGA_PG__DSN``'s database (cluster 1);
- ``two``: the store sharded by inbox partition (``SAGA_PG__SHARDS``): shard ``a`` holds
  the first half of the partitions in a database of its own on cluster 1, shard ``b``
  the second half in one on cluster 2; the control database is ``SAGA_PG__DSN``'s.

The participants' databases are where bench/e2e.py puts them in both: schemas of
``SAGA_PG__DSN``'s database, on cluster 1. Over each load, besides bench/e2e.py's
figures: each cluster's CPU (its postmaster and that one's children, so that other
clusters on the machine are left out) and WAL. Progress goes to stderr; stdout gets one
JSON object. See bench/README.md for the fields.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from bench import bare
from bench.e2e import (
    DONE_SQL,
    EVENT_ROWS_SQL,
    BenchError,
    EngineRun,
    Processes,
    Resources,
    RunConfig,
    engine_config,
    machine,
    pg_counters,
    postgres_processes,
    ratio,
    run_bench,
    run_pipeline,
    say,
)
from saga_engine.protocol import partition_for

MODES = ("one", "two")
#: The figures of a run each mode reports (the median over the rounds), and their ratio.
FIGURES = (
    "sagas_per_s",
    "engine_cpu_ms_per_saga",
    "participant_cpu_ms_per_saga",
    "postgres_cpu_ms_per_saga",
    "postgres_cpu_ms_per_saga_without_driver",
    "postgres_cpu_ms_per_saga_machine",
    "kafka_cpu_ms_per_saga",
    "cpu_total_ms_per_saga",
    "pg_wal_records_per_saga",
    "pg_wal_bytes_per_saga",
    "pg_transactions_per_saga",
    "latency_p50_ms",
    "machine_cpu_busy_fraction",
)
#: The figures given per cluster, or per role, too.
SPLITS = (
    "postgres_cpu_ms_per_saga_by_cluster",
    "postgres_cpu_ms_per_saga_by_role",
    "pg_wal_records_per_saga_by_cluster",
)
#: What --quick changes (unless given).
QUICK = {"load_seconds": 5.0, "rounds": 1, "probe": 5}
DEFAULTS = {"load_seconds": 30.0, "rounds": 2, "probe": 20}


@dataclass(frozen=True)
class Cluster:
    """A Postgres cluster of the run: ``dsn`` an address of one of its databases, and its
    postmaster's pid (its processes are that one and its children)."""

    name: str
    dsn: str
    postmaster: int


@dataclass(frozen=True)
class Shard:
    name: str
    cluster: Cluster
    partitions: range

    @property
    def ranges(self) -> str:
        return f"{self.partitions.start}-{self.partitions.stop - 1}"


#: Postgres's own processes, by the start of their title (``postgres: checkpointer``);
#: any other child of the postmaster is a client's backend.
BACKGROUND = (
    "checkpointer",
    "background writer",
    "walwriter",
    "autovacuum",
    "logical replication",
    "archiver",
    "stats collector",
)


def process_kind(pid: int, postmaster: int) -> str:
    """``postmaster``, ``backends`` or the background process's kind (``autovacuum``...)."""
    if pid == postmaster:
        return "postmaster"
    try:
        title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return "backends"
    rest = title.removeprefix("postgres: ")
    return next((kind for kind in BACKGROUND if rest.startswith(kind)), "backends")


def cluster_processes(clusters: Sequence[Cluster]) -> dict[str, float]:
    """CPU seconds of the clusters' processes (their postmasters and those ones'
    children; other clusters on the machine are left out), in one walk of /proc: per
    cluster (``postgres.<cluster>``), per process kind (``postgres_kind.<cluster>.<kind>``)
    and per client backend (``pgpid.<cluster>.<pid>``)."""
    of_pid = {c.postmaster: c for c in clusters}
    out = {f"postgres.{c.name}": 0.0 for c in clusters}
    for pid, ppid, cpu in postgres_processes():
        cluster = of_pid.get(pid) or of_pid.get(ppid)
        if cluster is None:
            continue
        kind = process_kind(pid, cluster.postmaster)
        out[f"postgres.{cluster.name}"] += cpu
        key = f"postgres_kind.{cluster.name}.{kind}"
        out[key] = out.get(key, 0.0) + cpu
        if kind == "backends":
            out[f"pgpid.{cluster.name}.{pid}"] = cpu
    return out


def with_database(dsn: str, database: str) -> str:
    """``dsn`` pointed at another database of the same server."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path=f"/{database}"))


def with_application(dsn: str, name: str) -> str:
    """``dsn`` whose connections are called ``name`` (``application_name``, which
    ``pg_stat_activity`` shows: whose backend is whose)."""
    parts = urlsplit(dsn)
    query = "&".join(q for q in (parts.query, f"application_name={name}") if q)
    return urlunsplit(parts._replace(query=query))


#: The ``application_name`` of the connections of the engine, of the participants and
#: of the driver (the benchmark itself: completion polls, counters).
APPLICATIONS = {"engine": "bench-engine", "participants": "bench-participants"}
DRIVER = "bench-driver"
#: Whose the clusters' CPU is: each client's backends (``gone``: ended before the load's
#: last counter read, whoever's they were), and ``background``: the postmasters and
#: Postgres's own processes (checkpointer, WAL writer, autovacuum...).
ROLES = ("engine", "participants", "driver", "gone", "background")


def parent_pid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


async def find_cluster(name: str, dsn: str) -> Cluster:
    """The cluster ``dsn`` is on: its postmaster is the parent of our backend (the
    benchmark runs on the machine of its servers, as bench/e2e.py's CPU figures need)."""
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        backend = int(await conn.fetchval("SELECT pg_backend_pid()"))
        # Read while the backend lives: it exits when the connection closes.
        try:
            postmaster = parent_pid(backend)
        except OSError:
            raise BenchError(
                f"cluster {name}'s processes are not on this machine (backend pid {backend} "
                "is not in /proc): the benchmark measures its servers' CPU and needs them local"
            ) from None
    finally:
        await conn.close()
    return Cluster(name, dsn, postmaster)


class ClusterRun(EngineRun):
    """bench/e2e.py's engine pipeline (``EngineRun``) with each cluster of the run
    measured on its own over the load: its processes' CPU and its WAL (read on its
    ``postgres`` database, so that those reads are no pipeline database's transactions).
    The store is in ``SAGA_PG__DSN``'s database, as bench/e2e.py has it."""

    mode = "one"

    def __init__(
        self,
        cfg: RunConfig,
        res: Resources,
        procs: Processes,
        logs: Path,
        tag: str,
        clusters: Sequence[Cluster],
    ) -> None:
        super().__init__(cfg, res, procs, logs, tag)
        self.clusters = list(clusters)
        self._admin: dict[str, asyncpg.Connection[Any]] = {}
        #: The shards' databases (none here), each on its own connection.
        self._shard_conns: dict[str, asyncpg.Connection[Any]] = {}
        #: Whose each backend is: (cluster, pid) -> the client's application_name.
        self._clients: dict[tuple[str, int], str] = {}

    def layout(self) -> dict[str, Any]:
        return {
            "store": "cluster 1: SAGA_PG__DSN's database",
            "participants": "cluster 1: SAGA_PG__DSN's database, a schema each",
        }

    async def _open_shards(self) -> None:
        """Creates and opens the shards' databases (none: the store is not sharded)."""

    async def run(self) -> dict[str, Any]:
        try:
            for c in self.clusters:
                self._admin[c.name] = await asyncpg.connect(
                    with_database(c.dsn, "postgres"),
                    timeout=10,
                    server_settings={"application_name": DRIVER},
                )
            await self._open_shards()
            # The first counter read's statements in each database it reads.
            self.counter_read_transactions = 2 * (1 + len(self._shard_conns))
            report = await super().run()
        finally:
            for conn in [*self._admin.values(), *self._shard_conns.values()]:
                await conn.close()
        report["mode"] = self.mode
        report["layout"] = self.layout()
        return report

    async def _pg_counters(self, conn: asyncpg.Connection[Any]) -> dict[str, int]:
        """bench/e2e.py's counters of the driver's database, plus each shard database's
        transactions and rows, and each cluster's WAL (``cluster_<name>.wal_*``; the
        ``wal_*`` figures are their sums)."""
        out = await pg_counters(conn, self.schema)
        for shard_conn in self._shard_conns.values():
            for key, value in (await pg_counters(shard_conn, self.schema)).items():
                if key == "xact_commit" or key.startswith("rows."):
                    out[key] = out.get(key, 0) + value
        for kind in ("wal_records", "wal_bytes", "wal_sync"):
            out[kind] = 0
        for name, admin in self._admin.items():
            for r in await admin.fetch(
                "SELECT pid, application_name FROM pg_stat_activity "
                "WHERE backend_type = 'client backend'"
            ):
                self._clients[name, int(r["pid"])] = r["application_name"] or DRIVER
            wal = await admin.fetchrow("SELECT wal_records, wal_bytes, wal_sync FROM pg_stat_wal")
            assert wal is not None
            for kind in ("wal_records", "wal_bytes", "wal_sync"):
                out[f"cluster_{name}.{kind}"] = int(wal[kind])
                out[kind] += int(wal[kind])
        return out

    def _env(self, **extra: str) -> dict[str, str]:
        """bench/e2e.py's, each process's connections named (``APPLICATIONS``)."""
        return super()._env(
            **{
                "SAGA_PG__DSN": with_application(self.res.dsn, APPLICATIONS["engine"]),
                "SAGA_PARTICIPANT__DSN": with_application(
                    self.res.dsn, APPLICATIONS["participants"]
                ),
                **extra,
            }
        )

    def _cpu(self) -> dict[str, float | None]:
        out = super()._cpu()
        out.update(cluster_processes(self.clusters))
        return out

    def load_report(
        self,
        n: int,
        cpu0: dict[str, float | None],
        cpu1: dict[str, float | None],
        pg_delta: dict[str, int],
    ) -> dict[str, Any]:
        """``postgres_cpu_ms_per_saga`` is this run's clusters' (bench/e2e.py's, every
        postgres process on the machine, is ``..._machine``), also per cluster, per
        process kind and per client; the WAL per cluster."""

        def per_saga(delta: float | None, scale: float = 1000, digits: int = 3) -> float | None:
            return round(scale * delta / n, digits) if n and delta is not None else None

        def delta(key: str) -> float:
            """The key's growth over the load; a process that started within it counts
            from zero, one that ended within it not at all (an autovacuum worker: the
            sums per cluster are what the CPU was, the rest shows where it went)."""
            return (cpu1.get(key) or 0.0) - (cpu0.get(key) or 0.0) if key in cpu1 else 0.0

        def grouped(prefix: str, name: Callable[[str], str]) -> dict[str, float]:
            out: dict[str, float] = {}
            for key in cpu1:
                if key.startswith(prefix):
                    group = name(key.removeprefix(prefix))
                    out[group] = out.get(group, 0.0) + delta(key)
            return dict(sorted(out.items()))

        def client(cluster_pid: str) -> str:
            cluster, pid = cluster_pid.split(".")
            app = self._clients.get((cluster, int(pid)), "gone")
            return f"{cluster}.{app.removeprefix('bench-')}"

        by_cluster = {c.name: delta(f"postgres.{c.name}") for c in self.clusters}
        by_client = grouped("pgpid.", client)
        by_role = dict.fromkeys(ROLES, 0.0)
        for key, seconds in by_client.items():
            by_role[key.split(".", 1)[1]] += seconds
        by_role["background"] = sum(by_cluster.values()) - sum(by_client.values())
        return {
            "postgres_cpu_ms_per_saga": per_saga(sum(by_cluster.values())),
            "postgres_cpu_ms_per_saga_without_driver": per_saga(
                sum(by_cluster.values()) - by_role["driver"]
            ),
            "postgres_cpu_ms_per_saga_machine": per_saga(delta("postgres_all")),
            "postgres_cpu_ms_per_saga_by_cluster": {k: per_saga(v) for k, v in by_cluster.items()},
            "postgres_cpu_ms_per_saga_by_role": {k: per_saga(v) for k, v in by_role.items()},
            "postgres_cpu_ms_per_saga_by_client": {k: per_saga(v) for k, v in by_client.items()},
            "postgres_cpu_ms_per_saga_by_kind": {
                k: per_saga(v) for k, v in grouped("postgres_kind.", str).items()
            },
            "pg_wal_records_per_saga_by_cluster": {
                c.name: per_saga(pg_delta[f"cluster_{c.name}.wal_records"], scale=1, digits=1)
                for c in self.clusters
            },
        }


class ShardedRun(ClusterRun):
    """The same, with the store sharded: shard ``a`` holds the first half of the inbox
    partitions, in a database made for the run on the first cluster, shard ``b`` the
    rest, on the second; the control database is ``SAGA_PG__DSN``'s. The driver's
    completion polls and reads go to each saga's shard."""

    mode = "two"

    @property
    def shards(self) -> dict[str, Shard]:
        """Shard ``a``: the first half of the partitions, on the first cluster; ``b``
        the rest, on the second."""
        half = self.cfg.partitions // 2
        return {
            "a": Shard("a", self.clusters[0], range(0, half)),
            "b": Shard("b", self.clusters[1], range(half, self.cfg.partitions)),
        }

    @property
    def database(self) -> str:
        """The shards' databases' name (on each shard's cluster): the run's schema's."""
        return self.schema

    def layout(self) -> dict[str, Any]:
        return {
            "shards": {
                s.name: {
                    "cluster": s.cluster.name,
                    "partitions": s.ranges,
                    "database": "one of its own, made for the run",
                }
                for s in self.shards.values()
            },
            "control": "cluster 1: SAGA_PG__DSN's database",
            "participants": "cluster 1: SAGA_PG__DSN's database, a schema each",
        }

    def _shard_dsn(self, shard: Shard) -> str:
        return with_database(shard.cluster.dsn, self.database)

    async def _open_shards(self) -> None:
        for shard in self.shards.values():
            conn = await asyncpg.connect(shard.cluster.dsn, timeout=10)
            try:
                await conn.execute(f'CREATE DATABASE "{self.database}"')
            finally:
                await conn.close()
            self.res.databases.append((shard.cluster.dsn, self.database))
            self._shard_conns[shard.name] = await asyncpg.connect(
                self._shard_dsn(shard),
                timeout=10,
                server_settings={"search_path": self.schema, "application_name": DRIVER},
            )

    def _env(self, **extra: str) -> dict[str, str]:
        engine = APPLICATIONS["engine"]
        shards = [
            {
                "name": s.name,
                "partitions": s.ranges,
                "dsn": with_application(self._shard_dsn(s), engine),
            }
            for s in self.shards.values()
        ]
        return super()._env(
            SAGA_PG__SHARDS=json.dumps(shards),
            SAGA_PG__CONTROL_DSN=with_application(self.res.dsn, engine),
            **extra,
        )

    def _by_shard(self, ids: Iterable[str]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for saga_id in ids:
            partition = partition_for(saga_id, self.cfg.partitions)
            name = next(s.name for s in self.shards.values() if partition in s.partitions)
            out.setdefault(name, []).append(saga_id)
        return out

    async def _on_shards(self, ids: Iterable[str], sql: str, *args: Any) -> list[Any]:
        """``sql`` on each shard with its sagas of ``ids`` (``$1``) and ``args``, at once."""
        return await self._on_groups(self._by_shard(ids), sql, *args)

    async def _on_groups(self, groups: dict[str, list[str]], sql: str, *args: Any) -> list[Any]:
        results = await asyncio.gather(
            *(self._shard_conns[name].fetch(sql, group, *args) for name, group in groups.items())
        )
        return [row for rows in results for row in rows]

    async def _done(self, conn: asyncpg.Connection[Any], ids: Iterable[str]) -> set[str]:
        """Which of ``ids`` are finished: one query per shard, at once (each its own
        transaction in its shard's database, counted as the driver's)."""
        groups = self._by_shard(ids)
        self.driver_queries += len(groups)
        rows = await self._on_groups(groups, DONE_SQL, self.done_statuses)
        return {r["saga_id"] for r in rows}

    async def _status_counts(self, conn: asyncpg.Connection[Any], ids: list[str]) -> dict[str, int]:
        counts: Counter[str] = Counter()
        for r in await self._on_shards(
            ids,
            "SELECT status, count(*) AS n FROM sagas WHERE saga_id = ANY($1::text[]) GROUP BY status",
        ):
            counts[r["status"]] += int(r["n"])
        return dict(counts)

    async def _event_rows(
        self, conn: asyncpg.Connection[Any], ids: list[str]
    ) -> list[asyncpg.Record]:
        return await self._on_shards(ids, EVENT_ROWS_SQL)


# --------------------------------------------------------------------------- the JSON


def figures(run: dict[str, Any]) -> dict[str, Any]:
    """A run's figures this benchmark reports."""
    out = {k: run.get(k) for k in FIGURES if k != "latency_p50_ms"}
    out["latency_p50_ms"] = (run.get("latency_ms") or {}).get("p50")
    out["sagas"] = run.get("sagas")
    for key in SPLITS:
        out[key] = run.get(key)
    return out


def _median(values: list[Any]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 4) if present else None


def mode_summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """A mode's figures over its rounds: the median of each (each part of a split too)."""
    out: dict[str, Any] = {k: _median([r.get(k) for r in rounds]) for k in FIGURES}
    out["sagas"] = sum(r.get("sagas") or 0 for r in rounds)
    for key in SPLITS:
        parts = dict.fromkeys(part for r in rounds for part in (r.get(key) or {}))
        out[key] = {p: _median([(r.get(key) or {}).get(p) for r in rounds]) for p in parts}
    return out


#: The split whose parts have ratios too (the clusters' have none: one has no second).
ROLE_SPLIT = "postgres_cpu_ms_per_saga_by_role"


def ratios(two: dict[str, Any], one: dict[str, Any]) -> dict[str, Any]:
    """Each figure of ``two`` over the same of ``one``; per role too."""
    out: dict[str, Any] = {k: ratio(two.get(k), one.get(k)) for k in FIGURES}
    roles_two, roles_one = two.get(ROLE_SPLIT) or {}, one.get(ROLE_SPLIT) or {}
    out[ROLE_SPLIT] = {r: ratio(roles_two.get(r), roles_one.get(r)) for r in roles_two}
    return out


def summarize(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """The modes' medians and their ratios, then each round's figures and ratios."""
    modes = {m: mode_summary([r[m] for r in rounds]) for m in MODES}
    return {
        **modes,
        "ratio_two_vs_one": ratios(modes["two"], modes["one"]),
        "rounds": [{**r, "ratio_two_vs_one": ratios(r["two"], r["one"])} for r in rounds],
    }


# --------------------------------------------------------------------------- main


def run_config(args: argparse.Namespace) -> RunConfig:
    return engine_config(args, load_s=args.load_seconds, probe=args.probe, idle_s=args.idle_seconds)


def second_cluster(args: argparse.Namespace) -> str:
    dsn: str | None = args.second_cluster or next(
        (d for d in os.environ.get("SAGA_DEV_PG_SHARD_DSNS", "").split(",") if d), None
    )
    if not dsn:
        raise BenchError(
            "no second Postgres cluster: start the stack with SAGA_DEV_PG_CLUSTERS=2 and "
            "export SAGA_DEV_PG_SHARD_DSNS as `make up` prints it, or pass --second-cluster"
        )
    return dsn


async def bench(args: argparse.Namespace, res: Resources, procs: Processes, logs: Path) -> Any:
    date = datetime.now(UTC).isoformat(timespec="seconds")
    run_id = uuid.uuid4().hex[:8]
    host = machine()
    bare.count_kafka_requests()
    clusters = [await find_cluster("1", res.dsn), await find_cluster("2", second_cluster(args))]
    if clusters[0].postmaster == clusters[1].postmaster:
        raise BenchError("--second-cluster is on the first cluster: give another server")
    cfg = run_config(args)
    rounds: list[dict[str, dict[str, Any]]] = []
    runs: dict[str, dict[str, Any]] = {}
    for i in range(args.rounds):
        this_round: dict[str, dict[str, Any]] = {}
        for mode, cls in zip(MODES, (ClusterRun, ShardedRun), strict=True):
            tag = f"{run_id}{i}{mode[0]}"
            result = await run_pipeline(cls(cfg, res, procs, logs, tag, clusters), keep=args.keep)
            say(
                f"round {i + 1}, {mode}: {result['sagas']} sagas at {result['sagas_per_s']}/s, "
                f"Postgres {result['postgres_cpu_ms_per_saga']} ms/saga "
                f"{result['postgres_cpu_ms_per_saga_by_cluster']}, engine "
                f"{result['engine_cpu_ms_per_saga']} ms/saga"
            )
            this_round[mode] = figures(result)
            runs[tag] = result
        rounds.append(this_round)
    layouts = {m: runs[f"{run_id}0{m[0]}"]["layout"] for m in MODES}
    return {
        "benchmark": "shards-3-step-saga",
        "date": date,
        "machine": host,
        "layout": layouts,
        **summarize(rounds),
        "not_measured": "the time a move of a range of 100,000 sagas takes, and how long "
        "its partitions are paused: bench/shard_move.py",
        "settings": {
            "in_flight": args.in_flight,
            "load_seconds": args.load_seconds,
            "rounds": args.rounds,
            "quick": args.quick,
            "partitions": args.partitions,
            "fetch_max_wait_ms": args.fetch_max_wait_ms,
            "warmup_sagas": args.warmup,
            "probe_sagas": args.probe,
            "poll_ms": args.poll_ms,
        },
        "runs": runs,
    }


def add_second_cluster(ap: argparse.ArgumentParser) -> None:
    """The option naming the second cluster (``second_cluster`` reads it)."""
    ap.add_argument(
        "--second-cluster",
        help="a database of the second cluster (default: the first of SAGA_DEV_PG_SHARD_DSNS)",
    )


def fill_defaults(
    args: argparse.Namespace, defaults: dict[str, Any], quick: dict[str, Any]
) -> None:
    """Each option of ``defaults`` not given: its ``quick`` value with ``--quick``, else its
    default."""
    for name, default in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick[name] if args.quick else default)


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.shards", description=__doc__.split("\n")[0])
    ap.add_argument("--in-flight", type=int, default=512, help="sagas kept unfinished")
    ap.add_argument("--load-seconds", type=float, help="each measured load (default 30, --quick 5)")
    ap.add_argument(
        "--rounds", type=int, help="rounds of one then two clusters (default 2, --quick 1)"
    )
    ap.add_argument("--quick", action="store_true", help="5 s loads, one round, 5 probe sagas")
    ap.add_argument("--partitions", type=int, default=8, help="inbox partitions (halved)")
    add_second_cluster(ap)
    ap.add_argument("--warmup", type=int, default=20, help="sagas run before measuring")
    ap.add_argument("--probe", type=int, help="sagas one at a time (default 20, --quick 5)")
    ap.add_argument("--idle-seconds", type=float, default=2.0)
    ap.add_argument("--fetch-max-wait-ms", type=int, default=20)
    ap.add_argument("--drain-timeout", type=float, default=120.0)
    ap.add_argument("--start-timeout", type=float, default=60.0)
    ap.add_argument("--poll-ms", type=float, default=20.0, help="completion polling interval")
    ap.add_argument("--max-seconds", type=float, default=1800.0, help="limit for the whole run")
    ap.add_argument("--keep", action="store_true", help="keep schemas, databases, topics, logs")
    ap.add_argument("--json-out", type=Path, help="also write the JSON result to this file")
    args = ap.parse_args(argv)
    fill_defaults(args, DEFAULTS, QUICK)
    if args.load_seconds <= 0:
        ap.error("--load-seconds must be positive")
    if args.rounds < 1 or args.in_flight < 1:
        ap.error("--rounds and --in-flight must be at least 1")
    if args.partitions < 2:
        ap.error("--partitions must be at least 2: each shard holds half")
    return args


def main(argv: list[str]) -> int:
    return run_bench(parse_args(argv), bench, log_prefix="saga-bench-shards-")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
