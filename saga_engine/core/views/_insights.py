"""Insights per saga type: what one finished run contributes to its type's aggregates.

A run is summarised once, from its whole history, by the store's roll-up after its
terminal event is stored (the store records the run in that event's transaction and the
roll-up takes it off that record in its own: a run is counted exactly once, whatever
crashes), and added into counters per (saga type, time bucket, flow policy): per type (runs by outcome, a duration
histogram), per node (steps, children, timers, signal, event and callback waits: runs that took
it, attempts, successes, refusals, timeouts, compensations, a latency histogram), the
most frequent error messages per node, and the pairs of nodes that overlapped in a run
(parallel branches from ``gather``). Reads add up a window's buckets (of one flow policy,
or of all): never a scan of events. Pure: no I/O.
"""

from __future__ import annotations

import bisect
import functools
import math
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import chain, repeat
from typing import Final, Literal

from saga_engine.core.history._events import Event
from saga_engine.core.history._structs import field_values

#: The histograms' upper bounds in milliseconds (the last bucket is everything above).
BOUNDS_MS: Final[tuple[int, ...]] = (
    1,
    2,
    5,
    10,
    20,
    50,
    100,
    200,
    500,
    1_000,
    2_000,
    5_000,
    10_000,
    30_000,
    60_000,
    120_000,
    300_000,
    600_000,
    1_800_000,
    3_600_000,
    21_600_000,
    86_400_000,
)
BUCKETS: Final = len(BOUNDS_MS) + 1
#: The aggregates' time grain: a run counts in the bucket its end falls in.
GRAIN: Final = timedelta(minutes=5)
#: An error message is kept to this many characters (so that one message, one row).
MESSAGE_CHARS: Final = 200
#: The windows a read may ask for.
WINDOWS: Final[dict[str, timedelta]] = {
    "1h": timedelta(hours=1),
    "1d": timedelta(days=1),
    "7d": timedelta(days=7),
}

NodeKind = Literal["step", "child", "timer", "signal", "event", "callback"]
Facet = Literal["type", "node", "error", "overlap", "phase"]

#: Where a step's time goes, from its command's issue to its reply's event stored, in
#: order (each from the previous mark to its own; PROTOCOL.md 7.4a): held by flow control
#: (issued -> sent), on the way to the participant (-> received), waiting there (->
#: handler started), the handler (-> ended), its commit (-> committed), on the way back
#: (-> the engine read the reply), and applying it (-> its event stored).
PHASES: Final = ("held", "to_participant", "waiting", "handler", "commit", "back", "apply")
#: The handler's CPU time (the Python kit's ``ce_handlercpums``): a "phase" row of its own.
CPU: Final = "cpu"


_GRAIN_S: Final = int(GRAIN.total_seconds())


def bucket_of(at: datetime) -> datetime:
    """``at`` rounded down to ``GRAIN`` (from the epoch)."""
    return _bucket_start(_bucket_number(at))


def _bucket_number(at: datetime) -> int:
    """Which ``GRAIN`` from the epoch ``at`` falls in."""
    return int(at.timestamp()) // _GRAIN_S


def _bucket_start(number: int) -> datetime:
    return datetime.fromtimestamp(number * _GRAIN_S, UTC)


#: The histogram bucket of a value in ms (``histogram_index(ms)``): a C callable, no
#: Python frame. The bucket a value counts in: ``Counters.observe`` asks it, and the
#: roll-up's batch count (``_histogram_add``) gives each value the same.
histogram_index: Final = functools.partial(bisect.bisect_left, BOUNDS_MS)


#: A reply's phases (``PHASES``, then ``CPU``): ms each, None where either end is unknown.
PhaseValues = tuple[float | None, ...]
#: The names of a ``PhaseValues``' entries, in order.
PHASE_NAMES: Final = (*PHASES, CPU)


@dataclass(slots=True)
class NodeRun:
    """One node as one run took it."""

    kind: NodeKind
    attempts: int = 0
    successes: int = 0
    refusals: int = 0
    timeouts: int = 0
    compensations: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: When the node first started and last ended in the run (epoch ms).
    first: float | None = None
    last: float | None = None
    #: Its replies' phases, one ``PhaseValues`` per reply that measured any; None until
    #: one comes (most histories' replies have no timings). Kept as the tuples the walk
    #: made: the roll-up adds them up column by column (``aggregate``); ``phases`` is
    #: the same by phase.
    timed: list[PhaseValues] | None = None

    @property
    def phases(self) -> dict[str, list[float]] | None:
        """Its replies' phases (``PHASES``, and ``CPU``): ms each, by phase; None when
        no reply measured any."""
        if self.timed is None:
            return None
        phases: dict[str, list[float]] = {}
        for values in self.timed:
            for phase, ms in zip(PHASE_NAMES, values, strict=True):
                if ms is not None:
                    phases.setdefault(phase, []).append(ms)
        return phases

    def span(self, start: float, end: float) -> None:
        # Comparisons, not min()/max(): the roll-up calls this for every timeout and wait
        # it reads (and does the same, written out, for every reply).
        if self.first is None or start < self.first:
            self.first = start
        if self.last is None or end > self.last:
            self.last = end


@dataclass(slots=True)
class RunSummary:
    """What one finished run contributes. Not frozen, though nothing changes one: a
    frozen dataclass sets each field through ``object.__setattr__`` (making one costs
    3.7 times as much), and the roll-up makes one for every run that ends."""

    saga_type: str
    #: The run's start in epoch ms (what node offsets are measured from).
    started_ms: float
    ended_at: datetime
    outcome: str
    duration_ms: float
    nodes: dict[str, NodeRun]
    overlaps: list[tuple[str, str]]
    #: The flow policy the run was started under (``SagaStarted.flow_policy``; 1 when
    #: its start recorded none).
    flow_policy: int = 1


def node_kind(step: str) -> NodeKind:
    return "child" if step.startswith("child:") else "step"


@dataclass(slots=True)
class Mark:
    """What a summary reads of one event: its kind, time and a few plain fields (the
    Postgres store selects just these, so a run's summary decodes no payload). ``at`` is
    in epoch milliseconds: a summary only subtracts times, and floats are cheaper to
    read and subtract than datetimes (the roll-up reads every ended run's marks). Not
    frozen, though nothing changes one: a frozen dataclass sets each of its 22 fields
    through ``object.__setattr__``, 7 times the cost of making one (1.4 against 0.2 us),
    and one is made for every event of every run that ends."""

    kind: str
    at: float
    step: str | None = None
    command_id: str | None = None
    outcome: str | None = None
    compensation: bool = False
    error: str | None = None
    purpose: str | None = None
    wait_id: str | None = None
    name: str | None = None
    saga_type: str | None = None
    #: A reply's timings (``ReplyTimings``), epoch ms: when its command was sent, read by
    #: the participant, handled (start, end) and committed; the handler's CPU ms; and when
    #: its event was stored (the Postgres row's ``recorded_at``; None in memory).
    sent: float | None = None
    received: float | None = None
    handler_start: float | None = None
    handler_end: float | None = None
    committed: float | None = None
    cpu_ms: float | None = None
    recorded: float | None = None
    #: A start's flow policy (``SagaStarted.flow_policy``; None: 1).
    flow_policy: int | None = None
    #: A callback's answer posted to its ``/fail`` URL (``CallbackReceived.failed``).
    failed: bool = False


#: The kinds a summary reads (the others leave it as it is).
MARK_KINDS: Final = (
    "saga_started",
    "command_issued",
    "compensation_issued",
    "reply_received",
    "attempt_timed_out",
    "timer_started",
    "timer_fired",
    "event_awaited",
    "domain_event_received",
    "signal_received",
    "callback_awaited",
    "callback_received",
    "saga_completed",
    "saga_failed",
    "saga_compensated",
    "saga_cancelled",
)
_ENDS: Final = {
    "saga_completed": "completed",
    "saga_failed": "failed",
    "saga_compensated": "compensated",
    "saga_cancelled": "cancelled",
}


def _epoch(at: datetime | None) -> float | None:
    return None if at is None else epoch_ms(at)


def mark_of(event: Event) -> Mark:
    get = field_values(event).get
    error = get("error")
    compensation = get("compensation")
    t = get("timings")
    timed: dict[str, float | None] = (
        {}
        if t is None
        else {
            "sent": _epoch(t.sent_at),
            "received": _epoch(t.received_at),
            "handler_start": _epoch(t.handler_started_at),
            "handler_end": _epoch(t.handler_ended_at),
            "committed": _epoch(t.committed_at),
            "cpu_ms": t.handler_cpu_ms,
        }
    )
    return Mark(
        kind=event.kind,
        at=epoch_ms(event.at),
        step=get("step"),
        command_id=get("command_id"),
        outcome=get("outcome"),
        compensation=compensation is True,
        error=error if isinstance(error, str) else None,
        purpose=get("purpose"),
        wait_id=get("timer_id") or get("wait_id"),
        name=get("name") or get("source"),
        saga_type=get("saga_type"),
        flow_policy=get("flow_policy"),
        failed=get("failed") is True,
        **timed,
    )


def summarize(marks: Sequence[Mark]) -> RunSummary | None:
    """A finished run's summary from its history's marks (None if it has not ended); what
    the history recorded after its end does not count, so a roll-up's summary is the
    same whenever it runs."""
    if not marks:
        return None
    start = marks[0]
    if start.kind != "saga_started" or start.saga_type is None:
        return None
    nodes: dict[str, NodeRun] = {}
    end = _walk(marks, nodes)
    if end is None:
        return None
    # By position (keywords cost more to pass): RunSummary's fields in their order.
    return RunSummary(
        start.saga_type,
        start.at,
        datetime.fromtimestamp(end.at / 1000, UTC),
        _ENDS[end.kind],
        _ms(start.at, end.at),
        nodes,
        _overlaps(nodes),
        start.flow_policy or 1,
    )


_WAITS: Final = ("timer_fired", "domain_event_received", "callback_received")


def _walk(marks: Sequence[Mark], nodes: dict[str, NodeRun]) -> Mark | None:
    """Adds the run's marks up to its end into ``nodes``; returns the end (None: the run
    has not ended). The common kinds are tested first (the roll-up walks every mark of
    every run that ends), a reply's handling written out here, not called."""
    sent: dict[str, tuple[str, float]] = {}
    waits: dict[str, tuple[str, float, NodeKind]] = {}
    last_at = marks[0].at
    for m in marks:
        kind = m.kind
        if kind == "reply_received":
            if not m.compensation and m.command_id in sent:
                step, at = sent.pop(m.command_id)
                node = nodes[step]
                end = m.at
                # ``span`` written out (as ``_phase_values``' ``_ms``): every reply.
                if node.first is None or at < node.first:
                    node.first = at
                if node.last is None or end > node.last:
                    node.last = end
                node.latencies_ms.append(end - at if end > at else 0.0)
                values = _phase_values(at, m)
                if values is not None:
                    if node.timed is None:
                        node.timed = [values]
                    else:
                        node.timed.append(values)
                if m.outcome == "success":
                    node.successes += 1
                else:
                    if m.outcome == "failure":
                        node.refusals += 1
                    if m.error:
                        node.errors.append(m.error[:MESSAGE_CHARS])
        elif kind == "command_issued":
            if m.step is not None and m.command_id is not None:
                _node(nodes, m.step).attempts += 1
                sent[m.command_id] = (m.step, m.at)
        elif kind == "compensation_issued":
            if m.step is not None:
                _node(nodes, m.step).compensations += 1
        elif kind in _ENDS:
            return m
        elif kind == "attempt_timed_out" and not m.compensation and m.command_id in sent:
            step, at = sent.pop(m.command_id)
            nodes[step].timeouts += 1
            nodes[step].span(at, m.at)
        elif kind == "timer_started" and m.purpose == "sleep" and m.wait_id:
            waits[m.wait_id] = (m.wait_id, m.at, "timer")
        elif kind == "event_awaited" and m.wait_id:
            waits[m.wait_id] = (f"event:{m.name}", m.at, "event")
        elif kind == "callback_awaited" and m.wait_id:
            waits[m.wait_id] = (f"callback:{m.name}", m.at, "callback")
        elif kind in _WAITS and m.wait_id in waits:
            _waited(nodes, waits.pop(m.wait_id), m)
        elif kind == "signal_received":
            # A signal wait leaves no event of its own: it is taken to run from the
            # history's previous event (when the saga last moved) to the signal.
            _waited(nodes, (f"signal:{m.name}", last_at, "signal"), m)
        last_at = m.at
    return None


def _node(nodes: dict[str, NodeRun], step: str) -> NodeRun:
    """A step's node in the run, made when it is first met (not made to be thrown away
    each time, as ``setdefault`` would)."""
    node = nodes.get(step)
    if node is None:
        node = nodes[step] = NodeRun(node_kind(step))
    return node


def _phase_values(issued: float, reply: Mark) -> PhaseValues | None:
    """The phases a reply's timings measure (None: none): each between two known marks
    of the chain issued -> sent -> received -> handler start -> end -> committed -> read
    -> stored, a phase whose either end is unknown left out (a duplicate's reply ran no
    handler; a kit may send none). The participant's marks are on its clock, the others
    the engine's (and the store's): a difference across clocks below 0 counts as 0.
    Written out, phase by phase (``_ms`` inline): the roll-up asks it of every reply."""
    sent, received, start, end = reply.sent, reply.received, reply.handler_start, reply.handler_end
    committed, at, recorded, cpu = reply.committed, reply.at, reply.recorded, reply.cpu_ms
    values = (
        None if sent is None else (d if (d := sent - issued) > 0.0 else 0.0),
        None if sent is None or received is None else (d if (d := received - sent) > 0.0 else 0.0),
        None
        if received is None or start is None
        else (d if (d := start - received) > 0.0 else 0.0),
        None if start is None or end is None else (d if (d := end - start) > 0.0 else 0.0),
        None if end is None or committed is None else (d if (d := committed - end) > 0.0 else 0.0),
        None if committed is None else (d if (d := at - committed) > 0.0 else 0.0),
        None if recorded is None else (d if (d := recorded - at) > 0.0 else 0.0),
        cpu,
    )
    return None if values == _UNMEASURED else values


_UNMEASURED: Final = (None,) * len(PHASE_NAMES)


def _waited(nodes: dict[str, NodeRun], wait: tuple[str, float, NodeKind], end: Mark) -> None:
    """A wait from ``wait``'s start to ``end``: answered (a callback posted to its fail
    URL is a refusal), or timed out (a callback's timer, whose id is its wait's)."""
    name, since, kind = wait
    node = nodes.setdefault(name, NodeRun(kind))
    node.attempts += 1
    node.span(since, end.at)
    if kind == "callback" and end.kind == "timer_fired":
        node.timeouts += 1
        return
    node.latencies_ms.append(_ms(since, end.at))
    if end.failed:
        node.refusals += 1
    else:
        node.successes += 1


def _overlaps(nodes: dict[str, NodeRun]) -> list[tuple[str, str]]:
    if len(nodes) < 2 or _one_after_another(nodes.values()):
        return []
    spans = sorted(
        [
            (n.first, n.last, name)
            for name, n in nodes.items()
            if n.first is not None and n.last is not None
        ]
    )
    pairs: list[tuple[str, str]] = []
    for i, (_, end_a, a) in enumerate(spans):
        # Sorted by start: the spans that overlap this one are those right after it.
        for j in range(i + 1, len(spans)):
            start_b, _, b = spans[j]
            if start_b >= end_a:
                break
            pairs.append((min(a, b), max(a, b)))
    return pairs


def _one_after_another(nodes: Iterable[NodeRun]) -> bool:
    """Whether the nodes' spans, in the order the run met them, each start where the
    previous one ended or later (and end where they start or later): then none overlaps
    another (most runs: no ``gather``), said without sorting them."""
    previous = -math.inf
    for n in nodes:
        first, last = n.first, n.last
        if first is None or last is None:
            continue
        if first < previous or last < first:
            return False
        previous = last
    return True


def _ms(start: float, end: float) -> float:
    ms = end - start
    return ms if ms > 0.0 else 0.0


def epoch_ms(at: datetime) -> float:
    return at.timestamp() * 1000


# --------------------------------------------------------------------------- aggregates


@dataclass(slots=True)
class Counters:
    """One aggregate row: what its runs added up to."""

    runs: int = 0
    attempts: int = 0
    successes: int = 0
    refusals: int = 0
    timeouts: int = 0
    compensations: int = 0
    #: The sum of its runs' offsets from the saga's start (ms): the graph's order.
    offset_ms: int = 0
    #: The sum of its runs' ranks among the run's nodes (0: first): the order's tie-break.
    rank_sum: int = 0
    hist: list[int] = field(default_factory=lambda: [0] * BUCKETS)
    #: A "phase" row's sum of its observations in microseconds (its mean: the histogram
    #: gives bounds, a learned cost needs the figure); 0 on the other rows.
    total_us: int = 0

    def add(self, other: Counters) -> None:
        self.runs += other.runs
        self.attempts += other.attempts
        self.successes += other.successes
        self.refusals += other.refusals
        self.timeouts += other.timeouts
        self.compensations += other.compensations
        self.offset_ms += other.offset_ms
        self.rank_sum += other.rank_sum
        self.total_us += other.total_us
        self.hist = [a + b for a, b in zip(self.hist, other.hist, strict=True)]

    def observe(self, ms: float) -> None:
        # ``_histogram_add`` counts a batch's values in the buckets this gives each.
        self.hist[histogram_index(ms)] += 1


#: An aggregate row's key: (saga type, bucket, facet, key, detail, flow policy). Facets:
#: "type" (key: the outcome), "node" (key: the node, detail: its kind), "error" (key: the
#: node, detail: the message), "overlap" (key and detail: the two nodes), "phase" (key:
#: the node, detail: one of ``PHASES`` or ``CPU``; runs: its observations, ``total_us``
#: their sum, the histogram theirs). The flow policy: the runs' (``RunSummary``).
RowKey = tuple[str, datetime, str, str, str, int]
#: A window's row as a store reads it (summed over its buckets): (facet, key, detail,
#: counters).
InsightRow = tuple[str, str, str, Counters]


def aggregate(summaries: Iterable[RunSummary]) -> dict[RowKey, Counters]:
    """The rows a batch of finished runs adds, one per key (sorted by the caller). A
    batch's rows are found once per (type, bucket, flow policy) and node, and what goes
    into a histogram or a sum (durations, latencies, phases) is gathered per row and
    added up once per batch (``_histogram_add``), not observed value by value."""
    rows: dict[RowKey, Counters] = {}
    groups: dict[tuple[str, int, int], _Group] = {}
    for s in summaries:
        key = (s.saga_type, _bucket_number(s.ended_at), s.flow_policy)
        group = groups.get(key)
        if group is None:
            group = groups[key] = _Group((s.saga_type, _bucket_start(key[1]), s.flow_policy), rows)
        group.add(s)
    for group in groups.values():
        group.finish()
    return rows


@dataclass(slots=True)
class _NodeRuns:
    """A node's row of a batch being added up: what is added run by run (the rank and
    the offset, which need the run), and the nodes of the runs that took it, whose
    counts and values are added once the batch is done (``_Group.finish``)."""

    row: Counters
    runs: list[NodeRun] = field(default_factory=list)


#: What ``_Group.finish`` adds up of a node's runs, field by field (C, no loop).
_node_counts: Final = operator.attrgetter(
    "attempts", "successes", "refusals", "timeouts", "compensations"
)
_latencies: Final = operator.attrgetter("latencies_ms")
_timed: Final = operator.attrgetter("timed")
_duration: Final = operator.attrgetter("duration_ms")


class _Group:
    """The rows a batch adds for one (saga type, bucket, flow policy)."""

    __slots__ = ("_key", "_nodes", "_rows", "_types")

    def __init__(self, key: tuple[str, datetime, int], rows: dict[RowKey, Counters]) -> None:
        self._key = key
        self._rows = rows
        self._types: dict[str, list[RunSummary]] = {}
        self._nodes: dict[tuple[str, str], _NodeRuns] = {}

    def row(self, facet: str, key: str, detail: str) -> Counters:
        """The batch's row of this key, made when it is first met."""
        saga_type, bucket, policy = self._key
        k = (saga_type, bucket, facet, key, detail, policy)
        c = self._rows.get(k)
        if c is None:
            c = self._rows[k] = Counters()
        return c

    def add(self, s: RunSummary) -> None:
        runs = self._types.get(s.outcome)
        if runs is None:
            self._types[s.outcome] = [s]
        else:
            runs.append(s)
        nodes, started = self._nodes, s.started_ms
        for rank, (name, n) in enumerate(s.nodes.items()):
            node = nodes.get((name, n.kind))
            if node is None:
                node = nodes[name, n.kind] = _NodeRuns(self.row("node", name, n.kind))
            node.runs.append(n)
            c = node.row
            c.rank_sum += rank
            # ``int(_ms(started, first))`` (0 when not after the start), written out.
            first = n.first
            if first is not None and first > started:
                c.offset_ms += int(first - started)
        for a, b in s.overlaps:
            self.row("overlap", a, b).runs += 1

    def finish(self) -> None:
        """Adds up what the batch gathered: its runs by outcome, its nodes' counts, the
        histograms, the errors, the phases."""
        for outcome, summaries in self._types.items():
            run = self.row("type", outcome, "")
            run.runs += len(summaries)
            _histogram_add(run.hist, list(map(_duration, summaries)))
        for (name, _), node in self._nodes.items():
            c, runs = node.row, node.runs
            c.runs += len(runs)
            attempts, successes, refusals, timeouts, compensations = map(
                sum, zip(*map(_node_counts, runs), strict=True)
            )
            c.attempts += attempts
            c.successes += successes
            c.refusals += refusals
            c.timeouts += timeouts
            c.compensations += compensations
            _histogram_add(c.hist, list(chain.from_iterable(map(_latencies, runs))))
            for n in runs:
                for message in n.errors:
                    self.row("error", name, message).runs += 1
            timed = list(chain.from_iterable(filter(None, map(_timed, runs))))
            if timed:
                self._phases(name, timed)

    def _phases(self, name: str, timed: list[PhaseValues]) -> None:
        """A node's phase rows from its replies' phases: per phase its observations,
        their sum (in microseconds, each rounded as it is added) and histogram."""
        for phase, column in zip(PHASE_NAMES, zip(*timed, strict=True), strict=True):
            values = [ms for ms in column if ms is not None] if None in column else column
            if values:
                p = self.row("phase", name, phase)
                p.runs += len(values)
                p.total_us += sum(map(round, map(operator.mul, values, repeat(1000))))
                _histogram_add(p.hist, values)


def _histogram_add(hist: list[int], values: Sequence[float]) -> None:
    """Adds ``values`` (ms) into ``hist``: each in the bucket ``histogram_index`` gives
    it, counted from the values sorted (how many fall at or below each bound), in C."""
    if not values:
        return
    ordered = sorted(values)
    at_or_below = [*map(bisect.bisect_right, repeat(ordered), BOUNDS_MS), len(ordered)]
    hist[:] = map(operator.add, hist, map(operator.sub, at_or_below, [0, *at_or_below]))
