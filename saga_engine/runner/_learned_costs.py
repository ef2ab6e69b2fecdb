"""What steps were measured to cost their participants: the table ``cost="learned"``
reads (``core/history/_cost.learned_cost``), kept fresh from the insights.

Every engine reads, once a minute, each saga type's learned costs over the last hour
(``InsightStore.learned_costs``: the handler and CPU times the kits reported in their
replies) and keeps them in memory; a step issued with ``cost="learned"`` is recorded with
its current figure (``command_issued.cost``), so a re-send after a recovery costs what it
cost. A fan-out's items (``lines[0]``, ``lines[1]``, ...) share their node's figure.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

from saga_engine.core.authoring._graph import fan_out_item
from saga_engine.core.history._cost import Cost, learned_cost
from saga_engine.core.views._insight_report import LearnedCost
from saga_engine.kernel._errors import TransientError
from saga_engine.store._insight_store import InsightStore
from saga_engine.telemetry._telemetry import detach_from_trace

log = logging.getLogger("saga_engine.flow")

#: How far back the figures go, and how often they are read again.
LEARNED_WINDOW = timedelta(hours=1)
LEARNED_REFRESH_S = 60.0


class LearnedCosts:
    """The learned cost of each (saga type, step) this engine has read; empty at first."""

    __slots__ = ("_table",)

    def __init__(self) -> None:
        self._table: dict[tuple[str, str], Cost] = {}

    def cost(self, saga_type: str, step: str) -> Cost | None:
        """The step's learned cost (a fan-out item's: its node's), or None: not learned."""
        found = self._table.get((saga_type, step))
        if found is None:
            item = fan_out_item(step)
            if item is not None:
                found = self._table.get((saga_type, item[0]))
        return found

    def load(self, saga_type: str, figures: dict[str, LearnedCost]) -> None:
        """Replaces what is known of ``saga_type`` with ``figures`` (by step)."""
        for key in [k for k in self._table if k[0] == saga_type]:
            del self._table[key]
        by_node: dict[str, list[LearnedCost]] = {}
        for step, figure in figures.items():
            item = fan_out_item(step)
            by_node.setdefault(item[0] if item is not None else step, []).append(figure)
        for step, found in by_node.items():
            cost = _merged(found)
            if cost is not None:
                self._table[(saga_type, step)] = cost

    async def refresh(self, store: InsightStore, saga_types: Iterable[str], now: datetime) -> None:
        for saga_type in saga_types:
            self.load(saga_type, await store.learned_costs(saga_type, now - LEARNED_WINDOW, now))


def _merged(figures: list[LearnedCost]) -> Cost | None:
    """One cost from several steps' figures (a fan-out's items), weighted by samples."""
    samples = sum(f.samples for f in figures)
    if samples == 0:
        return None
    handler_ms = sum(f.handler_ms * f.samples for f in figures) / samples
    cpu_samples = sum(f.cpu_samples for f in figures if f.cpu_ms is not None)
    cpu_ms = (
        sum((f.cpu_ms or 0.0) * f.cpu_samples for f in figures) / cpu_samples
        if cpu_samples
        else None
    )
    return learned_cost(samples, handler_ms, cpu_ms)


async def keep_learned_costs_fresh(
    learned: LearnedCosts,
    store: InsightStore,
    saga_types: Iterable[str],
    now: Callable[[], datetime],
) -> None:
    """Reads the learned costs every ``LEARNED_REFRESH_S`` until cancelled."""
    detach_from_trace()
    types = list(saga_types)
    while True:
        try:
            await learned.refresh(store, types, now())
        except TransientError as exc:
            log.warning("reading the learned costs failed (%s); keeping the last ones", exc)
        except Exception:
            log.exception("reading the learned costs failed; keeping the last ones")
        await asyncio.sleep(LEARNED_REFRESH_S)  # a period, not a synchronisation
