"""Which sagas this engine drives, when several engines share them.

An engine of a worker owns the sagas of its inbox partitions (``Ownership``, the
worker's ``InboxOwnership``); an engine on its own (the testing kit, a script) drives
every saga it touches.
"""

from __future__ import annotations

import logging

from saga_engine.kernel._errors import SagaError
from saga_engine.kernel._retry import HANDLER
from saga_engine.runner._observer import EngineStats
from saga_engine.transport._bus import Ownership

log = logging.getLogger("saga_engine.engine")


class Owners:
    def __init__(self, ownership: Ownership | None, stats: EngineStats) -> None:
        self._ownership = ownership
        self._stats = stats

    @property
    def shared(self) -> bool:
        """Sagas are shared between engines: one this engine does not own is let go."""
        return self._ownership is not None

    def owns(self, saga_id: str) -> bool:
        return self._ownership is None or self._ownership.owns(saga_id)

    def shares_and_owns(self, saga_id: str) -> bool:
        """Sagas are shared between engines and this one owns the saga: a conflicting
        write means another engine acted on it (and the owner should rebuild its copy),
        not that this engine is the stale one. Without an Ownership there is no way to
        tell, so a conflict is the caller's to handle."""
        return self._ownership is not None and self._ownership.owns(saga_id)

    async def tell_owner(self, saga_id: str) -> None:
        """Asks the saga's owner to reload it (this engine changed its history)."""
        assert self._ownership is not None
        backoff = HANDLER.backoff()
        for attempt in (1, 2, 3):
            try:
                await self._ownership.notify_owner(saga_id)
                return
            except SagaError as exc:
                if attempt == 3:
                    # The change is durable. The owner still catches up at its next write
                    # or reply for the saga (a conflict or an unknown command makes it
                    # reload), or when the partition is next assigned; a saga waiting only
                    # on a timer this change created waits until then.
                    self._stats.inc("reload_notice_lost")
                    log.error("could not tell the owner of saga %s to reload it: %s", saga_id, exc)
                    return
                await backoff.sleep()
