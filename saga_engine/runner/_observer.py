"""Everything the engine reports, behind one object.

- **Spans** (``SagaSpans``): a saga span for each saga's whole life, a span per step and
  compensation, kept across processes by their ids.
- **Counters** (``EngineStats``): what an operator counts (sagas started, finished by
  outcome, parked, evicted, dead-lettered...), served by ``/metrics`` and exported as
  OpenTelemetry metrics by saga type, with the saga-duration histogram.
- **Crash points**: the fault-injection tests' seam, called with each point's name as
  the engine passes it (``SAGA_CRASH_AT``).

The engine and its batch path call this and nothing else to report; none of it changes
what the engine decides.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from saga_engine.core._events import Event
from saga_engine.core._status import SagaStatus
from saga_engine.telemetry._spans import SagaSpans
from saga_engine.telemetry._telemetry import Telemetry

if TYPE_CHECKING:
    from saga_engine.runner._cache import LiveSaga

_FINISHED = ("saga_completed", "saga_compensated", "saga_failed", "saga_cancelled")


@dataclass(slots=True)
class EngineStats:
    """Counters an operator cares about; exported as metrics by the observability layer."""

    counts: collections.Counter[str] = field(default_factory=collections.Counter)

    def inc(self, name: str, by: int = 1) -> None:
        self.counts[name] += by


class EngineObserver:
    def __init__(self, telemetry: Telemetry, crash_hook: Callable[[str], None] | None) -> None:
        self.telemetry = telemetry
        self.spans = SagaSpans(telemetry)
        self.stats = EngineStats()
        self._crash_hook = crash_hook

    def checkpoint(self, name: str) -> None:
        """A crash point: the fault-injection seam (a no-op unless a hook is set)."""
        if self._crash_hook is not None:
            self._crash_hook(name)

    def inc(self, name: str, by: int = 1) -> None:
        self.stats.inc(name, by)

    def stat(self, name: str, saga_type: str) -> None:
        """A counter that is also an OpenTelemetry metric, by saga type."""
        self.stats.inc(name)
        self.telemetry.count(name, saga_type)

    def counted(self, event: Event, live: LiveSaga, *, held: int | None = None) -> None:
        """The counters an applied event moves (``held``: steps holding an invalid reply
        when the event was decided, for the batch path, which counts after the fact)."""
        kind = event.kind
        saga_type = live.runtime.saga_type
        if kind in _FINISHED:
            self.stat(kind.replace("saga_", "sagas_"), saga_type)
            if live.started_at is not None:
                self.telemetry.saga_duration.record(
                    max(0.0, (event.at - live.started_at).total_seconds()),
                    {"saga.type": saga_type, "outcome": kind.removeprefix("saga_")},
                )
        elif kind in ("saga_parked", "compensation_stuck") or (
            # Once per park: a second reply held while one already is adds no park.
            kind == "invalid_reply_received"
            and (len(live.runtime.held_steps()) if held is None else held) <= 1
        ):
            self.stat("sagas_parked", saga_type)

    def ended(self, saga_id: str, live: LiveSaga, status: SagaStatus, error: object) -> None:
        """The saga reached a terminal status: its span ends, with its outcome."""
        self.spans.saga_ended(saga_id, f"saga_{status.value}")
        message = error.get("message", error) if isinstance(error, dict) else error
        self.spans.saga_finished(
            saga_type=live.runtime.saga_type,
            saga_id=saga_id,
            trace_context=live.runtime.trace_context,
            started_at=live.started_at,
            outcome=status.value,
            error=str(message) if error else None,
        )
