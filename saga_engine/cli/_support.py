"""What the ``saga`` command line does besides parsing and printing: reading the
dead-letter topic, durations, and retention's archive (``saga archive``, and replaying
archived histories)."""

from __future__ import annotations

import asyncio
import gzip
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from saga_engine.core._codec import codec_from_settings, open_archive
from saga_engine.core._replay import HistoryExport, load_history
from saga_engine.kernel._errors import CliError, CodecError, SagaNotFound
from saga_engine.kernel._settings import Settings
from saga_engine.runner._retention import Retention, RetentionReport

# ---------------------------------------------------------------------- dead letters


def header(record: Any, name: str) -> str:
    for key, value in record.headers or ():
        if key == name:
            return bytes(value).decode(errors="replace")
    return ""


async def read_dlq(settings: Settings, seconds: float) -> list[Any]:
    """Every record of the dead-letter topic up to its current end, without a group."""
    from aiokafka import TopicPartition

    from saga_engine.transport._kafka import make_consumer

    topic = f"{settings.kafka.topic_prefix}.dlq"
    # The size limits of every consumer: a dead letter is as large as the record it keeps.
    consumer = make_consumer(settings.kafka, group_id=None, fetch_max_wait_ms=50)
    await consumer.start()
    try:
        # aiokafka has no public call for one topic's partitions without subscribing.
        cluster = await asyncio.wait_for(consumer._client.fetch_all_metadata(), seconds)
        partitions = cluster.partitions_for_topic(topic)
        if not partitions:
            raise CliError(f"the dead-letter topic {topic} does not exist")
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        records: list[Any] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        remaining = {tp for tp in tps if ends[tp] > 0}
        while remaining:
            if loop.time() > deadline:
                raise CliError(f"timed out reading {topic} after {seconds}s")
            batch = await consumer.getmany(timeout_ms=200)
            for tp, recs in batch.items():
                records.extend(r for r in recs if r.offset < ends[tp])
            for tp in list(remaining):
                if await consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)
        return sorted(records, key=lambda r: (r.timestamp, r.partition, r.offset))
    finally:
        await consumer.stop()


def dlq_row(record: Any) -> dict[str, Any]:
    return {
        "partition": record.partition,
        "offset": record.offset,
        "reason": header(record, "dlq_reason"),
        "detail": header(record, "dlq_detail"),
        "origin_topic": header(record, "dlq_topic"),
        "origin_partition": header(record, "dlq_partition"),
        "origin_offset": header(record, "dlq_offset"),
        "saga_id": header(record, "ce_sagaid"),
    }


# ---------------------------------------------------------------------- archive

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``3600s``, ``2w``."""
    match = _DURATION.match(text)
    if match is None:
        raise CliError(f"not a duration: {text!r} (write e.g. 30d, 12h, 90m, 3600s)")
    return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2)])


async def archive_now(
    settings: Settings, older_than: timedelta, saga_types: list[str] | None, dry_run: bool
) -> RetentionReport:
    """``saga archive``: one retention pass over every partition, with ``older_than`` as
    the period of every type, archiving as ``SAGA_RETENTION__ARCHIVE`` says."""
    from saga_engine.store._pgstore import PostgresEventStore

    codec = codec_from_settings(settings.codec)
    store = await PostgresEventStore.connect(settings.pg, codec=codec)
    try:
        return await Retention(settings.retention, store, codec).run(
            datetime.now(UTC), older_than=older_than, saga_types=saga_types, dry_run=dry_run
        )
    finally:
        await store.close()


def archive_file_histories(path: Path) -> list[HistoryExport]:
    """The histories of an archive file (``sagas-*.jsonl.gz``), one per line."""
    try:
        blob = open_archive(codec_from_settings(Settings().codec), path.read_bytes())
        lines = gzip.decompress(blob).splitlines()
    except (OSError, EOFError, CodecError) as exc:
        raise CliError(f"cannot read archive file {path}: {exc}") from exc
    return [load_history(line) for line in lines if line.strip()]


async def load_saga_or_archived(saga_id: str) -> HistoryExport:
    """A saga's history from the live tables, or else from ``saga_archive``."""
    from saga_engine.store._pgstore import PostgresEventStore

    settings = Settings()
    codec = codec_from_settings(settings.codec)
    store = await PostgresEventStore.connect(settings.pg, codec=codec)
    try:
        try:
            loaded = await store.load(saga_id)
        except SagaNotFound:
            archived = await store.archived_history(saga_id)
            if archived is None:
                raise
            return load_history(gzip.decompress(open_archive(codec, archived)))
    finally:
        await store.close()
    return HistoryExport(saga_id, loaded.record.saga_type, [s.event for s in loaded.events])
