"""Which shards a read across shards could not reach: one home for "this answer is partial".

A sharded store's fan-out reads (the listing, counts, summaries, insights) skip a shard
that does not answer and say so here, instead of failing the whole read: an operator
listing sagas while one shard's Postgres is down sees the others' sagas and a note naming
the missing shard, never an error page. The store's port keeps its signatures; a caller
that wants to know opens a ``coverage()`` around its reads::

    with coverage() as seen:
        rows = await store.list_sagas(where)
    if seen.missing:
        ...  # say which shards the answer lacks

Reads outside a ``coverage()`` block behave the same (a missing shard is skipped); only
the note is not kept. One database never adds to it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

__all__ = ["ReadCoverage", "coverage", "missed"]


@dataclass
class ReadCoverage:
    """The shards the reads of one ``coverage()`` block could not reach, with why."""

    missing: dict[str, str] = field(default_factory=dict)

    @property
    def partial(self) -> bool:
        return bool(self.missing)


_CURRENT: ContextVar[ReadCoverage | None] = ContextVar("saga_read_coverage", default=None)


@contextmanager
def coverage() -> Iterator[ReadCoverage]:
    """Collect the shards the reads inside the block skip (nested blocks each see all)."""
    seen = ReadCoverage()
    outer = _CURRENT.get()
    token = _CURRENT.set(seen)
    try:
        yield seen
    finally:
        _CURRENT.reset(token)
        if outer is not None:
            outer.missing.update(seen.missing)


def missed(shard: str, reason: str) -> None:
    """A fan-out read skipped ``shard`` (called by the sharded store only)."""
    seen = _CURRENT.get()
    if seen is not None:
        seen.missing.setdefault(shard, reason)
