"""The batch-operation loop a worker runs: claim an operation, act on the sagas its filter
matches one by one (in saga-id order, at most ``batches.rate_per_s`` a second), record
each one's outcome, and complete it.

Every worker runs one; the operation's lease (``_pgbatches``) gives it to one engine at a
time, and to another once an engine that crashed holding it has let its lease expire.

**At most once per saga.** Each action goes through the engine's one path like an
operator's (``Engine.cancel``, ``.signal``, ``.retry_step``, ``.resume``, ``.start``
for a rerun), carrying the operation's id in the reason it records
(``core/planning/_batch_operations.reason_prefix``) and, for a signal, in its signal id. The progress (``cursor``)
moves after the action is durable; a crash in between leaves the saga to be read again,
and its history then shows the action (``acted_on``): it is counted as skipped, not
acted on twice. A rerun leaves the original's history alone: its new saga's id derives
from the operation and the original (``rerun_key_for``), so the repeat finds that saga
and is counted as skipped; the reruns an operation started are passed over, uncounted,
when its filter matches them (``started_by``).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from saga_engine.core.history._decision import saga_id_for
from saga_engine.core.history._events import RerunLink, SagaStarted
from saga_engine.core.planning._batch_operations import (
    BatchAction,
    acted_on,
    reason_prefix,
    rerun_key_for,
    signal_id_for,
    started_by,
)
from saga_engine.core.views._view import saga_view_of
from saga_engine.kernel._errors import (
    InvalidTransition,
    SagaError,
    SagaNotFound,
    ShardUnavailable,
    TransientError,
)
from saga_engine.kernel._settings import BatchSettings
from saga_engine.runner._engine import Engine
from saga_engine.runner._polling import PollingLoop
from saga_engine.store._batch_operation_store import (
    BatchRow,
    BatchStore,
    Dealt,
    Lease,
    SagaActionOutcome,
    saga_filter,
)
from saga_engine.store._coverage import coverage
from saga_engine.store._store import EventStore, SagaFilter, SagaRecord

__all__ = ["ACTIONS", "ALREADY_DONE", "CRASH_POINT", "BatchOperationRunner"]

log = logging.getLogger("saga_engine.batches")

#: The crash point between "the action on a saga is durable" and "the operation's
#: progress recorded it" (``SAGA_CRASH_AT=batch_after_action``).
CRASH_POINT = "batch_after_action"

#: How one action is applied to one saga: ``(engine, operation, saga_id, events, reason)``.
Act = Callable[[Engine, BatchRow, str, list[object], str], Awaitable[object]]


async def _cancel(engine: Engine, op: BatchRow, saga_id: str, _: list[object], why: str) -> object:
    return await engine.cancel(saga_id, why, principal=op.principal)


async def _signal(engine: Engine, op: BatchRow, saga_id: str, _: list[object], why: str) -> object:
    assert op.spec.signal is not None  # checked when the operation was created
    return await engine.signal(
        saga_id,
        op.spec.signal,
        op.spec.payload,
        signal_id=signal_id_for(op.operation_id, saga_id),
        principal=op.principal,
        reason=why,
    )


async def _retry(
    engine: Engine, op: BatchRow, saga_id: str, events: list[object], why: str
) -> object:
    stuck = saga_view_of(events, saga_id=saga_id).stuck_steps  # type: ignore[arg-type]
    if not stuck:
        raise InvalidTransition(f"saga {saga_id} has no stuck step to retry")
    # Every stuck compensation (independent steps undone in parallel may be stuck at once).
    done: object = None
    for step in stuck:
        done = await engine.retry_step(saga_id, step, reason=why, principal=op.principal)
    return done


async def _resume(engine: Engine, op: BatchRow, saga_id: str, _: list[object], why: str) -> object:
    return await engine.resume(saga_id, principal=op.principal, reason=why)


#: What an action returns when the saga's history does not show the operation's action
#: but the action was done already: a rerun's new saga exists (a crash in between).
ALREADY_DONE = object()


async def _rerun(
    engine: Engine, op: BatchRow, saga_id: str, events: list[object], why: str
) -> object:
    started = events[0] if events else None
    if not isinstance(started, SagaStarted):  # pragma: no cover - a history starts so
        raise InvalidTransition(f"saga {saga_id} has no saga_started event")
    key = rerun_key_for(op.operation_id, saga_id)
    try:
        await engine.get(saga_id_for(started.saga_type, key))
        return ALREADY_DONE
    except SagaNotFound:
        pass
    # The engine's start, as POST /sagas/{id}/rerun's: the original's input, the link to
    # it, and a key of the operation's (the same start if this one is ever repeated).
    link = RerunLink(saga_id=saga_id, principal=op.principal, reason=why)
    return await engine.start(started.saga_type, started.input, idempotency_key=key, rerun_of=link)


#: Each action's way to act on one saga (a new action: an entry here and a
#: ``BatchAction`` member).
ACTIONS: dict[BatchAction, Act] = {
    BatchAction.CANCEL: _cancel,
    BatchAction.SIGNAL: _signal,
    BatchAction.RETRY: _retry,
    BatchAction.RESUME: _resume,
    BatchAction.RERUN: _rerun,
}


def _utc_now() -> datetime:
    return datetime.now(UTC)


class _Pacer:
    """At most ``rate`` passes a second (sleeping is the point: it spaces the actions)."""

    def __init__(self, rate: float) -> None:
        self._gap = 1.0 / rate
        self._next = 0.0

    async def wait(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._next > now:
            await asyncio.sleep(self._next - now)
        self._next = max(self._next, now) + self._gap


class BatchOperationRunner:
    """Works through batch operations until stopped."""

    def __init__(
        self,
        engine: Engine,
        sagas: EventStore,
        store: BatchStore,
        settings: BatchSettings,
        *,
        owner: str,
        crash_hook: Callable[[str], None] | None = None,
    ) -> None:
        self._engine = engine
        self._sagas = sagas
        self._store = store
        self._settings = settings
        # Unique per process: a restarted engine waits for the lease its crash left.
        self._owner = f"{owner}/{uuid.uuid4().hex[:8]}"
        self._lease = timedelta(seconds=settings.lease_s)
        self._crash_hook = crash_hook
        self._loop = PollingLoop(
            "saga-batches",
            self._round,
            poll_s=settings.poll_s,
            what="batch operation",
            log=log,
        )

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        # Stopped mid-operation, the lease runs out and another engine goes on from the
        # cursor (the saga in flight is checked against its history).
        await self._loop.stop()

    async def run_once(self) -> BatchRow | None:
        """Claims one operation and works on it until it ends or is lost; the operation as
        it was claimed, or None if there was none to claim."""
        row = await self._store.claim(Lease(self._owner, _utc_now(), self._lease))
        if row is not None:
            await self._work(row)
        return row

    async def _round(self) -> float:
        """One operation worked on; at once again if there was one (another may wait)."""
        return 0.0 if await self.run_once() is not None else self._settings.poll_s

    async def _work(self, op: BatchRow) -> None:
        log.info("batch operation %s (%s): from %s", op.operation_id, op.spec.action, op.cursor)
        pacer = _Pacer(self._settings.rate_per_s)
        cursor = op.cursor
        where = saga_filter(op.spec.filter)
        while True:
            page = await self._page(where, cursor)
            if not page:
                if await self._store.finish(op.operation_id, self._owner, _utc_now()):
                    log.info("batch operation %s completed", op.operation_id)
                return
            for record in page:
                await pacer.wait()
                outcome, error = await self._one(op, record.saga_id)
                lease = Lease(self._owner, _utc_now(), self._lease)
                dealt = Dealt(record.saga_id, outcome, error)
                if not await self._store.advance(op.operation_id, lease, dealt):
                    log.info("batch operation %s: cancelled or taken over", op.operation_id)
                    return
                cursor = record.saga_id

    async def _page(self, where: SagaFilter, cursor: str | None) -> list[SagaRecord]:
        """The next page of the filter's sagas after ``cursor``, from every shard: a page
        a shard was missing from would move the cursor past its sagas for good, so a shard
        that does not answer fails the page (``ShardUnavailable``, transient: the loop
        claims the operation again and goes on from the cursor once it answers)."""
        with coverage() as seen:
            page = await self._sagas.list_sagas(
                where, limit=self._settings.page_size, after_id=cursor
            )
        if seen.partial:
            raise ShardUnavailable(", ".join(seen.missing), "; ".join(seen.missing.values()))
        return page

    async def _one(self, op: BatchRow, saga_id: str) -> tuple[SagaActionOutcome | None, str | None]:
        """Acts on one saga, unless its history shows the operation did already (None:
        a saga the operation started itself, passed over)."""
        try:
            loaded = await self._sagas.load_run(saga_id)
            events: list[object] = [stored.event for stored in loaded.events]
            if started_by(events, op.operation_id):
                return None, None
            if acted_on(events, op.operation_id):
                return SagaActionOutcome.SKIPPED, None
            why = f"{reason_prefix(op.operation_id)} {op.spec.reason}".rstrip()
            decision = await ACTIONS[op.spec.action](self._engine, op, saga_id, events, why)
            if decision is ALREADY_DONE:
                return SagaActionOutcome.SKIPPED, None
        except TransientError:
            raise  # the loop claims the operation again and goes on from this saga
        except Exception as exc:
            # The saga's state refuses the action (PermanentError), it was deleted since
            # it was listed, or its history cannot be read here (a newer engine's, a
            # codec's key): counted with the reason, not retried, so that one saga never
            # holds up the operation.
            if not isinstance(exc, SagaError):
                log.exception("batch operation %s on saga %s", op.operation_id, saga_id)
            return SagaActionOutcome.FAILED, str(exc) or type(exc).__name__
        dropped = getattr(decision, "dropped", None)
        if dropped is not None:  # the engine recorded nothing (a signal to a parked saga)
            return SagaActionOutcome.FAILED, f"the saga dropped it ({dropped})"
        if self._crash_hook is not None:
            self._crash_hook(CRASH_POINT)
        return SagaActionOutcome.ACTED, None
