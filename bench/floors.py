"""What a saga costs at the least, before any plumbing: the floors under ``bench/e2e.py``.

Two costs the engine pipeline cannot drop without changing what users write:

- **the decision core**: the benchmark's 3-step saga (``bench.app.Transfer``) started and
  driven by its three replies through ``SagaRuntime``, in this process, with no I/O. It
  is the saga's own coroutine, its pydantic inputs and outputs, and the events it
  records;
- **the straight line under it**: the same saga's models, ids and eight events written
  out by hand with no engine at all (no deterministic loop, fold, matching or checks),
  the least a decision core that runs the user's code can cost;
- **replay**: a saga of ``--replay-steps`` steps (5,000: a history of 10,002 events) read
  from its stored JSON and rebuilt by running its code against it, CPU µs per event;
- **a handler's statement**: each participant handler runs one ``INSERT`` through the
  ``Transaction`` it is given, one round trip each (the handler API sees one command at
  a time). Measured as 100 such statements per transaction on uvloop, the client's CPU
  and the Postgres backend's CPU per statement.

With ``--e2e RESULT.json`` (a ``bench/e2e.py`` result) it also works out the CPU budget
per saga that 0.4x the bare pipeline's sagas/s leaves at the headline point, and how
much of it these floors and the bare pipeline's own cost take::

    python -m bench.floors [--sagas 3000] [--statements 20000] [--replay-steps 5000]
                           [--e2e /tmp/e2e.json]

It needs ``SAGA_PG__DSN`` (``scripts/devstack.py env``) for the statement floor.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import orjson
from pydantic import BaseModel

from bench.app import (
    LEDGER_DDL,
    PARTICIPANTS,
    Applied,
    Apply,
    Revert,
    Transfer,
    TransferDone,
    TransferRequest,
)
from saga_engine import Saga, SagaContext
from saga_engine.core.authoring._definition import SagaDefinition
from saga_engine.core.history._decision import Reply, StartSaga
from saga_engine.core.history._events import event_to_json, events_from_list
from saga_engine.core.runtime._runtime import SagaRuntime
from saga_engine.kernel._mainloop import GC_THRESHOLDS

_STEPS = 3


def _one_saga(definition: SagaDefinition, now: datetime) -> None:
    runtime, decision = SagaRuntime.start(
        definition,
        StartSaga(
            saga_id=str(uuid.uuid4()), saga_type=definition.name, input={"amount": 5}, at=now
        ),
    )
    replies = 0
    while decision.commands:
        command = decision.commands[0]
        decision = runtime.handle(
            Reply(command.command_id, "success", now, payload={"receipt": "p:1"})
        )
        replies += 1
    if replies != _STEPS or decision.status.value != "completed":
        raise RuntimeError(f"the saga ended {decision.status.value} after {replies} replies")
    runtime.close()


def decision_core_us(sagas: int, rounds: int = 3) -> list[float]:
    """CPU µs per saga of the pure core, one figure per round (after a warm-up)."""
    definition = SagaDefinition.of(Transfer)
    now = datetime.now(UTC)
    for _ in range(min(200, sagas)):
        _one_saga(definition, now)
    out = []
    for _ in range(rounds):
        t0 = time.process_time()
        for _ in range(sagas):
            _one_saga(definition, now)
        out.append((time.process_time() - t0) / sagas * 1e6)
    return out


def _straight_line(now: datetime) -> list[bytes]:
    """``Transfer`` written out by hand with nothing of an engine: its pydantic models
    validated and dumped as the saga's code and the core do, its three command ids
    derived, and its eight events built as dicts and written as JSON. No loop, no fold,
    no replay matching, no checks: the least a code-driven decision core can cost."""
    at = now.isoformat()
    saga_id = str(uuid.uuid4())
    req = TransferRequest.model_validate({"amount": 5})
    events: list[dict[str, Any]] = [
        {
            "kind": "saga_started",
            "at": at,
            "saga_type": Transfer.name,
            "input": req.model_dump(mode="json"),
        },
    ]
    receipts = []
    for name in PARTICIPANTS:
        command, undo = Apply(amount=req.amount), Revert(amount=req.amount)
        cid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{saga_id}:apply-{name}:0"))
        events.append(
            {
                "kind": "command_issued",
                "at": at,
                "step": f"apply-{name}",
                "participant": name,
                "command_id": cid,
                "payload": command.model_dump(mode="json"),
                "compensation": {"payload": undo.model_dump(mode="json")},
            }
        )
        reply = Applied.model_validate({"receipt": "p:1"})
        events.append(
            {
                "kind": "reply_received",
                "at": at,
                "command_id": cid,
                "outcome": "success",
                "payload": {"receipt": reply.receipt},
            }
        )
        receipts.append(reply.receipt)
    done = TransferDone(receipts=receipts)
    events.append({"kind": "saga_completed", "at": at, "output": done.model_dump(mode="json")})
    return [orjson.dumps(e) for e in events]


def straight_line_us(sagas: int, rounds: int = 3) -> list[float]:
    """CPU µs per saga of ``_straight_line``: the floor under ``decision_core_us``."""
    now = datetime.now(UTC)
    for _ in range(min(200, sagas)):
        _straight_line(now)
    out = []
    for _ in range(rounds):
        t0 = time.process_time()
        for _ in range(sagas):
            _straight_line(now)
        out.append((time.process_time() - t0) / sagas * 1e6)
    return out


class _Steps(BaseModel):
    steps: int


class _Done(BaseModel):
    steps: int


class LongRun(Saga[_Steps, _Done]):
    """A saga of ``steps`` steps on one participant: a history of 2 events per step."""

    name = "bench-long-run"

    async def run(self, ctx: SagaContext, req: _Steps) -> _Done:
        for i in range(req.steps):
            await ctx.step(f"s-{i}", to="alpha", command=Apply(amount=i), returns=Applied)
        return _Done(steps=req.steps)


def _long_history(steps: int) -> list[bytes]:
    """A finished ``LongRun`` history, as the store holds it (one JSON value per event)."""
    definition = SagaDefinition.of(LongRun)
    now = datetime.now(UTC)
    start = StartSaga(saga_id="long", saga_type=LongRun.name, input={"steps": steps}, at=now)
    runtime, decision = SagaRuntime.start(definition, start)
    while decision.commands:
        cid = decision.commands[0].command_id
        decision = runtime.handle(Reply(cid, "success", now, payload={"receipt": "r"}))
    events = [event_to_json(e) for e in runtime.history]
    runtime.close()
    return events


def replay_us(steps: int, rounds: int = 3) -> dict[str, Any]:
    """CPU µs per event to rebuild a saga from its stored history: its events read from
    their JSON (as a load reads them), then its code run against them (``replay``)."""
    rows = _long_history(steps)
    definition = SagaDefinition.of(LongRun)
    read, rebuilt = [], []
    # As in an engine process (saga_engine.run): a 10,000-event load allocates enough to
    # set CPython's default collector walking everything loaded so far, several times.
    thresholds = gc.get_threshold()
    gc.collect()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        for _ in range(rounds):
            read_us, rebuild_us = _replay_once(definition, rows)
            read.append(read_us)
            rebuilt.append(rebuild_us)
    finally:
        gc.set_threshold(*thresholds)
    total = statistics.median(a + b for a, b in zip(read, rebuilt, strict=True))
    return {
        "events": len(rows),
        "us_per_event": round(total, 2),
        "read_us_per_event": round(statistics.median(read), 2),
        "rebuild_us_per_event": round(statistics.median(rebuilt), 2),
        "history_ms": round(total * len(rows) / 1000, 1),
        "gc": f"thresholds {GC_THRESHOLDS}, as saga_engine.run sets them",
    }


def _replay_once(definition: SagaDefinition, rows: list[bytes]) -> tuple[float, float]:
    """CPU µs per event to read ``rows`` and to rebuild the saga from them."""
    t0 = time.process_time()
    events = events_from_list([orjson.loads(r) for r in rows])
    t1 = time.process_time()
    runtime, _ = SagaRuntime.replay(definition, "long", events)
    t2 = time.process_time()
    if runtime.status.value != "completed":
        raise RuntimeError(f"the replayed saga is {runtime.status.value}")
    runtime.close()
    return (t1 - t0) / len(rows) * 1e6, (t2 - t1) / len(rows) * 1e6


def _proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def statement_us(dsn: str, statements: int, per_tx: int = 100) -> dict[str, float]:
    """Client and server CPU µs per handler ``INSERT``, ``per_tx`` to a transaction."""
    conn = await asyncpg.connect(dsn)
    schema = f"floors_{uuid.uuid4().hex[:8]}"
    try:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
        await conn.execute(f'SET search_path TO "{schema}"')
        await conn.execute(LEDGER_DDL)
        backend = await conn.fetchval("SELECT pg_backend_pid()")
        sql = "INSERT INTO ledger (command_id, saga_id, kind, amount) VALUES ($1, $2, 'apply', $3)"

        async def run(n: int) -> None:
            for _ in range(max(1, n // per_tx)):
                async with conn.transaction():
                    for _ in range(per_tx):
                        await conn.execute(sql, str(uuid.uuid4()), "saga", 5)

        await run(per_tx * 10)  # warm-up: the statement is prepared, the caches are hot
        n = max(per_tx, statements // per_tx * per_tx)
        client0, server0 = time.process_time(), _proc_cpu_s(backend)
        await run(n)
        client, server = time.process_time() - client0, _proc_cpu_s(backend) - server0
        return {"client_us": client / n * 1e6, "server_us": server / n * 1e6, "statements": n}
    finally:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await conn.close()


def budget(e2e: dict[str, Any], floor_ms: float) -> dict[str, Any]:
    """What 0.4x bare leaves per saga at the e2e run's headline point."""
    point = e2e  # the headline point's figures are at the top level
    bare = point["bare"]
    cores = e2e.get("machine", {}).get("cpus_usable") or os.cpu_count() or 1
    #: CPU-bound runs here reach this much of the machine, not all of it.
    busy = point.get("machine_cpu_busy_fraction") or 1.0
    target = 0.4 * bare["sagas_per_s"]
    budget_ms = cores * 1000 * busy / target
    bare_ms = bare["cpu_total_ms_per_saga"]
    engine_ms = point["cpu_total_ms_per_saga"]
    return {
        "bare_sagas_per_s": bare["sagas_per_s"],
        "target_sagas_per_s": round(target, 1),
        "cores": cores,
        "busy_fraction": busy,
        "cpu_budget_ms_per_saga": round(budget_ms, 3),
        "bare_cpu_ms_per_saga": bare_ms,
        "floors_ms_per_saga": round(floor_ms, 3),
        "left_for_the_framework_ms": round(budget_ms - bare_ms - floor_ms, 3),
        "engine_cpu_ms_per_saga": engine_ms,
        "framework_spends_ms": round(engine_ms - bare_ms - floor_ms, 3),
    }


async def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.floors", description=__doc__.split("\n")[0])
    ap.add_argument("--sagas", type=int, default=3000, help="sagas per round of the core")
    ap.add_argument("--statements", type=int, default=20000)
    ap.add_argument(
        "--replay-steps", type=int, default=5000, help="steps of the replayed saga (2 events each)"
    )
    ap.add_argument("--e2e", type=Path, help="a bench/e2e.py JSON result, for the budget")
    args = ap.parse_args(argv)
    dsn = os.environ.get("SAGA_PG__DSN")
    if not dsn:
        print("SAGA_PG__DSN is not set: run under `scripts/devstack.py env`", file=sys.stderr)
        return 2
    core = decision_core_us(args.sagas)
    straight = straight_line_us(args.sagas)
    stmt = await statement_us(dsn, args.statements)
    core_us = statistics.median(core)
    floor_ms = (core_us + _STEPS * (stmt["client_us"] + stmt["server_us"])) / 1000
    out: dict[str, Any] = {
        "decision_core_us_per_saga": round(core_us, 1),
        "decision_core_rounds_us": [round(x, 1) for x in core],
        "straight_line_us_per_saga": round(statistics.median(straight), 1),
        "replay": replay_us(args.replay_steps),
        "handler_statement_us": {k: round(v, 1) for k, v in stmt.items()},
        "floors_ms_per_saga": round(floor_ms, 3),
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    if args.e2e is not None:
        out["budget_at_0_4x_bare"] = budget(json.loads(args.e2e.read_text()), floor_ms)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    import uvloop

    sys.exit(uvloop.run(main(sys.argv[1:])))
