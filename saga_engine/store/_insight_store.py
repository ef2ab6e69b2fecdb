"""The insights port: the aggregates a store keeps of finished runs (``core/_insights``).

Both event stores implement it (``_pginsights``, ``_meminsights``): a run is added when
its terminal event is stored, in the same transaction, so each run counts once.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Protocol, runtime_checkable

from saga_engine.core._insights import Counters


@runtime_checkable
class InsightStore(Protocol):
    async def insight_rows(
        self, saga_type: str, since: datetime, until: datetime
    ) -> list[tuple[str, str, str, Counters]]:
        """(facet, key, detail, counters) of the type's buckets in [since, until)."""
        ...

    async def sla_breaches(
        self, saga_type: str, since: datetime, until: datetime, sla: timedelta, limit: int = 20
    ) -> list[str]:
        """Ids of the latest runs of the type that ended in [since, until) past ``sla``."""
        ...
