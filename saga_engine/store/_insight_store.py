"""The insights port: the aggregates a store keeps of finished runs (``core/views/_insights``).

Both event stores implement it (``_pginsights``, ``_meminsights``): a run is recorded in
the transaction that stores its terminal event and added to the aggregates by a later
roll-up that takes it off the record in its own transaction, so each run counts once.
A read rolls up first; each engine's housekeeping rolls up in the background. The
aggregates are kept per flow policy (the one each run was started under): a read sums
over every policy unless it names one.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Protocol, runtime_checkable

# Re-exported: what ``learned_costs`` returns (the store's front door names it).
from saga_engine.core.views._insight_report import LearnedCost as LearnedCost
from saga_engine.core.views._insights import InsightRow


@runtime_checkable
class InsightStore(Protocol):
    async def roll_up_insights(self, limit: int = 2000) -> int:
        """Adds up to ``limit`` runs that ended since the last roll-up to the aggregates
        (skipping those another roll-up holds); returns how many it added."""
        ...

    async def insight_rows(
        self, saga_type: str, since: datetime, until: datetime, flow_policy: int | None = None
    ) -> list[InsightRow]:
        """(facet, key, detail, counters) of the type's buckets in [since, until), summed
        per (facet, key, detail), in no particular order: over every flow policy (None),
        or of the runs started under ``flow_policy`` only."""
        ...

    async def insight_policies(
        self, saga_type: str, since: datetime, until: datetime
    ) -> dict[int, int]:
        """The flow policies of the type's runs that ended in [since, until), each with
        how many, by version (ascending); a policy none of whose runs ended there is
        absent."""
        ...

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
        ...

    async def learned_costs(
        self, saga_type: str, since: datetime, until: datetime
    ) -> dict[str, LearnedCost]:
        """What each step of the type costs its participant, learnt from the handler times
        (and CPU times) its replies reported in [since, until), by step; a step no reply
        reported them for has none. (For a scheduler's ``cost="learned"``.) Over every
        flow policy: a handler's time does not depend on the policy its command was sent
        under (which changes only when a command is sent), so every reply is a sample."""
        ...
