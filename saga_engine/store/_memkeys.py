"""The in-memory store's per-key concurrency slots: ``KeySlotStore`` as migration 0012's
table behaves, for the testing kit and unit tests."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from saga_engine.store._keyslots import KeySlot, KeyTurn, promote, turn_of
from saga_engine.store._store import SagaRecord


class InMemoryKeySlots:
    """Mixed into InMemoryEventStore: the rows, in FIFO order (a dict keeps insertion
    order, the table's ``position``)."""

    _records: dict[str, SagaRecord]
    #: Set by the store's __init__.
    _key_rows: dict[str, KeySlot]

    def _key_table(self) -> dict[str, KeySlot]:
        return self._key_rows

    def _of_key(self, saga_type: str, key: str) -> list[KeySlot]:
        rows = self._key_table().values()
        return [r for r in rows if (r.saga_type, r.key) == (saga_type, key)]

    def _grant(self, saga_type: str, key: str, at: datetime) -> tuple[list[KeySlot], list[str]]:
        rows = self._of_key(saga_type, key)
        granted = promote(rows, [r.saga_id for r in rows])
        table = self._key_table()
        for saga_id in granted:
            table[saga_id] = replace(table[saga_id], held=True, acquired_at=at)
        return self._of_key(saga_type, key), granted

    async def acquire_key(
        self, saga_type: str, key: str, saga_id: str, limit: int, at: datetime
    ) -> KeyTurn:
        table = self._key_table()
        if saga_id not in table:  # asking again keeps the saga's place
            table[saga_id] = KeySlot(saga_id, saga_type, key, False, limit, at, None)
        rows, _ = self._grant(saga_type, key, at)
        return turn_of(saga_id, rows, [r.saga_id for r in rows])

    async def release_key(self, saga_id: str, at: datetime) -> list[str]:
        row = self._key_table().pop(saga_id, None)
        if row is None:
            return []
        return self._grant(row.saga_type, row.key, at)[1]

    async def sweep_keys(self, at: datetime, limit: int = 500) -> list[str]:
        ended = [
            saga_id
            for saga_id in self._key_table()
            if (record := self._records.get(saga_id)) is None or record.status.is_terminal
        ][:limit]
        granted: list[str] = []
        for saga_id in ended:
            granted += await self.release_key(saga_id, at)
        return granted

    async def key_slots(
        self, saga_type: str | None = None, key: str | None = None
    ) -> list[KeySlot]:
        rows = [
            r
            for r in self._key_table().values()
            if saga_type in (None, r.saga_type) and key in (None, r.key)
        ]
        # Sorted is stable: FIFO (insertion) order within held and waiting.
        return sorted(rows, key=lambda r: (r.saga_type, r.key, not r.held))
