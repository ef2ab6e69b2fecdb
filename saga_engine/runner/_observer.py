"""Everything the engine reports, behind one object that listens.

- **Spans** (``SagaSpans``): a saga span for each saga's whole life, a span per step and
  compensation, kept across processes by their ids.
- **Counters** (``EngineStats``): what an operator counts (sagas started, finished by
  outcome, parked, evicted, dead-lettered...), served by ``/metrics`` and exported as
  OpenTelemetry metrics by saga type, with the saga-duration histogram.

The engine tells it, once per saga each time its path has gone through, what happened
(``Applied``): the events written, the commands sent, whether the saga started, was
rebuilt, ended or was let go after a failed send. It also hears of every saga let go
(``evicted``). None of it changes what the engine decides or sends.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from saga_engine.core.history._decision import DropReason, OutboundCommand
from saga_engine.core.history._events import Event
from saga_engine.core.history._status import SagaStatus
from saga_engine.telemetry._spans import SagaSpans, SendTime
from saga_engine.telemetry._telemetry import Telemetry

if TYPE_CHECKING:
    from collections.abc import Mapping

    from saga_engine.runner._cache import LiveSaga

_FINISHED = ("saga_completed", "saga_compensated", "saga_failed", "saga_cancelled")


@dataclass(slots=True)
class EngineStats:
    """Counters an operator cares about; exported as metrics by the observability layer."""

    counts: collections.Counter[str] = field(default_factory=collections.Counter)

    def inc(self, name: str, by: int = 1) -> None:
        self.counts[name] += by


@dataclass(slots=True)
class Applied:
    """What one pass of the engine's path did to one saga."""

    saga_id: str
    live: LiveSaga
    #: The events written, and for each how many steps held an invalid reply when it
    #: was decided (a park is counted once, however many replies a batch held).
    events: list[Event] = field(default_factory=list)
    held: list[int] = field(default_factory=list)
    #: Commands decided now and sent; commands owed from history and sent again.
    sent: Sequence[OutboundCommand] = ()
    resent: Sequence[OutboundCommand] = ()
    sent_at: SendTime | None = None
    #: A send failed: the saga was let go (its events are durable; a reload re-sends).
    send_failed: bool = False
    created: bool = False
    #: Rebuilt from history over a stale copy: the commands still in flight then, whose
    #: spans go on (None: not rebuilt).
    rebuilt: frozenset[str] | None = None
    #: The saga reached this terminal status now.
    ended: SagaStatus | None = None
    error: object = None
    dropped: Sequence[DropReason] = ()
    deduplicated: int = 0


class EngineObserver:
    def __init__(self, telemetry: Telemetry) -> None:
        self.telemetry = telemetry
        self.spans = SagaSpans(telemetry)
        self.stats = EngineStats()

    def trace_context(
        self, saga_type: str, saga_id: str, caller: Mapping[str, str]
    ) -> dict[str, str]:
        """The trace context a new saga stores (its saga span's ids; see ``SagaSpans``)."""
        return self.spans.saga_context(saga_type, saga_id, caller)

    def evicted(self, saga_id: str) -> None:
        """The engine let the saga go: its open spans are dropped unexported (whoever
        loads it next re-sends what is in flight, under the same span ids)."""
        self.spans.evicted(saga_id)

    def applied(self, what: Applied) -> None:
        stats, spans, live = self.stats, self.spans, what.live
        for reason in what.dropped:
            stats.inc(f"dropped_{reason.value}")
        if what.deduplicated:
            stats.inc("start_deduplicated", what.deduplicated)
        if what.created:
            self._stat("sagas_started", live.runtime.saga_type)
        if what.rebuilt is not None:
            spans.superseded(what.saga_id, keep=set(what.rebuilt))
        if what.sent_at is not None and what.resent and not what.send_failed:
            # Owed when the saga was loaded, and sent again: a new span for this send (the
            # first one died with whoever let the saga go), opened before the events are
            # applied, which end it if an input answered it.
            spans.opened(what.resent, at=what.sent_at, resent=True)
        # Live inputs only: what a rebuild replays never passes here (no span twice).
        spans.applied(what.saga_id, what.events)
        if what.send_failed:
            return  # let go: counted by whoever applies its next input
        if what.resent:
            stats.inc("commands_resent", len(what.resent))
        if what.sent_at is not None and what.sent:
            spans.opened(what.sent, at=what.sent_at)
        for event, held in zip(what.events, what.held, strict=True):
            self._counted(event, live, held)
        if what.ended is not None:
            self._ended(what.saga_id, live, what.ended, what.error)

    def _stat(self, name: str, saga_type: str) -> None:
        """A counter that is also an OpenTelemetry metric, by saga type."""
        self.stats.inc(name)
        self.telemetry.count(name, saga_type)

    def _counted(self, event: Event, live: LiveSaga, held: int) -> None:
        kind = event.kind
        saga_type = live.runtime.saga_type
        if kind in _FINISHED:
            self._stat(kind.replace("saga_", "sagas_"), saga_type)
            if live.started_at is not None:
                self.telemetry.saga_duration.record(
                    max(0.0, (event.at - live.started_at).total_seconds()),
                    {"saga.type": saga_type, "outcome": kind.removeprefix("saga_")},
                )
        elif kind in ("saga_parked", "compensation_stuck") or (
            # Once per park: a second reply held while one already is adds no park.
            kind == "invalid_reply_received" and held <= 1
        ):
            self._stat("sagas_parked", saga_type)

    def _ended(self, saga_id: str, live: LiveSaga, status: SagaStatus, error: object) -> None:
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
