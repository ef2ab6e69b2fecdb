"""The blob store port (payloads stored by reference, docs/large-payloads.md) and its
directory adapter; the Postgres adapter is ``_pgblobs.py``.

A blob is named by its content hash (SHA-256, hex), so a put is idempotent and two
sagas with one large document share its blob. Which sagas reference which blob is not
the store's business: the event store writes that (``saga_blob_refs``) with the events,
and the sweeper (``_pgblobs.sweep_blobs``) asks the store for the blobs written before
a cutoff and deletes those no saga references.

Four methods: an S3 adapter maps them onto PutObject, GetObject, ListObjectsV2 (its
LastModified) and DeleteObject. tests/internal/contract/test_blob_stores.py is the
contract every adapter passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import tempfile
from collections.abc import Collection, Mapping
from datetime import datetime
from pathlib import Path
from typing import Final, Protocol, runtime_checkable

__all__ = ["BlobStore", "DirectoryBlobStore", "check_digest"]

_DIGEST: Final = re.compile(r"^[0-9a-f]{64}$")


def check_digest(digest: str) -> str:
    """``digest`` if it is a content hash (64 lowercase hex digits): a name a store may
    turn into a path or a key. Raises ValueError otherwise."""
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise ValueError(f"{digest!r} is not a blob's content hash (64 lowercase hex digits)")
    return digest


@runtime_checkable
class BlobStore(Protocol):
    """Where payloads stored by reference live (the module docstring)."""

    #: Written into every reference (``postgres``, ``directory``, ``s3``...).
    @property
    def name(self) -> str: ...

    async def put(self, blobs: Mapping[str, bytes]) -> None:
        """Stores each blob under its content hash; one already there is kept and its
        written time moved to now (the sweeper's grace starts again)."""
        ...

    async def get(self, digests: Collection[str]) -> dict[str, bytes]:
        """The blobs of ``digests`` that the store holds (a missing one is left out)."""
        ...

    async def written_before(self, cutoff: datetime) -> list[str]:
        """The content hashes of the blobs last written before ``cutoff``."""
        ...

    async def delete(self, digests: Collection[str], *, written_before: datetime) -> int:
        """Deletes those of ``digests`` still last written before ``written_before`` (one
        written again since is kept); returns how many it deleted."""
        ...


class DirectoryBlobStore:
    """Blobs as files of a directory (a volume every engine and participant mounts):
    ``<directory>/<first two hex digits>/<content hash>``, written to a temporary file
    and renamed, so a reader never sees half a blob."""

    name = "directory"

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def _path(self, digest: str) -> Path:
        check_digest(digest)
        return self.directory / digest[:2] / digest

    async def put(self, blobs: Mapping[str, bytes]) -> None:
        if blobs:
            await asyncio.to_thread(self._put, dict(blobs))

    def _put(self, blobs: dict[str, bytes]) -> None:
        for digest, data in blobs.items():
            path = self._path(digest)
            if path.exists():
                os.utime(path)
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise

    async def get(self, digests: Collection[str]) -> dict[str, bytes]:
        return await asyncio.to_thread(self._get, list(digests))

    def _get(self, digests: list[str]) -> dict[str, bytes]:
        found: dict[str, bytes] = {}
        for digest in digests:
            with contextlib.suppress(FileNotFoundError):
                found[digest] = self._path(digest).read_bytes()
        return found

    async def written_before(self, cutoff: datetime) -> list[str]:
        return await asyncio.to_thread(self._written_before, cutoff.timestamp())

    def _written_before(self, cutoff: float) -> list[str]:
        if not self.directory.is_dir():
            return []
        out: list[str] = []
        for shard in self.directory.iterdir():
            if not shard.is_dir():
                continue
            for entry in shard.iterdir():
                if _DIGEST.match(entry.name) and _mtime(entry) < cutoff:
                    out.append(entry.name)
        return out

    async def delete(self, digests: Collection[str], *, written_before: datetime) -> int:
        return await asyncio.to_thread(self._delete, list(digests), written_before.timestamp())

    def _delete(self, digests: list[str], cutoff: float) -> int:
        deleted = 0
        for digest in digests:
            path = self._path(digest)
            if _mtime(path) < cutoff:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    deleted += 1
        return deleted


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return float("inf")
