"""The in-memory store's insights: the same aggregates as the Postgres store's
(``_pginsights``): a run is recorded when its terminal event is stored and added to the
aggregates by the next roll-up (a read rolls up first), per flow policy."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta

from saga_engine.core.history._events import TERMINAL_EVENTS, SagaStarted
from saga_engine.core.views._insight_report import LearnedCost, learned_costs
from saga_engine.core.views._insights import (
    Counters,
    InsightRow,
    RowKey,
    aggregate,
    mark_of,
    summarize,
)
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

    async def _window(
        self, saga_type: str, since: datetime, until: datetime
    ) -> Iterator[tuple[RowKey, Counters]]:
        """The type's rows in [since, until); the runs ended so far are rolled up first."""
        await self.roll_up_insights(len(self._insights_pending))
        since, until = as_utc(since), as_utc(until)
        return (
            (k, c)
            for k, c in sorted(self._insights.items())
            if k[0] == saga_type and since <= k[1] < until
        )

    async def insight_rows(
        self, saga_type: str, since: datetime, until: datetime, flow_policy: int | None = None
    ) -> list[InsightRow]:
        """(facet, key, detail, counters) of the type's buckets in [since, until), summed
        per (facet, key, detail): over every flow policy (None), or of one."""
        summed: dict[tuple[str, str, str], Counters] = {}
        for (_, _, facet, key, detail, policy), c in await self._window(saga_type, since, until):
            if flow_policy is None or policy == flow_policy:
                summed.setdefault((facet, key, detail), Counters()).add(c)
        return [(facet, key, detail, c) for (facet, key, detail), c in summed.items()]

    async def insight_policies(
        self, saga_type: str, since: datetime, until: datetime
    ) -> dict[int, int]:
        """The flow policies of the type's runs that ended in [since, until), with how
        many each, by version."""
        runs: dict[int, int] = {}
        for (_, _, facet, _, _, policy), c in await self._window(saga_type, since, until):
            if facet == "type":
                runs[policy] = runs.get(policy, 0) + c.runs
        return dict(sorted(runs.items()))

    async def learned_costs(
        self, saga_type: str, since: datetime, until: datetime
    ) -> dict[str, LearnedCost]:
        """Each step's learned cost in [since, until), by step (``learned_costs``)."""
        return learned_costs(saga_type, await self.insight_rows(saga_type, since, until))

    async def sla_breaches(
        self,
        saga_type: str,
        since: datetime,
        until: datetime,
        sla: timedelta,
        limit: int = 20,
        flow_policy: int | None = None,
    ) -> list[str]:
        """Ids of the latest runs of the type that ended in [since, until) past ``sla``
        (of one flow policy, or of any: None)."""
        since, until = as_utc(since), as_utc(until)
        found = [
            (ended, saga_id)
            for saga_id, ended in self._ended.items()
            if (r := self._records.get(saga_id)) is not None
            and r.saga_type == saga_type
            and since <= as_utc(ended) < until
            and as_utc(ended) - as_utc(r.created_at) > sla
            and (flow_policy is None or self._flow_policy(saga_id) == flow_policy)
        ]
        return [saga_id for _, saga_id in sorted(found, reverse=True)[:limit]]

    def _flow_policy(self, saga_id: str) -> int:
        """The flow policy the saga was started under (1: its start recorded none)."""
        events = self._events.get(saga_id)
        first = events[0].event if events else None
        return (first.flow_policy if isinstance(first, SagaStarted) else None) or 1
