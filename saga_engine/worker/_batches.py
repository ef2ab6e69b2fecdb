"""The batch operations' pieces a worker builds: the Postgres batch store (the admin API's
too) and the loop that works through the operations (``runner/_batch_operations``)."""

from __future__ import annotations

from collections.abc import Callable

from saga_engine.kernel._errors import MigrationError
from saga_engine.kernel._settings import Settings
from saga_engine.runner._batch_operations import BatchOperationRunner
from saga_engine.runner._engine import Engine
from saga_engine.store._pgbatch_operations import PostgresBatchStore
from saga_engine.store._store import EventStore

__all__ = ["WorkerBatches"]


class WorkerBatches:
    """The store, and the runner (unless ``batches.enabled`` is off)."""

    def __init__(self, store: PostgresBatchStore, runner: BatchOperationRunner | None) -> None:
        self.store = store
        self.runner = runner

    @classmethod
    async def open(
        cls,
        settings: Settings,
        engine: Engine,
        sagas: EventStore,
        owner: str,
        crash_hook: Callable[[str], None] | None,
    ) -> WorkerBatches:
        store = await PostgresBatchStore.connect(settings.pg.control())
        try:
            if not await store.migrated():
                raise MigrationError(
                    f"schema {settings.pg.db_schema!r} lacks saga_batch_operations "
                    "(migration 0013): run `saga migrate`"
                )
        except BaseException:
            await store.close()
            raise
        runner = None
        if settings.batches.enabled:
            runner = BatchOperationRunner(
                engine, sagas, store, settings.batches, owner=owner, crash_hook=crash_hook
            )
        return cls(store, runner)

    def start(self) -> None:
        if self.runner is not None:
            self.runner.start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.stop()

    async def close(self) -> None:
        await self.stop()
        await self.store.close()
