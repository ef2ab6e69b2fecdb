"""The web page's timeline: the fold's segments laid out on a time axis.

What the segments are (attempts, back-offs, waits, parked periods, and how each ended)
is :func:`saga_engine.core.views._view.saga_view_of`'s; this module only places them: one row per step,
compensation, signal wait, sleep or park, and each bar's position and width in percent
of the axis, with tick marks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from saga_engine.core.views._view import Lane, SagaView, Segment

__all__ = ["Bar", "Tick", "TimelineChart", "TimelineRow", "relative", "span_text", "timeline"]

#: Rows in the order of what they are: the run, its waits, then what undoes it.
_LANE_ORDER = {Lane.STEP: 0, Lane.WAIT: 0, Lane.COMPENSATION: 1, Lane.PARKED: 2}
_TICK_STEPS_S = (
    0.001,
    0.005,
    0.01,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2,
    5,
    10,
    15,
    30,
    60,
    120,
    300,
    600,
    900,
    1800,
    3600,
    7200,
    14400,
    21600,
    43200,
    86400,
    172800,
    604800,
)


@dataclass(slots=True)
class Bar:
    """One segment, placed: x and width are percent of the axis."""

    segment: Segment
    x: float = 0.0
    width: float = 0.0

    @property
    def label(self) -> str:
        return self.segment.label

    @property
    def outcome(self) -> str:
        return self.segment.outcome

    @property
    def detail(self) -> str:
        return self.segment.detail

    @property
    def start(self) -> datetime:
        return self.segment.start

    @property
    def end(self) -> datetime | None:
        return self.segment.end

    @property
    def compensation(self) -> bool:
        return self.segment.lane == Lane.COMPENSATION

    @property
    def css(self) -> str:
        kind = {Lane.COMPENSATION: "comp", Lane.STEP: "fwd"}.get(self.segment.lane, "wait")
        return f"bar {kind} o-{self.segment.outcome}"


@dataclass(slots=True)
class TimelineRow:
    name: str
    lane: Lane
    bars: list[Bar] = field(default_factory=list)

    @property
    def compensation(self) -> bool:
        return self.lane == Lane.COMPENSATION

    @property
    def css(self) -> str:
        return {
            Lane.COMPENSATION: "comp-row",
            Lane.WAIT: "wait-row",
            Lane.PARKED: "parked-row",
        }.get(self.lane, "")


@dataclass(frozen=True, slots=True)
class Tick:
    x: float
    label: str


@dataclass(slots=True)
class TimelineChart:
    rows: list[TimelineRow]
    #: "time" when the events span some time; "sequence" when they share one instant.
    axis: str
    start: datetime | None
    end: datetime | None
    ticks: list[Tick] = field(default_factory=list)


def timeline(view: SagaView, *, now: datetime | None = None) -> TimelineChart:
    """Lays out ``view``'s segments; open ones run to ``now`` (or the last event)."""
    rows: dict[tuple[Lane, str], TimelineRow] = {}
    for segment in view.segments:
        row = rows.setdefault((segment.lane, segment.row), TimelineRow(segment.row, segment.lane))
        row.bars.append(Bar(segment))
    first_at, last_at = view.started_at, view.last_at
    if now is not None and last_at is not None:
        last_at = max(last_at, now)
    span = (last_at - first_at).total_seconds() if first_at and last_at else 0.0
    axis = "time" if span > 0 else "sequence"
    total_seq = max(view.events, 1)
    for row in rows.values():
        for bar in row.bars:
            s = bar.segment
            if axis == "time" and first_at is not None:
                x0 = (s.start - first_at).total_seconds() / span
                x1 = ((s.end or last_at or s.start) - first_at).total_seconds() / span
            else:
                x0 = (s.start_seq - 1) / total_seq
                x1 = (s.end_seq or total_seq) / total_seq
            x0 = min(max(x0, 0.0), 0.99)
            bar.x = round(x0 * 100, 2)
            bar.width = round(max(min(x1, 1.0) - x0, 0.01) * 100, 2)
    ordered = sorted(
        rows.values(),
        key=lambda r: (_LANE_ORDER[r.lane], min(b.segment.start_seq for b in r.bars), r.name),
    )
    ticks = _ticks(first_at, span) if axis == "time" and first_at is not None else []
    return TimelineChart(ordered, axis, first_at, last_at, ticks)


def _ticks(first_at: datetime, span: float) -> list[Tick]:
    """About five marks at a round interval, labelled by the time since the start."""
    step = next((s for s in _TICK_STEPS_S if span / s <= 6), _TICK_STEPS_S[-1])
    out, n = [], 0
    while n * step <= span and n <= 12:
        out.append(Tick(round(n * step / span * 100, 2), "+" + _short(timedelta(seconds=n * step))))
        n += 1
    return out


def _short(delta: timedelta) -> str:
    seconds = delta.total_seconds()
    if seconds == 0:
        return "0 s"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:g} s"
    if seconds < 7200:
        return f"{seconds / 60:g} min"
    if seconds < 172800:
        return f"{seconds / 3600:g} h"
    return f"{seconds / 86400:g} d"


def span_text(delta: timedelta) -> str:
    """A duration as an operator reads it at a glance: "45 s", "2 h 5 m", "3 d 4 h"."""
    seconds = int(abs(delta.total_seconds()))
    if seconds < 60:
        return f"{seconds} s"
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes = rest // 60
    if days:
        return f"{days} d {hours} h" if hours else f"{days} d"
    if hours:
        return f"{hours} h {minutes} m" if minutes else f"{hours} h"
    return f"{minutes} m"


def relative(moment: datetime | None, now: datetime) -> str:
    """``moment`` from ``now``: "2 h ago" or "in 1 h 50 m" (empty for None). Computed on
    the server from the request's time, so a page (and its test) needs no script."""
    if moment is None:
        return ""
    text = span_text(moment - now)
    return f"in {text}" if moment > now else f"{text} ago"
