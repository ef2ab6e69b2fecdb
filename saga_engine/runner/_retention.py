"""Retention: finished sagas past their period are archived, then deleted.

One pass takes bounded batches of finished sagas whose last change is older than their
type's period (``RetentionSettings``), oldest first; for each batch it exports every
history in the format ``saga history ID --json`` prints (``saga-engine/history@1``),
writes the archive, and deletes the sagas and their events. The archive is written
before, or with, the delete, so a crash between the two archives a batch twice (the
table keeps the first copy; a directory gets a second file) but never loses one.

The owning engine runs a pass for its partitions every ``interval_s``; ``saga archive``
runs one on demand, for every partition.
"""

from __future__ import annotations

import asyncio
import functools
import gzip
import logging
import os
import uuid
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from saga_engine.core.history._codec import CodecChain, seal_archive
from saga_engine.core.planning._replay import export_history
from saga_engine.kernel._serde import dumps
from saga_engine.kernel._settings import RetentionSettings
from saga_engine.store._store import ArchivedSaga, EventStore, LoadedSaga

log = logging.getLogger("saga_engine.retention")


@dataclass(slots=True)
class RetentionReport:
    #: Sagas found past their retention (with ``dry_run``: what a pass would take).
    found: int = 0
    deleted: int = 0
    #: Archive files written (``archive=directory``).
    files: list[str] = field(default_factory=list)
    dry_run: bool = False


@dataclass(frozen=True, slots=True)
class _RetentionRule:
    cutoff: datetime
    saga_types: frozenset[str] | None
    other_than: frozenset[str]


class Retention:
    def __init__(
        self, settings: RetentionSettings, store: EventStore, codec: CodecChain | None = None
    ) -> None:
        self.settings = settings
        self.store = store
        #: Seals what is archived: the histories were read decoded (None: as they are).
        self.codec = codec

    def rules(self, now: datetime, older_than: timedelta | None = None) -> list[_RetentionRule]:
        """One cutoff per period: each per-type period for its type, the default for
        every other type. ``older_than`` replaces them all (``saga archive``)."""
        if older_than is not None:
            return [_RetentionRule(now - older_than, None, frozenset())]
        per_type = self.settings.per_type
        rules = [
            _RetentionRule(now - timedelta(days=days), frozenset({saga_type}), frozenset())
            for saga_type, days in sorted(per_type.items())
        ]
        if self.settings.days is not None:
            rules.append(
                _RetentionRule(now - timedelta(days=self.settings.days), None, frozenset(per_type))
            )
        return rules

    async def run(
        self,
        now: datetime,
        *,
        partitions: Collection[int] | None = None,
        partition_count: int = 0,
        older_than: timedelta | None = None,
        saga_types: Collection[str] | None = None,
        dry_run: bool = False,
        max_batches: int = 1_000,
    ) -> RetentionReport:
        """Archives and deletes, batch by batch, until nothing is past its period (or
        ``max_batches``). ``saga_types`` narrows the pass to those types."""
        report = RetentionReport(dry_run=dry_run)
        size = self.settings.batch_size
        for rule in self.rules(now, older_than):
            types = rule.saga_types
            if saga_types is not None:
                types = frozenset(saga_types) if types is None else types & frozenset(saga_types)
                if not types:
                    continue
            expired = functools.partial(
                self.store.finished_before,
                rule.cutoff,
                saga_types=types,
                other_than=rule.other_than,
                partitions=partitions,
                partition_count=partition_count,
            )
            if dry_run:
                # Nothing is deleted, so one query counts what the batches would take.
                report.found += len(await expired(limit=size * max_batches))
                continue
            for _ in range(max_batches):
                ids = await expired(limit=size)
                if not ids:
                    break
                report.found += len(ids)
                deleted = await self._archive_and_delete(ids, report)
                report.deleted += deleted
                if deleted == 0:
                    break  # each was reopened or removed meanwhile: do not spin on them
        if report.deleted:
            log.info("retention: archived and deleted %d finished sagas", report.deleted)
        return report

    async def _archive_and_delete(self, ids: list[str], report: RetentionReport) -> int:
        loaded = await self.store.histories(ids)
        mode = self.settings.archive
        if mode == "table":
            archive = [ArchivedSaga(s.record, gzip.compress(_export(s))) for s in loaded]
            if self.codec is not None:
                archive = [
                    ArchivedSaga(a.record, seal_archive(self.codec, a.history)) for a in archive
                ]
            return await self.store.remove_finished(ids, archive)
        if mode == "directory":
            assert self.settings.directory is not None  # checked by the settings
            # Compression and fsync off the event loop: timers and heartbeats go on.
            path = await asyncio.to_thread(
                _write_file, Path(self.settings.directory), loaded, self.codec
            )
            report.files.append(str(path))
        return await self.store.remove_finished(ids)


def _export(saga: LoadedSaga) -> bytes:
    record = saga.record
    return dumps(export_history(record.saga_id, record.saga_type, [e.event for e in saga.events]))


def _write_file(directory: Path, sagas: list[LoadedSaga], codec: CodecChain | None) -> Path:
    """One gzipped JSON-lines file per batch, one export per line, written whole before
    it gets its name (a crash leaves a ``.tmp``, never half a file). With a codec the
    file is the gzipped lines sealed whole (``saga_engine.core.history._codec.seal_archive``)."""
    directory.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now().astimezone().strftime("%Y%m%dT%H%M%S%z")
    path = directory / f"sagas-{stamp}-{uuid.uuid4().hex[:8]}.jsonl.gz"
    tmp = path.with_suffix(".tmp")
    if codec is not None:
        sealed = seal_archive(codec, gzip.compress(b"".join(_export(s) + b"\n" for s in sagas)))
        with open(tmp, "wb") as raw:
            raw.write(sealed)
            raw.flush()
            os.fsync(raw.fileno())
    else:
        with gzip.open(tmp, "wb") as out:
            for saga in sagas:
                out.write(_export(saga) + b"\n")
            out.flush()
            os.fsync(out.fileobj.fileno())  # type: ignore[union-attr]
    tmp.rename(path)
    # The rename is durable only once the directory is: the delete that follows commits.
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path
