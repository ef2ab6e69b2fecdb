"""Everything the engine reports, behind one object that listens.

- **Spans** (``SagaSpans``): a saga span for each saga's whole life, a span per step and
  compensation, kept across processes by their ids.
- **Counters** (``EngineStats``): what an operator counts (sagas started, finished by
  outcome, parked, evicted, dead-lettered...), served by ``/metrics`` and exported as
  OpenTelemetry metrics by saga type, with the saga-duration histogram.

The engine tells it, once per batch its path has gone through, what happened to each
saga of it (``applied``: each saga's ``Work``, read as it is, no report built per saga):
the events written, the commands sent, whether the saga started, was rebuilt, ended or
was let go after a failed send. It also hears of every saga let go (``evicted``). None
of it changes what the engine decides or sends.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from saga_engine.core.history._events import Event
from saga_engine.core.history._status import SagaStatus
from saga_engine.telemetry._spans import SagaSpans, SendTime
from saga_engine.telemetry._telemetry import Telemetry

if TYPE_CHECKING:
    from collections.abc import Mapping

    from saga_engine.runner._cache import LiveSaga
    from saga_engine.runner._path_inputs import Work

_FINISHED = ("saga_completed", "saga_compensated", "saga_failed", "saga_cancelled")
#: A park's events (an ``invalid_reply_received`` too, once per park: ``Work.held``).
_PARKING = ("saga_parked", "compensation_stuck")
#: The kinds of event a counter looks at (``_counted``); the others, most of them, are
#: passed over with one set lookup each rather than a call.
_COUNTED = frozenset((*_FINISHED, *_PARKING))


@dataclass(slots=True)
class EngineStats:
    """Counters an operator cares about; exported as metrics by the observability layer."""

    counts: collections.Counter[str] = field(default_factory=collections.Counter)

    def inc(self, name: str, by: int = 1) -> None:
        self.counts[name] += by


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

    def applied(self, works: Sequence[Work], sent_at: SendTime | None) -> None:
        """What one pass of the engine's path did to each saga of ``works``, whose
        commands were handed to the sender at ``sent_at`` (None: nothing was sent, or
        nothing records spans: none is opened)."""
        for work in works:
            self._applied(work, sent_at)

    def _applied(self, work: Work, sent_at: SendTime | None) -> None:
        stats, spans, live = self.stats, self.spans, work.live
        assert live is not None
        for reason in work.dropped:
            stats.inc(f"dropped_{reason.value}")
        if work.deduplicated:
            stats.inc("start_deduplicated", work.deduplicated)
        if work.created is not None:
            self._stat("sagas_started", live.runtime.saga_type)
        if work.rebuilt is not None:
            spans.superseded(work.saga_id, keep=set(work.rebuilt))
        send_failed = work.send_error is not None
        if sent_at is not None and work.resent and not send_failed:
            # Owed when the saga was loaded, and sent again: a new span for this send (the
            # first one died with whoever let the saga go), opened before the events are
            # applied, which end it if an input answered it.
            spans.opened(work.resent, at=sent_at, resent=True)
        # Live inputs only: what a rebuild replays never passes here (no span twice).
        spans.applied(work.saga_id, work.events)
        if send_failed:
            return  # let go: counted by whoever applies its next input
        if work.resent:
            stats.inc("commands_resent", len(work.resent))
        if sent_at is not None and work.commands:
            spans.opened(work.commands, at=sent_at)
        for event in work.events:
            if event.kind in _COUNTED:
                self._counted(event, live)
        for held in work.held:  # one per invalid reply held, most batches none
            # Once per park: a second reply held while one already is adds no park.
            if held <= 1:
                self._stat("sagas_parked", live.runtime.saga_type)
        last = work.last
        if last is not None and last.status.is_terminal:
            self._ended(work.saga_id, live, last.status, last.projection.error)

    def _stat(self, name: str, saga_type: str) -> None:
        """A counter that is also an OpenTelemetry metric, by saga type."""
        self.stats.inc(name)
        self.telemetry.count(name, saga_type)

    def _counted(self, event: Event, live: LiveSaga) -> None:
        kind = event.kind
        saga_type = live.runtime.saga_type
        if kind in _FINISHED:
            self._stat(kind.replace("saga_", "sagas_"), saga_type)
            if live.started_at is not None:
                self.telemetry.saga_duration.record(
                    max(0.0, (event.at - live.started_at).total_seconds()),
                    {"saga.type": saga_type, "outcome": kind.removeprefix("saga_")},
                )
        else:  # _PARKING
            self._stat("sagas_parked", saga_type)

    def _ended(self, saga_id: str, live: LiveSaga, status: SagaStatus, error: object) -> None:
        """The saga reached a terminal status: its span ends, with its outcome."""
        outcome = status.value  # (an enum's value is a descriptor call each time)
        self.spans.saga_ended(saga_id, f"saga_{outcome}")
        message = error.get("message", error) if isinstance(error, dict) else error
        self.spans.saga_finished(
            saga_type=live.runtime.saga_type,
            saga_id=saga_id,
            trace_context=live.runtime.trace_context,
            started_at=live.started_at,
            outcome=outcome,
            error=str(message) if error else None,
        )
