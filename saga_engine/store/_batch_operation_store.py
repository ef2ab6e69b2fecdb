"""The batch-operation store port: where operations (``POST /batch-operations``) and their
progress are kept, and the lease by which one engine works on each.

Two adapters: ``_pgbatches.PostgresBatchStore`` (a worker's; migration 0013) and
``_membatches.InMemoryBatchStore`` (unit tests'). One contract suite
(``tests/internal/contract/test_batch_store.py``) runs against both.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Final, Protocol

from saga_engine.core.planning._batch_operations import BatchFilter, BatchSpec, BatchState
from saga_engine.kernel._serde import JsonDict
from saga_engine.store._store import EventStore, SagaFilter

__all__ = [
    "MAX_ERRORS",
    "SAMPLE",
    "BatchRow",
    "BatchStore",
    "Dealt",
    "Lease",
    "SagaActionOutcome",
    "count_matching",
    "saga_filter",
]

#: The sagas a count lists as a sample of what matches.
SAMPLE: Final = 20

#: The per-saga errors an operation keeps (the first ones); the count goes on.
MAX_ERRORS: Final = 50


class SagaActionOutcome(StrEnum):
    """What an operation did with one saga."""

    ACTED = "acted"
    #: Its history shows the operation already acted on it (a crash in between).
    SKIPPED = "skipped"
    #: The engine refused the action (the saga's state does not allow it).
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Lease:
    """An engine's hold on an operation: ``owner`` holds it from ``now`` for ``length``."""

    owner: str
    now: datetime
    length: timedelta

    @property
    def until(self) -> datetime:
        return self.now + self.length


@dataclass(frozen=True, slots=True)
class Dealt:
    """One saga an operation dealt with: what it did (None: passed over, a saga the
    operation started itself), and why the action failed."""

    saga_id: str
    outcome: SagaActionOutcome | None = None
    error: str | None = None

    def tallies(self) -> tuple[int, int, int]:
        """What it adds to the operation's (acted, skipped, failed)."""
        return (
            int(self.outcome is SagaActionOutcome.ACTED),
            int(self.outcome is SagaActionOutcome.SKIPPED),
            int(self.outcome is SagaActionOutcome.FAILED),
        )

    def error_entry(self) -> JsonDict | None:
        """The entry it adds to the operation's errors (the first MAX_ERRORS are kept)."""
        return None if self.error is None else {"saga_id": self.saga_id, "error": self.error}


@dataclass(frozen=True, slots=True)
class BatchRow:
    """An operation as stored, with its progress."""

    operation_id: str
    spec: BatchSpec
    principal: str
    state: BatchState
    #: The sagas the filter matched when the operation was created.
    total: int
    acted: int
    skipped: int
    failed: int
    #: The last saga dealt with (the operation goes on after it, in id order).
    cursor: str | None
    #: ``{"saga_id", "error"}`` of the first MAX_ERRORS sagas the action failed on.
    errors: list[JsonDict]
    lease_owner: str | None
    lease_until: datetime | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None

    @property
    def done(self) -> int:
        return self.acted + self.skipped + self.failed

    def as_json(self) -> JsonDict:
        """The operation as the admin API and the client show it."""
        spec = self.spec
        return {
            "id": self.operation_id,
            "action": spec.action.value,
            "filter": spec.filter.model_dump(mode="json"),
            "reason": spec.reason,
            "signal": spec.signal,
            "payload": spec.payload,
            "principal": self.principal,
            "state": self.state.value,
            "total": self.total,
            "done": self.done,
            "acted": self.acted,
            "skipped": self.skipped,
            "failed": self.failed,
            "errors": list(self.errors),
            "engine": self.lease_owner,
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
        }


class BatchStore(Protocol):
    async def create(
        self, operation_id: str, spec: BatchSpec, principal: str, total: int, now: datetime
    ) -> BatchRow:
        """A new running operation (BatchConflict-free: the id is a fresh uuid)."""
        ...

    async def get(self, operation_id: str) -> BatchRow:
        """Raises BatchNotFound."""
        ...

    async def list(self, *, limit: int = 50) -> list[BatchRow]:
        """The newest operations first."""
        ...

    async def claim(self, lease: Lease) -> BatchRow | None:
        """A running operation no other engine holds (its lease expired, or the lease's
        owner holds it), now held by that owner until ``lease.until``; None if there is
        none."""
        ...

    async def advance(self, operation_id: str, lease: Lease, dealt: Dealt | None = None) -> bool:
        """Records one saga dealt with (its id becomes the cursor; none: the lease is only
        renewed), and renews the lease. False, recording nothing, when the lease's owner
        no longer holds the running operation (cancelled, or taken over): stop working on
        it."""
        ...

    async def finish(self, operation_id: str, owner: str, now: datetime) -> bool:
        """Completes the operation ``owner`` holds; False as for ``advance``."""
        ...

    async def cancel(self, operation_id: str, now: datetime) -> BatchRow:
        """Cancels a running operation (the engine working on it stops at its next saga).
        Raises BatchNotFound, or InvalidTransition for one already finished."""
        ...

    async def close(self) -> None: ...


def saga_filter(where: BatchFilter) -> SagaFilter:
    """The store's filter an operation's filter is."""
    return SagaFilter(
        statuses=frozenset(where.statuses) if where.statuses is not None else None,
        saga_type=where.saga_type,
        created_after=where.created_after,
        created_before=where.created_before,
        updated_after=where.updated_after,
        updated_before=where.updated_before,
        search=where.q,
        attributes=where.attributes,
    )


async def count_matching(store: EventStore, where: BatchFilter) -> tuple[int, list[str]]:
    """How many sagas match now, and the first few ids (keyset pages of the list query,
    each answered by an index)."""
    matching = saga_filter(where)
    count, after = 0, None
    sample: list[str] = []
    while True:
        page = await store.list_sagas(matching, limit=1000, after_id=after)
        if not page:
            return count, sample
        count += len(page)
        sample.extend(r.saga_id for r in page[: max(0, SAMPLE - len(sample))])
        after = page[-1].saga_id
