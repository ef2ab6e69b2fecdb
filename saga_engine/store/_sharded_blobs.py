"""Payloads by reference past one database (docs/large-payloads.md): where the blobs
live, and the sweep that deletes those no saga references.

A blob belongs with the sagas that reference it, in their shard:

- A stored event's blobs are written by its saga's shard, with their references, in
  the event's transaction (each shard's store does it, as one database's does).
- A command's or a reply's blobs (``RecordBlobs.keep``) go to the shard of the record's
  saga, with a reference from that saga: retention drops the reference with the saga,
  in the same shard. A read (``fetch``: the record names the blob, not the saga) asks
  every shard; one that does not answer while a blob is still missing makes the read
  fail as ``ShardUnavailable`` (retried), never ``blob_missing``.

The sweep checks references where they live. Blobs in ``saga_blobs`` (the default):
each shard's hold only its own sagas' blobs, so each shard sweeps its own (a shard that
does not answer is swept next time). Blobs in a store every shard shares (a directory):
a blob goes only when no shard references it, so every shard is asked and the sweep
deletes nothing while one does not answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping
from datetime import UTC, datetime, timedelta
from typing import Protocol, cast

from saga_engine.kernel._errors import ShardUnavailable
from saga_engine.store._blobs import BlobStore
from saga_engine.store._coverage import coverage
from saga_engine.store._shard_router import ShardRouter
from saga_engine.store._store import EventStore

__all__ = ["ShardedBlobs", "ShardedRecordBlobs"]


class _ShardBlobs(Protocol):
    """A shard's record blobs (``_pgblobs.PostgresRecordBlobs``)."""

    async def keep(self, saga_id: str, blobs: Mapping[str, bytes]) -> None: ...

    async def fetch(self, digests: Collection[str]) -> dict[str, bytes]: ...

    async def referenced(self, digests: Collection[str]) -> set[str]: ...


_Sweep = Callable[..., Awaitable[int]]


def _blobs_of(store: EventStore) -> _ShardBlobs:
    make = getattr(store, "record_blobs", None)
    if make is None:
        raise TypeError(f"a shard's store keeps no blobs: {type(store).__name__}")
    return cast(_ShardBlobs, make())


def _sweep_of(store: EventStore) -> _Sweep:
    sweep = getattr(store, "sweep_blobs", None)
    if sweep is None:
        raise TypeError(f"a shard's store sweeps no blobs: {type(store).__name__}")
    return cast(_Sweep, sweep)


class ShardedRecordBlobs:
    """``RecordBlobs`` past one database: kept in the record's saga's shard, read from
    whichever shard holds them (the module docstring)."""

    def __init__(self, router: ShardRouter, store: BlobStore | None) -> None:
        self._router = router
        self._store = store

    async def keep(self, saga_id: str, blobs: Mapping[str, bytes]) -> None:
        if blobs:
            await self._router.on_saga(saga_id, lambda s: _blobs_of(s).keep(saga_id, blobs))

    async def fetch(self, digests: Collection[str]) -> dict[str, bytes]:
        wanted = list(digests)
        if self._store is not None:
            return await self._store.get(wanted)
        with coverage() as seen:
            found = await self._router.on_every_shard(lambda _, s: _blobs_of(s).fetch(wanted))
        merged: dict[str, bytes] = {}
        for each in found.values():
            merged.update(each)
        if seen.partial and any(d not in merged for d in wanted):
            # It may be in the shard that did not answer: not missing, unreachable.
            raise ShardUnavailable(
                ", ".join(seen.missing),
                "a blob may be kept there: " + "; ".join(seen.missing.values()),
            )
        return merged


class ShardedBlobs(ShardRouter):
    """The sharded store's ``record_blobs`` and ``sweep_blobs`` (module docstring)."""

    _blob_store: BlobStore | None = None

    def attach_blob_store(self, store: BlobStore | None) -> None:
        """The blob store the shards share (None: each shard's ``saga_blobs``)."""
        self._blob_store = store

    def record_blobs(self) -> ShardedRecordBlobs:
        """Where the blobs of Kafka records by reference are kept and read."""
        return ShardedRecordBlobs(self, self._blob_store)

    async def sweep_blobs(self, grace: timedelta, *, now: datetime | None = None) -> int:
        """Deletes the blobs no saga of any shard references, last written before
        ``now`` less ``grace``; returns how many."""
        shared = self._blob_store
        if shared is None:
            swept = await self.on_every_shard(lambda _, s: _sweep_of(s)(grace, now=now))
            return sum(swept.values())
        cutoff = (now or datetime.now(UTC)) - grace
        old = await shared.written_before(cutoff)
        if not old:
            return 0
        # Every shard must answer: a blob only a silent shard references is not garbage.
        found = await self.on_every_shard(lambda _, s: _blobs_of(s).referenced(old), partial=False)
        referenced = set().union(*found.values())
        return await shared.delete([d for d in old if d not in referenced], written_before=cutoff)
