"""The bare pipeline: the same 3-step saga, hand-written and batched, with no framework.

It is the ceiling of the stack under the saga engine in bench/e2e.py: the same processes
(one engine, three participants), the same Postgres and Kafka, the same message pattern
(start -> engine -> command to alpha -> reply -> command to beta -> reply -> command to
gamma -> reply -> complete), every message keyed by saga id, plain JSON values. What it
leaves out is everything the engine does besides moving those messages and writing
those rows (saga code, validation, envelopes, outbox, timers, recovery, DLQ ...).

::

    python -m bench.bare engine              # consumes {prefix}.inbox
    python -m bench.bare participant alpha   # consumes {prefix}.cmd.alpha

Configured by the same environment variables as bench/app.py (read here without
saga_engine): ``SAGA_PG__DSN``, ``SAGA_PG__DB_SCHEMA`` (engine) or
``SAGA_PARTICIPANT__DB_SCHEMA`` (participant), ``SAGA_KAFKA__BOOTSTRAP_SERVERS``,
``SAGA_KAFKA__TOPIC_PREFIX``, ``SAGA_KAFKA__FETCH_MAX_WAIT_MS``, and ``BENCH_STATE_DIR``
(``{role}.ready`` once the consumer owns partitions, ``{role}.stats.{n}.json`` on the
n-th SIGUSR1, ``{role}.stats.final.json`` at exit).

Per consumed batch (``getmany``):

- engine: one transaction: a ``sagas`` row per start and an ``events`` row per input
  (start or reply), each a single multi-row ``INSERT ... SELECT FROM unnest(...)``, and
  one ``UPDATE`` marking the sagas whose third reply is in the batch completed (status,
  ``completed_at = clock_timestamp()``). Which step comes next is kept in memory. Then
  every next command is handed to the producer and the deliveries awaited together,
  then the batch's offsets are committed in one request.
- participant: one statement (so one transaction, one round trip): the dedupe insert
  into ``processed_commands`` (``ON CONFLICT DO NOTHING RETURNING``) feeding one ledger
  row per new command. Then every reply produced and awaited together, then one offset
  commit.

This module also holds the Kafka request counter every benchmark process installs
(``count_kafka_requests``): it wraps ``aiokafka.conn.AIOKafkaConnection.send`` and
counts requests by API key.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

PARTICIPANTS = ("alpha", "beta", "gamma")
log = logging.getLogger("bench.bare")

# --------------------------------------------------------------------------- Kafka requests

#: Kafka API keys (the protocol's numbering) -> name.
API_NAMES = {
    0: "produce",
    1: "fetch",
    2: "list_offsets",
    3: "metadata",
    8: "offset_commit",
    9: "offset_fetch",
    10: "find_coordinator",
    11: "join_group",
    12: "heartbeat",
    13: "leave_group",
    14: "sync_group",
    18: "api_versions",
    19: "create_topics",
    20: "delete_topics",
    22: "init_producer_id",
}
#: The split reported per pipeline; everything else is "other".
API_GROUPS = ("produce", "fetch", "offset_commit", "heartbeat", "metadata")

_requests: Counter[str] = Counter()
_installed = False


def count_kafka_requests() -> None:
    """Counts every request this process sends to a broker, by API (idempotent).

    aiokafka sends every request, on every connection (producer, consumer fetcher,
    group coordinator, admin), through ``AIOKafkaConnection.send``; the wrapper counts
    the request and calls the original.
    """
    global _installed
    if _installed:
        return
    from aiokafka.conn import AIOKafkaConnection

    original = AIOKafkaConnection.send

    def send(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        key = getattr(request, "API_KEY", -1)
        _requests[API_NAMES.get(key, f"api_{key}")] += 1
        return original(self, request, *args, **kwargs)

    AIOKafkaConnection.send = send
    _installed = True


def kafka_requests() -> dict[str, int]:
    """Requests sent so far by this process, by API name."""
    return dict(_requests)


def group_requests(by_api: dict[str, int]) -> dict[str, int]:
    """``by_api`` folded into produce, fetch, offset_commit, heartbeat, metadata, other."""
    out = dict.fromkeys((*API_GROUPS, "other"), 0)
    for api, n in by_api.items():
        out[api if api in API_GROUPS else "other"] += n
    return out


# --------------------------------------------------------------------------- wire


def inbox_topic(prefix: str) -> str:
    return f"{prefix}.inbox"


def command_topic(prefix: str, participant: str) -> str:
    return f"{prefix}.cmd.{participant}"


def topics(prefix: str) -> list[str]:
    return [inbox_topic(prefix), *(command_topic(prefix, p) for p in PARTICIPANTS)]


def start_record(saga_id: str, amount: int = 1) -> bytes:
    """The value of a start request (the key is the saga id)."""
    return orjson.dumps({"t": "start", "saga": saga_id, "amount": amount})


def make_producer(bootstrap: str) -> AIOKafkaProducer:
    """As saga_engine.transport._kafka.make_producer: acks=all, idempotent, no linger."""
    return AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=0
    )


def make_consumer(bootstrap: str, topic: str, group: str, fetch_max_wait_ms: int) -> Any:
    return AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=fetch_max_wait_ms,
        session_timeout_ms=10_000,
        heartbeat_interval_ms=3_000,
    )


ENGINE_DDL = """
CREATE TABLE IF NOT EXISTS sagas (
    saga_id      text COLLATE "C" PRIMARY KEY,
    status       text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    completed_at timestamptz
);
CREATE TABLE IF NOT EXISTS events (
    saga_id     text COLLATE "C" NOT NULL,
    seq         int NOT NULL,
    data        jsonb NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (saga_id, seq)
);
"""

PARTICIPANT_DDL = """
CREATE TABLE IF NOT EXISTS processed_commands (
    command_id text COLLATE "C" PRIMARY KEY,
    saga_id    text NOT NULL
);
CREATE TABLE IF NOT EXISTS ledger (
    id bigserial PRIMARY KEY,
    command_id text NOT NULL,
    saga_id text NOT NULL,
    kind text NOT NULL,
    amount int NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""

INSERT_SAGAS = """
INSERT INTO sagas (saga_id, status) SELECT s, 'running' FROM unnest($1::text[]) AS s
"""
INSERT_EVENTS = """
INSERT INTO events (saga_id, seq, data)
SELECT s, n, d::jsonb FROM unnest($1::text[], $2::int[], $3::text[]) AS u(s, n, d)
"""
COMPLETE_SAGAS = """
UPDATE sagas SET status = 'completed', completed_at = clock_timestamp()
WHERE saga_id = ANY($1::text[])
"""
#: A participant's whole batch: the dedupe claims, then one ledger row per new command.
APPLY_BATCH = """
WITH claimed AS (
    INSERT INTO processed_commands (command_id, saga_id)
    SELECT * FROM unnest($1::text[], $2::text[])
    ON CONFLICT DO NOTHING
    RETURNING command_id, saga_id
)
INSERT INTO ledger (command_id, saga_id, kind, amount)
SELECT command_id, saga_id, 'apply', $3 FROM claimed
RETURNING command_id
"""

# --------------------------------------------------------------------------- processes


class Reporter:
    """The ready marker and counters files bench/e2e.py reads (as in bench/app.py)."""

    def __init__(self, role: str, snapshot: Callable[[], dict[str, Any]]) -> None:
        self.dir = Path(os.environ["BENCH_STATE_DIR"])
        self.role = role
        self._snapshot = snapshot
        self.dumps = 0
        self.is_ready = False

    def _write(self, name: str, payload: bytes) -> None:
        tmp = self.dir / f".{name}.tmp"
        tmp.write_bytes(payload)
        tmp.rename(self.dir / name)

    def ready(self) -> None:
        if not self.is_ready:
            self.is_ready = True
            self._write(f"{self.role}.ready", str(os.getpid()).encode())

    def dump(self, tag: str | None = None) -> None:
        if tag is None:
            self.dumps += 1
            tag = str(self.dumps)
        times = os.times()
        payload = {
            **self._snapshot(),
            "kafka_requests": kafka_requests(),
            "cpu_s": times.user + times.system,
        }
        self._write(f"{self.role}.stats.{tag}.json", orjson.dumps(payload))


class Config:
    def __init__(self, schema_var: str) -> None:
        env = os.environ
        self.dsn = env["SAGA_PG__DSN"]
        self.schema = env[schema_var]
        self.bootstrap = env["SAGA_KAFKA__BOOTSTRAP_SERVERS"]
        self.prefix = env["SAGA_KAFKA__TOPIC_PREFIX"]
        self.fetch_max_wait_ms = int(env.get("SAGA_KAFKA__FETCH_MAX_WAIT_MS", "20"))
        self.max_records = int(env.get("BENCH_BARE_MAX_RECORDS", "2000"))


async def _connect(cfg: Config, ddl: str) -> asyncpg.Connection[Any]:
    conn: asyncpg.Connection[Any] = await asyncpg.connect(cfg.dsn, timeout=10)
    await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{cfg.schema}"')
    await conn.execute(f'SET search_path TO "{cfg.schema}"')
    await conn.execute(ddl)
    return conn


def _offsets(batch: dict[Any, list[Any]]) -> dict[TopicPartition, int]:
    return {tp: records[-1].offset + 1 for tp, records in batch.items() if records}


async def _serve(
    role: str,
    consumer: Any,
    producer: AIOKafkaProducer,
    max_records: int,
    handle: Callable[[list[Any]], Any],
    counters: Counter[str],
) -> None:
    """The loop both roles share: batch in, ``handle`` (Postgres, returns what to send),
    every send started then awaited together, one offset commit."""
    stop = asyncio.Event()
    reporter = Reporter(role, lambda: {"counters": dict(counters)})
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, reporter.dump)
    try:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=200, max_records=max_records)
            if consumer.assignment():
                reporter.ready()
            if not batch:
                continue
            records = [r for rs in batch.values() for r in rs]
            outgoing: list[tuple[str, bytes, bytes]] = await handle(records)
            futures = [await producer.send(t, v, key=k) for t, v, k in outgoing]
            if futures:
                await asyncio.gather(*futures)
            await consumer.commit(_offsets(batch))
            counters["batches"] += 1
            counters["records"] += len(records)
            counters["sent"] += len(outgoing)
    finally:
        await consumer.stop()
        await producer.stop()
        reporter.dump("final")


async def run_engine() -> None:
    cfg = Config("SAGA_PG__DB_SCHEMA")
    conn = await _connect(cfg, ENGINE_DDL)
    commands = [command_topic(cfg.prefix, p) for p in PARTICIPANTS]
    #: saga id -> (next step, its amount); gone once completed.
    sagas: dict[str, tuple[int, int]] = {}
    counters: Counter[str] = Counter()

    async def handle(records: list[Any]) -> list[tuple[str, bytes, bytes]]:
        new: list[str] = []
        ev_ids: list[str] = []
        ev_seq: list[int] = []
        ev_data: list[str] = []
        done: list[str] = []
        out: list[tuple[str, bytes, bytes]] = []
        for record in records:
            msg = orjson.loads(record.value)
            saga_id = msg["saga"]
            if msg["t"] == "start":
                if saga_id in sagas:
                    counters["duplicate_starts"] += 1
                    continue
                step, amount = 0, int(msg["amount"])
                new.append(saga_id)
            else:
                state = sagas.get(saga_id)
                if state is None or state[0] != msg["step"] + 1:
                    counters["ignored_replies"] += 1
                    continue
                step, amount = state
            ev_ids.append(saga_id)
            ev_seq.append(step + 1)
            ev_data.append(record.value.decode())
            if step == len(PARTICIPANTS):
                del sagas[saga_id]
                done.append(saga_id)
                continue
            sagas[saga_id] = (step + 1, amount)
            command = {"saga": saga_id, "step": step, "id": f"{saga_id}:{step}", "amount": amount}
            out.append((commands[step], orjson.dumps(command), record.key))
        if ev_ids:
            async with conn.transaction():
                if new:
                    await conn.execute(INSERT_SAGAS, new)
                await conn.execute(INSERT_EVENTS, ev_ids, ev_seq, ev_data)
                if done:
                    await conn.execute(COMPLETE_SAGAS, done)
            counters["transactions"] += 1
            counters["completed"] += len(done)
        return out

    consumer = make_consumer(
        cfg.bootstrap, inbox_topic(cfg.prefix), f"{cfg.prefix}.engine", cfg.fetch_max_wait_ms
    )
    producer = make_producer(cfg.bootstrap)
    await producer.start()
    await consumer.start()
    try:
        await _serve("engine", consumer, producer, cfg.max_records, handle, counters)
    finally:
        await conn.close()


async def run_participant(name: str) -> None:
    cfg = Config("SAGA_PARTICIPANT__DB_SCHEMA")
    conn = await _connect(cfg, PARTICIPANT_DDL)
    inbox = inbox_topic(cfg.prefix)
    counters: Counter[str] = Counter()

    async def handle(records: list[Any]) -> list[tuple[str, bytes, bytes]]:
        msgs = [orjson.loads(r.value) for r in records]
        # Amounts are all the same in the benchmark; one parameter keeps the statement small.
        applied = await conn.fetch(
            APPLY_BATCH, [m["id"] for m in msgs], [m["saga"] for m in msgs], msgs[0]["amount"]
        )
        counters["transactions"] += 1
        counters["applied"] += len(applied)
        counters["duplicates"] += len(msgs) - len(applied)
        # A duplicate is answered again (a real participant would resend its stored reply).
        return [
            (
                inbox,
                orjson.dumps(
                    {
                        "t": "reply",
                        "saga": m["saga"],
                        "step": m["step"],
                        "receipt": f"{name}:{m['id']}",
                    }
                ),
                r.key,
            )
            for m, r in zip(msgs, records, strict=True)
        ]

    consumer = make_consumer(
        cfg.bootstrap,
        command_topic(cfg.prefix, name),
        f"{cfg.prefix}.participant.{name}",
        cfg.fetch_max_wait_ms,
    )
    producer = make_producer(cfg.bootstrap)
    await producer.start()
    await consumer.start()
    try:
        await _serve(f"participant-{name}", consumer, producer, cfg.max_records, handle, counters)
    finally:
        await conn.close()


def main(argv: list[str]) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    count_kafka_requests()
    if argv == ["engine"]:
        asyncio.run(run_engine())
        return 0
    if len(argv) == 2 and argv[0] == "participant" and argv[1] in PARTICIPANTS:
        asyncio.run(run_participant(argv[1]))
        return 0
    print(
        f"usage: python -m bench.bare engine | participant {{{','.join(PARTICIPANTS)}}}",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
