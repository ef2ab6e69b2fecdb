"""The sharded store's rollouts and flow policies (``RolloutStore``): not per saga, so
they live in the control database, which every engine of every shard reads. The sharded
store hands its rollout calls to the control database's store (``_pgrollouts``
``PostgresRolloutStore`` in production), opened on first use and closed with it, so
that the engine, the admin API and the CLI (through it) read and write one set of rows.

Mixed into ``ShardedEventStore``; the routing of per-saga calls is ``ShardRouter``'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Protocol

from saga_engine.core.planning._rollout import Rollout, RolloutChange, RolloutSpec, RolloutStore
from saga_engine.kernel._errors import ShardMapError
from saga_engine.store._shard_router import ShardRouter

__all__ = ["ControlOpener", "ControlStore", "ShardedControl"]


class ControlStore(RolloutStore, Protocol):
    """What the control database keeps for a sharded store: the rollouts (and flow
    policies' rollouts) with their audit trail."""

    async def close(self) -> None: ...


#: Opens the control database's store (``PostgresRolloutStore.connect(pg.control())``).
ControlOpener = Callable[[], Awaitable[ControlStore]]


class ShardedControl(ShardRouter):
    """``RolloutStore`` past one database: the control database's."""

    _control_opener: ControlOpener | None = None
    _control_store: ControlStore | None = None
    _control_lock: asyncio.Lock | None = None

    def attach_control(self, opener: ControlOpener | None) -> None:
        """Where the control database's store comes from (None: a store without one,
        whose rollout calls raise ``ShardMapError``)."""
        self._control_opener = opener
        self._control_lock = asyncio.Lock()

    async def control(self) -> ControlStore:
        """The control database's store, opened on first use (once)."""
        store = self._control_store
        if store is not None:
            return store
        if self._control_opener is None or self._control_lock is None:
            raise ShardMapError(
                "this sharded store was opened without its control database, where "
                "rollouts and flow policies live: open it with connect_event_store"
            )
        async with self._control_lock:
            if self._control_store is None:
                self._control_store = await self._control_opener()
            return self._control_store

    async def rollouts(self) -> list[Rollout]:
        return await (await self.control()).rollouts()

    async def set_rollout(
        self,
        saga_type: str,
        spec: RolloutSpec | None,
        *,
        principal: str,
        reason: str,
        at: datetime,
    ) -> RolloutChange:
        return await (await self.control()).set_rollout(
            saga_type, spec, principal=principal, reason=reason, at=at
        )

    async def rollout_audit(
        self, saga_type: str | None = None, limit: int = 50
    ) -> list[RolloutChange]:
        return await (await self.control()).rollout_audit(saga_type, limit)

    async def close(self) -> None:
        """Closes the shards' stores and the control database's."""
        try:
            await super().close()
        finally:
            control, self._control_store = self._control_store, None
            if control is not None:
                await control.close()
