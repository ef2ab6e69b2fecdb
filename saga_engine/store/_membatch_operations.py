"""The batch-operation store port in memory: the contract suite's second adapter. It fails
as the Postgres one does: BatchNotFound and InvalidTransition where Postgres raises them,
a claim takes only an operation whose lease has expired, and a write by an engine that
no longer holds the running operation records nothing."""

from __future__ import annotations

import dataclasses
from datetime import datetime

from saga_engine.core.planning._batch_operations import BatchSpec, BatchState, check_batch_move
from saga_engine.kernel._errors import BatchNotFound
from saga_engine.store._batch_operation_store import MAX_ERRORS, BatchRow, Dealt, Lease

__all__ = ["InMemoryBatchStore"]


class InMemoryBatchStore:
    def __init__(self) -> None:
        self._rows: dict[str, BatchRow] = {}

    async def close(self) -> None:
        return None

    async def create(
        self, operation_id: str, spec: BatchSpec, principal: str, total: int, now: datetime
    ) -> BatchRow:
        row = BatchRow(
            operation_id=operation_id,
            spec=spec,
            principal=principal,
            state=BatchState.RUNNING,
            total=total,
            acted=0,
            skipped=0,
            failed=0,
            cursor=None,
            errors=[],
            lease_owner=None,
            lease_until=None,
            created_at=now,
            updated_at=now,
            finished_at=None,
        )
        self._rows[operation_id] = row
        return row

    async def get(self, operation_id: str) -> BatchRow:
        try:
            return self._rows[operation_id]
        except KeyError:
            raise BatchNotFound(operation_id) from None

    async def list(self, *, limit: int = 50) -> list[BatchRow]:
        rows = sorted(
            self._rows.values(), key=lambda r: (r.created_at, r.operation_id), reverse=True
        )
        return rows[:limit]

    async def claim(self, lease: Lease) -> BatchRow | None:
        free = [
            r
            for r in self._rows.values()
            if r.state is BatchState.RUNNING
            and (
                r.lease_until is None or r.lease_until <= lease.now or r.lease_owner == lease.owner
            )
        ]
        if not free:
            return None
        row = min(free, key=lambda r: (r.created_at, r.operation_id))
        row = dataclasses.replace(row, lease_owner=lease.owner, lease_until=lease.until)
        self._rows[row.operation_id] = row
        return row

    def _held(self, operation_id: str, owner: str) -> BatchRow | None:
        row = self._rows.get(operation_id)
        if row is None or row.state is not BatchState.RUNNING or row.lease_owner != owner:
            return None
        return row

    async def advance(self, operation_id: str, lease: Lease, dealt: Dealt | None = None) -> bool:
        row = self._held(operation_id, lease.owner)
        if row is None:
            return False
        if dealt is not None:
            acted, skipped, failed = dealt.tallies()
            entry = dealt.error_entry()
            row = dataclasses.replace(
                row,
                acted=row.acted + acted,
                skipped=row.skipped + skipped,
                failed=row.failed + failed,
                cursor=dealt.saga_id,
                errors=[*row.errors, entry]
                if entry is not None and len(row.errors) < MAX_ERRORS
                else row.errors,
            )
        self._rows[operation_id] = dataclasses.replace(
            row, lease_until=lease.until, updated_at=lease.now
        )
        return True

    async def finish(self, operation_id: str, owner: str, now: datetime) -> bool:
        row = self._held(operation_id, owner)
        if row is None:
            return False
        self._rows[operation_id] = dataclasses.replace(
            row,
            state=BatchState.COMPLETED,
            updated_at=now,
            finished_at=now,
            lease_owner=None,
            lease_until=None,
        )
        return True

    async def cancel(self, operation_id: str, now: datetime) -> BatchRow:
        row = await self.get(operation_id)
        check_batch_move(row.state, BatchState.CANCELLED)
        row = dataclasses.replace(
            row,
            state=BatchState.CANCELLED,
            updated_at=now,
            finished_at=now,
            lease_owner=None,
            lease_until=None,
        )
        self._rows[operation_id] = row
        return row
