"""The insights port: the aggregates a store keeps of finished runs (``core/views/_insights``).

Both event stores implement it (``_pginsights``, ``_meminsights``): a run is recorded in
the transaction that stores its terminal event and added to the aggregates by a later
roll-up that takes it off the record in its own transaction, so each run counts once.
A read rolls up first; each engine's housekeeping rolls up in the background.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Protocol, runtime_checkable

# Re-exported: what ``learned_costs`` returns (the store's front door names it).
from saga_engine.core.views._insight_report import LearnedCost as LearnedCost
from saga_engine.core.views._insights import Counters


@runtime_checkable
class InsightStore(Protocol):
    async def roll_up_insights(self, limit: int = 2000) -> int:
        """Adds up to ``limit`` runs that ended since the last roll-up to the aggregates
        (skipping those another roll-up holds); returns how many it added."""
        ...

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

    async def learned_costs(
        self, saga_type: str, since: datetime, until: datetime
    ) -> dict[str, LearnedCost]:
        """What each step of the type costs its participant, learnt from the handler times
        (and CPU times) its replies reported in [since, until), by step; a step no reply
        reported them for has none. (For a scheduler's ``cost="learned"``.)"""
        ...
