"""Payloads by reference (docs/large-payloads.md): what a saga with a 10 MB input costs
against the same saga with a small one.

    python -m bench.blobs                         # the default, ~1 min
    python -m bench.blobs --large-mb 10 --large-sagas 10 --small-sagas 200
    python -m bench.blobs --kafka                 # and the Kafka path, ~1 min more

Needs Postgres (``SAGA_PG__DSN``, as ``make up`` prints it); Kafka only with ``--kafka``
(``SAGA_KAFKA__BOOTSTRAP_SERVERS``). One fresh schema
per run. The saga files an invoice: it takes the document as its input and completes
with a small result, in the start's one transaction. Per case, sagas one after another
through a real ``Engine`` on ``PostgresEventStore``:

- ``start_ms``: ``engine.start`` until the history (the input, by reference or not) is
  committed and the saga completed;
- ``load_ms``: ``store.load`` of the saga (what an engine rebuilding it, the admin API
  and the saga page pay), blobs fetched and verified;
- ``stored_bytes``: the saga's rows in ``saga_events`` plus its blobs.

Cases: ``small`` (1 KB input) without a codec (the baseline every saga pays today),
``small_ref`` (the ``ref`` codec on, the input inline under its threshold: what the
feature costs sagas that do not use it), ``large_ref_postgres`` and
``large_ref_directory`` (10 MB input, by reference, in each store) and ``large_inline``
(10 MB stored inline, the message size raised to let it in: the ceiling of what a
reference saves or costs). Each figure is the median and the best of its sagas (the
machine is shared). Prints one JSON object on stdout; progress goes to stderr.

With ``--kafka``, the Kafka path: a saga whose one step sends the document to a Python
participant, which sends it back (``round_trip_ms``: ``engine.start`` to the completed
saga, through a real ``SagaWorker`` and ``Participant``): ``kafka_small`` (1 KB each way,
no codec: the baseline) and ``kafka_ref`` (the large document each way, the command and
the reply by reference, in the Postgres store).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
from pydantic import BaseModel, SecretStr

from saga_engine import Saga, SagaContext, Settings
from saga_engine.core.history._codec import CodecChain
from saga_engine.core.history._decision import OutboundCommand
from saga_engine.runner._engine import Engine
from saga_engine.settings import BlobSettings, CodecSettings, KafkaSettings, PostgresSettings
from saga_engine.store._blobs import DirectoryBlobStore
from saga_engine.store._migrations import migrate
from saga_engine.store._pgstore import PostgresEventStore


class Invoice(BaseModel):
    number: str
    pdf: str


class Filed(BaseModel):
    number: str
    chars: int


class FileInvoice(Saga[Invoice, Filed]):
    name = "bench-file-invoice"

    async def run(self, ctx: SagaContext, input: Invoice) -> Filed:
        return Filed(number=input.number, chars=len(input.pdf))


class Archive(BaseModel):
    pdf: str


class Archived(BaseModel):
    pdf: str


class ArchiveInvoice(Saga[Invoice, Filed]):
    name = "bench-archive-invoice"

    async def run(self, ctx: SagaContext, input: Invoice) -> Filed:
        back = await ctx.step(
            "archive", to="bench-archive", command=Archive(pdf=input.pdf), returns=Archived
        )
        return Filed(number=input.number, chars=len(back.pdf))


class NoSender:
    async def send_command(self, command: OutboundCommand) -> None:
        raise AssertionError("the bench saga issues no command")


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def document(size: int) -> str:
    """``size`` characters of base64 of random bytes: a PDF does not compress either."""
    return base64.b64encode(os.urandom(size * 3 // 4 + 3)).decode()[:size]


def settings_for(dsn: str, schema: str, *, ref: str | None, max_message: int) -> Settings:
    mac = base64.b64encode(b"bench mac key, 32 bytes long....").decode()
    blobs = (
        BlobSettings(
            threshold_bytes=256 * 1024,
            mac_key=SecretStr(mac),
            store="directory" if ref == "directory" else "postgres",
            directory=tempfile.gettempdir() if ref == "directory" else None,
        )
        if ref
        else BlobSettings()
    )
    return Settings(
        pg=PostgresSettings(dsn=SecretStr(dsn), db_schema=schema),
        kafka=KafkaSettings(max_message_bytes=max_message),
        codec=CodecSettings(blobs=blobs),
    )


async def run_case(
    dsn: str, name: str, *, size: int, sagas: int, ref: str | None, directory: Path
) -> dict[str, Any]:
    schema = f"bench_blobs_{uuid.uuid4().hex[:10]}"
    await migrate(dsn, schema)
    settings = settings_for(dsn, schema, ref=ref, max_message=max(1_000_000, size * 2))
    blob_store = DirectoryBlobStore(directory / schema) if ref == "directory" else None
    store = await PostgresEventStore.connect(
        settings.pg, codec=CodecChain.from_settings(settings.codec), blob_store=blob_store
    )
    engine = Engine(settings, sagas=[FileInvoice], store=store, sender=NoSender())
    starts: list[float] = []
    loads: list[float] = []
    try:
        for i in range(sagas):
            pdf = document(size)
            began = time.perf_counter()
            saga_id = await engine.start(FileInvoice, Invoice(number=f"INV-{i}", pdf=pdf))
            record = await engine.wait(saga_id)
            starts.append(time.perf_counter() - began)
            assert record.status.value == "completed", record
            engine.evict(saga_id)
            began = time.perf_counter()
            loaded = await store.load(saga_id)
            loads.append(time.perf_counter() - began)
            assert loaded.events[0].event.input["pdf"] == pdf  # type: ignore[union-attr]
        stored = await _stored_bytes(dsn, schema, blob_store)
    finally:
        await engine.close()
        await store.close()
        await _drop(dsn, schema)
    say(f"{name}: {sagas} sagas, median start {statistics.median(starts) * 1000:.1f} ms")
    return {
        "input_bytes": size,
        "sagas": sagas,
        "start_ms": _figures(starts),
        "load_ms": _figures(loads),
        "stored_bytes_per_saga": round(stored / sagas),
    }


async def run_kafka_case(
    dsn: str, bootstrap: str, name: str, *, size: int, sagas: int, ref: bool
) -> dict[str, Any]:
    """A saga through a participant and back, ``size`` characters each way."""
    from saga_engine.participant import Participant, Transaction
    from saga_engine.settings import ParticipantSettings
    from saga_engine.worker import SagaWorker

    schema = f"bench_blobs_{uuid.uuid4().hex[:10]}"
    base = settings_for(dsn, schema, ref="postgres" if ref else None, max_message=1_000_000)
    tag = uuid.uuid4().hex[:8]
    settings = base.model_copy(
        update={
            "kafka": KafkaSettings(
                bootstrap_servers=bootstrap, topic_prefix=f"bench{tag}", group_id=f"bench-{tag}"
            ),
            "participant": ParticipantSettings(dsn=SecretStr(dsn), db_schema=f"{schema}_p"),
        }
    )
    participant = Participant("bench-archive", settings)

    @participant.handles(Archive)
    async def archive(cmd: Archive, tx: Transaction) -> Archived:
        return Archived(pdf=cmd.pdf)

    trips: list[float] = []
    try:
        async with SagaWorker(settings, [ArchiveInvoice]) as worker, participant:
            engine = worker.engine
            assert engine is not None
            for i in range(sagas):
                pdf = document(size)
                began = time.perf_counter()
                saga_id = await engine.start(ArchiveInvoice, Invoice(number=f"INV-{i}", pdf=pdf))
                record = await engine.wait(saga_id, timeout=120)
                trips.append(time.perf_counter() - began)
                assert record.status.value == "completed", record
    finally:
        await _drop(dsn, schema)
        await _drop(dsn, f"{schema}_p")
    say(f"{name}: {sagas} sagas, median round trip {statistics.median(trips) * 1000:.1f} ms")
    return {"document_bytes": size, "sagas": sagas, "round_trip_ms": _figures(trips)}


def _figures(seconds: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(seconds) * 1000, 2),
        "best": round(min(seconds) * 1000, 2),
    }


async def _stored_bytes(dsn: str, schema: str, blob_store: DirectoryBlobStore | None) -> int:
    conn = await asyncpg.connect(dsn, server_settings={"search_path": schema})
    try:
        events = await conn.fetchval(
            "SELECT coalesce(sum(pg_column_size(data)), 0) FROM saga_events"
        )
        blobs = await conn.fetchval("SELECT coalesce(sum(size), 0) FROM saga_blobs")
    finally:
        await conn.close()
    on_disk = 0
    if blob_store is not None and blob_store.directory.is_dir():
        on_disk = sum(p.stat().st_size for p in blob_store.directory.rglob("*") if p.is_file())
    return int(events) + int(blobs) + on_disk


async def _drop(dsn: str, schema: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    dsn = os.environ.get("SAGA_PG__DSN")
    if not dsn:
        raise SystemExit("SAGA_PG__DSN is not set: run `make up` and source .dev/env")
    large = int(args.large_mb * 1024 * 1024)
    cases: list[tuple[str, int, int, str | None]] = [
        ("small", 1024, args.small_sagas, None),
        ("small_ref", 1024, args.small_sagas, "postgres"),
        ("large_ref_postgres", large, args.large_sagas, "postgres"),
        ("large_ref_directory", large, args.large_sagas, "directory"),
        ("large_inline", large, args.large_sagas, None),
    ]
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-blobs-") as tmp:
        # A first pass of small sagas, discarded: connections, plans and caches warm.
        await run_case(dsn, "warm-up", size=1024, sagas=20, ref=None, directory=Path(tmp))
        for name, size, sagas, ref in cases:
            results[name] = await run_case(
                dsn, name, size=size, sagas=sagas, ref=ref, directory=Path(tmp)
            )
        if args.kafka:
            bootstrap = os.environ.get("SAGA_KAFKA__BOOTSTRAP_SERVERS")
            if not bootstrap:
                raise SystemExit("--kafka: SAGA_KAFKA__BOOTSTRAP_SERVERS is not set")
            for name, size, sagas, by_ref in (
                ("kafka_small", 1024, args.small_sagas // 4, False),
                ("kafka_ref", large, args.large_sagas, True),
            ):
                results[name] = await run_kafka_case(
                    dsn, bootstrap, name, size=size, sagas=sagas, ref=by_ref
                )
    small = results["small"]["start_ms"]["median"]
    return {
        "bench": "blobs",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "cases": results,
        "per_saga_vs_small": {
            name: round(case["start_ms"]["median"] / small, 1)
            for name, case in results.items()
            if name != "small" and "start_ms" in case
        },
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--large-mb", type=float, default=10.0)
    parser.add_argument("--large-sagas", type=int, default=10)
    parser.add_argument("--small-sagas", type=int, default=200)
    parser.add_argument("--kafka", action="store_true", help="also the Kafka path")
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(main_async(args)), indent=2))


if __name__ == "__main__":
    main()
