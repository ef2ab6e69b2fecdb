"""The in-memory store's insights: the same aggregates as the Postgres store's
(``_pginsights``): a run is recorded when its terminal event is stored and added to the
aggregates by the next roll-up (a read rolls up first)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from saga_engine.core.history._events import TERMINAL_EVENTS
from saga_engine.core.views._insight_report import LearnedCost, learned_costs
from saga_engine.core.views._insights import Counters, RowKey, aggregate, mark_of, summarize
from saga_engine.store._store import SagaRecord, StoredEvent, as_utc


class InMemoryInsights:
    """Mixed into InMemoryEventStore."""

    _records: dict[str, SagaRecord]
    _events: dict[str, list[StoredEvent]]
    _ended: dict[str, datetime]
    _insights: dict[RowKey, Counters]
    _insights_pending: list[str]

    def _count_run(self, saga_id: str, new: Sequence[StoredEvent]) -> None:
        """Records the run for the roll-up if ``new`` (its events just stored) end it."""
        if any(isinstance(s.event, TERMINAL_EVENTS) for s in new):
            self._insights_pending.append(saga_id)

    async def roll_up_insights(self, limit: int = 2000) -> int:
        """Adds up to ``limit`` runs that ended since the last roll-up to the aggregates;
        returns how many it added."""
        taken, self._insights_pending = (
            self._insights_pending[:limit],
            self._insights_pending[limit:],
        )
        summaries = (
            summarize([mark_of(s.event) for s in self._events.get(saga_id, [])])
            for saga_id in taken
        )
        rows = aggregate(s for s in summaries if s is not None)
        for key, counters in rows.items():
            self._insights.setdefault(key, Counters()).add(counters)
        return len(taken)

    async def insight_rows(
        self, saga_type: str, since: datetime, until: datetime
    ) -> list[tuple[str, str, str, Counters]]:
        """(facet, key, detail, counters) of the type's buckets in [since, until); the
        runs ended so far are rolled up first."""
        await self.roll_up_insights(len(self._insights_pending))
        since, until = as_utc(since), as_utc(until)
        return [
            (facet, key, detail, replace(c, hist=list(c.hist)))
            for (t, bucket, facet, key, detail), c in sorted(self._insights.items())
            if t == saga_type and since <= bucket < until
        ]

    async def learned_costs(
        self, saga_type: str, since: datetime, until: datetime
    ) -> dict[str, LearnedCost]:
        """Each step's learned cost in [since, until), by step (``learned_costs``)."""
        return learned_costs(saga_type, await self.insight_rows(saga_type, since, until))

    async def sla_breaches(
        self, saga_type: str, since: datetime, until: datetime, sla: timedelta, limit: int = 20
    ) -> list[str]:
        """Ids of the latest runs of the type that ended in [since, until) past ``sla``."""
        since, until = as_utc(since), as_utc(until)
        found = [
            (ended, saga_id)
            for saga_id, ended in self._ended.items()
            if (r := self._records.get(saga_id)) is not None
            and r.saga_type == saga_type
            and since <= as_utc(ended) < until
            and as_utc(ended) - as_utc(r.created_at) > sla
        ]
        return [saga_id for _, saga_id in sorted(found, reverse=True)[:limit]]
