"""Per-saga locks that go away with the saga.

The engine serialises everything done to one saga (its inputs, timers, operator actions)
with one asyncio lock per saga id. A dict of locks that only grows keeps one for every
saga the process has ever seen; here a lock lives only while someone holds it or waits
for it, so an engine that has driven millions of sagas holds locks for the few it is
working on right now.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass


@dataclass(slots=True)
class _Entry:
    lock: asyncio.Lock
    #: Holders and waiters: the entry is dropped when the last of them is done.
    users: int = 0


class KeyedLocks:
    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}

    async def acquire(self, key: str) -> None:
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry(asyncio.Lock())
        # Counted before the wait: a waiter keeps the entry alive, so the holder's
        # release cannot drop the lock it is queued on.
        entry.users += 1
        try:
            await entry.lock.acquire()
        except BaseException:
            self._done(key, entry)
            raise

    def release(self, key: str) -> None:
        entry = self._entries[key]
        entry.lock.release()
        self._done(key, entry)

    def held(self, key: str) -> bool:
        """Someone holds or waits for ``key``'s lock."""
        return key in self._entries

    def hold(self, key: str) -> _Held:
        """``async with locks.hold(key):`` holds ``key``'s lock for the block."""
        return _Held(self, key)

    def __len__(self) -> int:
        return len(self._entries)

    def _done(self, key: str, entry: _Entry) -> None:
        entry.users -= 1
        if entry.users == 0:
            del self._entries[key]


class _Held:
    __slots__ = ("_key", "_locks")

    def __init__(self, locks: KeyedLocks, key: str) -> None:
        self._locks = locks
        self._key = key

    async def __aenter__(self) -> None:
        await self._locks.acquire(self._key)

    async def __aexit__(self, *exc: object) -> None:
        self._locks.release(self._key)
