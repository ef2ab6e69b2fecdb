"""The timeline of a saga for operators: its stretches, as its history is folded.

Each attempt of a step or a compensation, each back-off, each wait for a signal or a
timer, and each parked period is a :class:`Segment`, opened by the event that began it
and closed by the one that ended it, with how it ended. :class:`Timeline` follows the one
fold of history (``_fold.Fold``) and asks it what each event settled, so which command a
reply answers or which timer a retry cuts short is decided there, not here. The view
(``_view.saga_view_of``) carries the segments; the admin's web page lays them out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from saga_engine.core.history._events import (
    AttemptTimedOut,
    CallbackAwaited,
    CallbackReceived,
    CommandIssued,
    CompensationIssued,
    CompensationStarted,
    DomainEventReceived,
    Event,
    EventAwaited,
    InvalidReplyReceived,
    KeyAcquired,
    KeyQueued,
    PivotPassed,
    ReplyReceived,
    RetryRequested,
    SagaCancelled,
    SagaCompensated,
    SagaCompleted,
    SagaFailed,
    SagaParked,
    SagaResumed,
    SignalReceived,
    StepAbandoned,
    StepParked,
    StepSkipped,
    TimerFired,
    TimerStarted,
    UpdateCompleted,
    UpdateReceived,
)
from saga_engine.core.history._fold import (
    Fold,
    ParkedStep,
    Sent,
    Settled,
    Timer,
    forward_backoff_of,
    retry_timer_step,
    signal_of,
)
from saga_engine.core.views._event_lines import short_value


class Lane(StrEnum):
    """The timeline's kinds of row."""

    STEP = "step"
    COMPENSATION = "compensation"
    WAIT = "wait"
    PARKED = "parked"


@dataclass(slots=True)
class Segment:
    """One stretch of the timeline: an attempt, a back-off, a wait, a parked period."""

    row: str
    lane: Lane
    label: str
    start: datetime
    start_seq: int
    #: success, refused, failed, retryable, timed_out, invalid, in_doubt, pending,
    #: skipped, backoff, waiting, fired, received, timed_out, cancelled, parked, resumed,
    #: acquired (a concurrency key), retried (a parked step), pivot (the pivot passed: a
    #: point, not a stretch)
    outcome: str = "pending"
    end: datetime | None = None
    end_seq: int | None = None
    detail: str = ""

    def close(self, outcome: str, at: datetime, seq: int, why: str = "") -> None:
        self.outcome, self.end, self.end_seq = outcome, at, seq
        if why:
            self.detail = why


class Timeline:
    """The segments of one history, built as it is folded."""

    def __init__(self, fold: Fold) -> None:
        self.fold = fold
        self.segments: list[Segment] = []
        #: The open segments, by command id and by timer id.
        self.sent: dict[str, Segment] = {}
        self.timers: dict[str, Segment] = {}
        #: The last parked period (what an operator waits on while it lasts).
        self.parked: Segment | None = None
        #: Forward steps parked for an operator, by step.
        self.parked_steps: dict[str, Segment] = {}

    def add(self, seq: int, event: Event, settled: Settled) -> None:
        """Follows ``event``, folded already; ``settled`` is what the fold says it settled."""
        handler = _HANDLERS.get(type(event))
        if handler is not None:
            handler(self, seq, event, settled)

    def _open(self, open_: dict[str, Segment], key: str, segment: Segment) -> None:
        self.segments.append(segment)
        open_[key] = segment

    @staticmethod
    def _close(
        open_: dict[str, Segment], key: str, outcome: str, event: Event, seq: int, why: str = ""
    ) -> None:
        segment = open_.pop(key, None)
        if segment is not None:
            segment.close(outcome, event.at, seq, why)

    # ------------------------------------------------------------------ per event

    def _issued(self, seq: int, event: CommandIssued | CompensationIssued, _: Settled) -> None:
        comp = isinstance(event, CompensationIssued)
        self._open(
            self.sent,
            event.command_id,
            Segment(
                event.step,
                Lane.COMPENSATION if comp else Lane.STEP,
                f"{'undo ' if comp else ''}{event.step} #{event.attempt}",
                event.at,
                seq,
                detail=f"{event.command_type} → {event.participant}",
            ),
        )

    def _replied(self, seq: int, event: ReplyReceived, _: Settled) -> None:
        outcome = {"success": "success", "failure": "refused"}.get(event.outcome, "retryable")
        if event.compensation and outcome == "refused":
            outcome = "failed"
        self._close(self.sent, event.command_id, outcome, event, seq, event.error or "")

    def _held(self, seq: int, event: InvalidReplyReceived, _: Settled) -> None:
        self._close(self.sent, event.command_id, "invalid", event, seq, event.error.message)

    def _timed_out(self, seq: int, event: AttemptTimedOut, _: Settled) -> None:
        self._close(self.sent, event.command_id, "timed_out", event, seq, "timed out")

    def _timer_started(self, seq: int, event: TimerStarted, _: Settled) -> None:
        if event.purpose == "retry":
            comp = event.timer_id.startswith("retry:compensate:")
            name = retry_timer_step(event.timer_id)
            lane = Lane.COMPENSATION if comp else Lane.STEP
            segment = Segment(name, lane, f"back-off {name}", event.at, seq, "backoff")
        elif event.purpose == "signal_timeout":
            name = signal_of(event.timer_id) or event.timer_id
            segment = Segment(
                f"signal {name}",
                Lane.WAIT,
                f"wait for {name!r}",
                event.at,
                seq,
                "waiting",
                detail=f"deadline {event.fire_at.isoformat()}",
            )
        else:
            segment = Segment("sleep", Lane.WAIT, event.timer_id, event.at, seq, "waiting")
        self._open(self.timers, event.timer_id, segment)

    def _timer_fired(self, seq: int, event: TimerFired, _: Settled) -> None:
        segment = self.timers.get(event.timer_id)
        outcome = "timed_out" if event.timer_id.startswith(("signal:", "event:")) else "fired"
        if segment is not None and segment.outcome == "backoff":
            outcome = "backoff"
        self._close(self.timers, event.timer_id, outcome, event, seq)

    def _signal(self, seq: int, event: SignalReceived, settled: Settled) -> None:
        if isinstance(settled, Timer):
            self._close(self.timers, settled.timer_id, "received", event, seq, event.principal)

    def _step_parked(self, seq: int, event: StepParked, _: Settled) -> None:
        self._open(
            self.parked_steps,
            event.step,
            Segment(
                event.step,
                Lane.STEP,
                f"{event.step} parked",
                event.at,
                seq,
                "parked",
                detail=event.error.message,
            ),
        )

    def _pivot(self, seq: int, event: PivotPassed, _: Settled) -> None:
        self.segments.append(
            Segment(
                event.step,
                Lane.STEP,
                f"pivot {event.step}",
                event.at,
                seq,
                "pivot",
                event.at,
                seq,
                "past the pivot: the saga only goes forward",
            ),
        )

    def _event_awaited(self, seq: int, event: EventAwaited, _: Settled) -> None:
        until = f"deadline {event.timeout_at.isoformat()}" if event.timeout_at else "no deadline"
        segment = Segment(
            f"event {event.source}",
            Lane.WAIT,
            f"wait for {event.source} key={event.key}",
            event.at,
            seq,
            "waiting",
            detail=until,
        )
        self._open(self.timers, event.wait_id, segment)

    def _event_received(self, seq: int, event: DomainEventReceived, _: Settled) -> None:
        self._close(self.timers, event.wait_id, "received", event, seq, event.event_id)

    def _callback_awaited(self, seq: int, event: CallbackAwaited, _: Settled) -> None:
        segment = Segment(
            f"callback {event.name}",
            Lane.WAIT,
            f"wait for callback {event.name!r}",
            event.at,
            seq,
            "waiting",
            detail=f"until {event.expires_at.isoformat()}",
        )
        self._open(self.timers, event.wait_id, segment)

    def _callback_received(self, seq: int, event: CallbackReceived, _: Settled) -> None:
        outcome = "failed" if event.failed else "received"
        self._close(self.timers, event.wait_id, outcome, event, seq, event.wait_id)

    def _key_queued(self, seq: int, event: KeyQueued, _: Settled) -> None:
        behind = ", ".join(event.behind) or "nobody"
        detail = f"position {event.position}, behind {behind}"
        segment = self.timers.get(f"key:{event.key}")
        if segment is not None:
            segment.detail = detail  # queued again, behind others: the same wait
            return
        label = f"queued for concurrency key {event.key!r}"
        segment = Segment(
            "concurrency key", Lane.WAIT, label, event.at, seq, "waiting", detail=detail
        )
        self._open(self.timers, f"key:{event.key}", segment)

    def _key_acquired(self, seq: int, event: KeyAcquired, _: Settled) -> None:
        self._close(self.timers, f"key:{event.key}", "acquired", event, seq)

    def _skipped(self, seq: int, event: StepSkipped, settled: Settled) -> None:
        if isinstance(settled, ParkedStep):
            self._close(self.parked_steps, event.step, "skipped", event, seq, event.principal)
        elif isinstance(settled, Sent):
            key = settled.event.command_id
            self._close(self.sent, key, "skipped", event, seq, event.principal)

    def _retried(self, seq: int, event: RetryRequested, settled: Settled) -> None:
        if isinstance(settled, ParkedStep):
            edited = " with an edited command" if event.command is not None else ""
            why = f"retried{edited} by {event.principal}"
            self._close(self.parked_steps, event.step, "retried", event, seq, why)
        elif isinstance(settled, Sent):  # its held reply accepted
            key = settled.event.command_id
            self._close(self.sent, key, "success", event, seq, "held reply accepted")
        elif isinstance(settled, Timer):  # a back-off cut short
            why = f"retried now by {event.principal}"
            self._close(self.timers, settled.timer_id, "backoff", event, seq, why)

    def _abandoned(self, seq: int, event: StepAbandoned, _: Settled) -> None:
        # Given up by its code: its sends end (in doubt: its undo follows), its back-off
        # and its park with it.
        why = event.reason or "given up by the saga's code"
        for key in event.command_ids:
            self._close(
                self.sent, key, "in_doubt" if event.in_doubt else "cancelled", event, seq, why
            )
        for key in [k for k in self.timers if forward_backoff_of(k, event.step)]:
            self._close(self.timers, key, "cancelled", event, seq, why)
        self._close(self.parked_steps, event.step, "cancelled", event, seq, why)

    def _compensating(self, seq: int, event: CompensationStarted, _: Settled) -> None:
        # The run's forward work is abandoned (the fold let go of it): its commands are
        # in doubt, its timers cancelled.
        for key in [k for k in self.sent if k not in self.fold.inflight]:
            self._close(self.sent, key, "in_doubt", event, seq)
        for key in [k for k in self.timers if k not in self.fold.timers]:
            self._close(self.timers, key, "cancelled", event, seq)
        for key in list(self.parked_steps):
            self._close(self.parked_steps, key, "cancelled", event, seq)

    def _parked(self, seq: int, event: SagaParked, _: Settled) -> None:
        self.parked = Segment(
            "parked",
            Lane.PARKED,
            f"parked ({event.reason})",
            event.at,
            seq,
            "parked",
            detail=event.error.message,
        )
        self.segments.append(self.parked)

    def _resumed(self, seq: int, event: SagaResumed, _: Settled) -> None:
        if self.parked is not None and self.parked.end is None:
            self.parked.close("resumed", event.at, seq, event.principal)

    def _ended(self, seq: int, event: Event, _: Settled) -> None:
        for open_ in (self.sent, self.timers, self.parked_steps):
            for key in list(open_):
                self._close(open_, key, "cancelled", event, seq)


def _update_received(self: Timeline, seq: int, event: UpdateReceived, _: Settled) -> None:
    # Open until its result, recorded right after it: an instant on the timeline.
    segment = Segment(
        f"update {event.name}",
        Lane.WAIT,
        f"update {event.name!r}",
        event.at,
        seq,
        detail=f"by {event.principal}",
    )
    self._open(self.sent, f"update:{event.update_id}", segment)


def _update_completed(self: Timeline, seq: int, event: UpdateCompleted, _: Settled) -> None:
    outcome = "failed" if event.error else "success"
    why = event.error.message if event.error else f"result {short_value(event.result)}"
    self._close(self.sent, f"update:{event.update_id}", outcome, event, seq, why)


_HANDLERS: dict[type[Event], Callable[[Timeline, int, Any, Settled], None]] = {
    UpdateReceived: _update_received,
    UpdateCompleted: _update_completed,
    CommandIssued: Timeline._issued,
    CompensationIssued: Timeline._issued,
    ReplyReceived: Timeline._replied,
    InvalidReplyReceived: Timeline._held,
    AttemptTimedOut: Timeline._timed_out,
    TimerStarted: Timeline._timer_started,
    TimerFired: Timeline._timer_fired,
    SignalReceived: Timeline._signal,
    EventAwaited: Timeline._event_awaited,
    DomainEventReceived: Timeline._event_received,
    CallbackAwaited: Timeline._callback_awaited,
    CallbackReceived: Timeline._callback_received,
    KeyQueued: Timeline._key_queued,
    KeyAcquired: Timeline._key_acquired,
    StepSkipped: Timeline._skipped,
    RetryRequested: Timeline._retried,
    CompensationStarted: Timeline._compensating,
    SagaParked: Timeline._parked,
    StepParked: Timeline._step_parked,
    StepAbandoned: Timeline._abandoned,
    PivotPassed: Timeline._pivot,
    SagaResumed: Timeline._resumed,
    SagaCompleted: Timeline._ended,
    SagaFailed: Timeline._ended,
    SagaCompensated: Timeline._ended,
    SagaCancelled: Timeline._ended,
}
