"""The peer: DBOS Transact (Python) doing the same shaped work on the same Postgres.

``python -m bench.peer_dbos --dsn DSN --schema S --workflows N --concurrency C`` runs N
workflows of three durable steps; each step writes one ledger row in its own
transaction (what a saga step's participant does in its own database), and DBOS
checkpoints each step's result and the workflow's status in its system tables (schema
``S``; the ledger is in ``S_ledger``). C workflows are in flight at once, as sagas are
in bench/e2e.py. It prints one JSON object: throughput, latency and this process's CPU.

DBOS runs everything in this one process, with no messaging between services; the saga
engine sends every step to another process over Kafka and back. So this peer does less
work per transaction than the saga benchmark: a fair bar to compare against.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from typing import Any

WARMUP = 20


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run(args: argparse.Namespace) -> dict[str, Any]:
    import sqlalchemy
    from dbos import DBOS, DBOSConfig
    from sqlalchemy import text

    url = args.dsn.replace("postgresql://", "postgresql+psycopg://", 1)
    ledger = f"{args.schema}_ledger"
    config: DBOSConfig = {
        "name": "saga-bench-peer",
        "system_database_url": args.dsn,
        "dbos_system_schema": args.schema,
        "sys_db_pool_size": args.concurrency + 4,
        "log_level": "WARNING",
    }
    DBOS(config=config)
    # The steps' own database: a pool as large as the work in flight, as the
    # participants in bench/e2e.py have theirs.
    app = sqlalchemy.create_engine(url, pool_size=args.concurrency, max_overflow=0)
    with app.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{ledger}"'))
        conn.execute(
            text(f'CREATE TABLE "{ledger}".ledger (command_id text PRIMARY KEY, n int NOT NULL)')
        )
    insert = text(f'INSERT INTO "{ledger}".ledger (command_id, n) VALUES (:c, :n)')

    @DBOS.step()
    def step(workflow_id: str, n: int) -> int:
        with app.begin() as conn:
            conn.execute(insert, {"c": f"{workflow_id}/{n}", "n": n})
        return n

    @DBOS.workflow()
    def three_steps(workflow_id: str) -> int:
        return step(workflow_id, 1) + step(workflow_id, 2) + step(workflow_id, 3)

    DBOS.launch()
    latencies: list[float] = []
    lock = threading.Lock()

    def one(_: int) -> None:
        started = time.perf_counter()
        three_steps(str(uuid.uuid4()))
        elapsed = time.perf_counter() - started
        with lock:
            latencies.append(elapsed)

    try:
        with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
            list(pool.map(one, range(WARMUP)))
            latencies.clear()
            cpu0, t0 = cpu_s(), time.perf_counter()
            list(pool.map(one, range(args.workflows)))
            wall, cpu = time.perf_counter() - t0, cpu_s() - cpu0
        with app.begin() as conn:
            rows = conn.execute(text(f'SELECT count(*) FROM "{ledger}".ledger')).scalar_one()
    finally:
        DBOS.destroy()
        app.dispose()
    if rows != 3 * (args.workflows + WARMUP):
        raise SystemExit(f"peer: expected {3 * (args.workflows + WARMUP)} ledger rows, got {rows}")
    ms = sorted(x * 1000 for x in latencies)
    return {
        "peer": "dbos-transact-py",
        "version": version("dbos"),
        "workflows": args.workflows,
        "concurrency": args.concurrency,
        "workflows_per_s": round(args.workflows / wall, 2),
        "cpu_s": round(cpu, 2),
        "cpu_ms_per_workflow": round(cpu * 1000 / args.workflows, 2),
        "latency_ms": {
            "p50": round(statistics.median(ms), 2),
            "p99": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 2),
        },
        "shape": "3 steps, each one ledger INSERT in its own transaction, checkpointed by DBOS",
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--schema", required=True)
    ap.add_argument("--workflows", type=int, default=500)
    ap.add_argument("--concurrency", type=int, default=64)
    print(json.dumps(run(ap.parse_args(argv))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
