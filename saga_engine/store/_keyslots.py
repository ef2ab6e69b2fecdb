"""The port of per-key concurrency's slots (``Saga.concurrency``): who holds a key's
slots, who waits for one and in which order. Postgres (``_pgkeys``, migration 0012)
and in memory (``_memkeys``), both mixed into their event store; one contract suite
(``tests/internal/contract/test_key_slots.py``).

Every method is idempotent: asking again for a saga's slot keeps its place, releasing
a saga that holds nothing releases nothing. The runner derives what it asks from the
saga's history (``runner/_concurrency_keys.py``), so a call lost in a crash is simply made again.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class KeyTurn:
    """Where a saga stands for its key after asking."""

    held: bool
    #: The sagas holding the key's slots now (this one among them when ``held``).
    holders: tuple[str, ...]
    #: Its place among those waiting (1: next); 0 when it holds a slot.
    position: int


@dataclass(frozen=True, slots=True)
class KeySlot:
    saga_id: str
    saga_type: str
    key: str
    held: bool
    limit: int
    queued_at: datetime
    acquired_at: datetime | None


@runtime_checkable
class KeySlotStore(Protocol):
    async def acquire_key(
        self, saga_type: str, key: str, saga_id: str, limit: int, at: datetime
    ) -> KeyTurn:
        """Queues the saga for ``key`` (once: asking again keeps its place), grants the
        free slots to the head of the queue, and says where the saga stands."""
        ...

    async def release_key(self, saga_id: str, at: datetime) -> list[str]:
        """Removes the saga's slot or place; the sagas granted a slot by it (to wake)."""
        ...

    async def sweep_keys(self, at: datetime, limit: int = 500) -> list[str]:
        """Releases the slots of sagas that ended (or no longer exist); those granted."""
        ...

    async def key_slots(
        self, saga_type: str | None = None, key: str | None = None
    ) -> list[KeySlot]:
        """The slots and the queue, by type, key, then held first and FIFO."""
        ...


def promote(rows: list[KeySlot], order: list[str]) -> list[str]:
    """The queued sagas of one key that get a slot now: as many as the head's limit
    leaves free, first come first served. ``order`` is the key's rows' FIFO order."""
    by_id = {r.saga_id: r for r in rows}
    holders = sum(1 for r in rows if r.held)
    queued = [by_id[i] for i in order if not by_id[i].held]
    if not queued:
        return []
    return [r.saga_id for r in queued[: max(0, queued[0].limit - holders)]]


def turn_of(saga_id: str, rows: list[KeySlot], order: list[str]) -> KeyTurn:
    by_id = {r.saga_id: r for r in rows}
    holders = tuple(i for i in order if by_id[i].held)
    queued = [i for i in order if not by_id[i].held]
    if saga_id in holders:
        return KeyTurn(True, holders, 0)
    return KeyTurn(False, holders, queued.index(saga_id) + 1 if saga_id in queued else 0)


def with_positions(slots: list[KeySlot]) -> list[tuple[KeySlot, int]]:
    """``key_slots``' rows, each with its place among its key's waiting sagas (1: next;
    0 for a holder)."""
    waiting: dict[tuple[str, str], int] = {}
    out = []
    for slot in slots:
        position = 0
        if not slot.held:
            key = (slot.saga_type, slot.key)
            position = waiting[key] = waiting.get(key, 0) + 1
        out.append((slot, position))
    return out
