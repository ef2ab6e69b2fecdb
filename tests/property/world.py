"""A simulated world around one ``SagaRuntime``: participants, a clock and an operator.

The world keeps no model of the saga. It looks at what the runtime says is outstanding
(commands, timers) and, step by step, lets hypothesis choose what happens next:

- a participant replies to one of the outstanding commands (success, business failure
  or retryable), in any order, and maybe the same reply arrives twice;
- a participant stays silent, so a pending timer (attempt timeout, retry backoff,
  sleep, deadline) fires instead;
- noise: a late reply for a command no longer awaited, a reply for a command id
  nobody issued, a timer firing that is no longer pending;
- an operator cancels or resumes the saga, whether or not that makes sense.

The fake clock only moves forward: each input is a millisecond after the previous one,
and a timer fires at ``max(now, fire_at)``. After the random phase, the world drains:
every outstanding command gets a success reply and every timer fires, until nothing is
left to deliver. Every input and its outcome is recorded for the oracles.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

from hypothesis import strategies as st

from saga_engine._decision import (
    Cancel,
    Decision,
    DropReason,
    Inbound,
    OutboundCommand,
    Reply,
    Resume,
    StartSaga,
    TimerDue,
)
from saga_engine._definition import SagaDefinition
from saga_engine._errors import InvalidTransition
from saga_engine._events import CommandIssued, CompensationIssued, Event
from saga_engine._runtime import SagaRuntime
from saga_engine._status import SagaStatus
from tests.property.sagas import In, PropertySaga
from tests.property.sagas import definition as saga_definition

T0 = datetime(2025, 1, 1, tzinfo=UTC)
TICK = timedelta(milliseconds=1)
#: No run may need more inputs than this to reach a terminal or parked state.
MAX_INPUTS = 200

Outcome = Literal["success", "failure", "retryable"]
#: Success first: hypothesis shrinks towards the first element.
OUTCOMES: list[Outcome] = ["success", "success", "failure", "retryable"]
DEADLINES = [None, timedelta(seconds=40), timedelta(seconds=90)]


@dataclass
class Delivery:
    """One input the world delivered, and what came of it."""

    kind: str
    inbound: Inbound
    decision: Decision | None
    refused: InvalidTransition | None
    status_before: SagaStatus
    status_after: SagaStatus
    history_before: int
    history_after: int
    #: What the world expects the runtime to drop this input as (None: not a drop).
    expected_drop: DropReason | None
    outstanding_after: list[OutboundCommand]
    timers_after: dict[str, datetime]


@dataclass
class Snapshot:
    """The live runtime at a decision boundary, and a replay of its history at that point."""

    deliveries: int
    history: list[Event]
    status: SagaStatus
    outstanding: list[OutboundCommand]
    timers: dict[str, datetime]
    replay_decision: Decision
    #: The replayed runtime's state right after the replay (it then runs in lockstep).
    replayed_status: SagaStatus
    replayed_outstanding: list[OutboundCommand]
    replayed_timers: dict[str, datetime]
    replayed_history: list[Event]


@dataclass
class World:
    definition: SagaDefinition
    rt: SagaRuntime
    start_decision: Decision | None
    now: datetime
    #: Every command the world was asked to send, in order.
    sent: list[OutboundCommand] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    fired: list[str] = field(default_factory=list)
    snapshots: list[Snapshot] = field(default_factory=list)
    #: Replayed runtimes driven in lockstep with the live one, and where they differed.
    shadows: list[SagaRuntime] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    start_timers: dict[str, datetime] = field(default_factory=dict)

    @classmethod
    def begin(
        cls, saga: type[PropertySaga], saga_id: str, deadline: timedelta | None = None
    ) -> World:
        definition = saga_definition(saga)
        start = StartSaga(
            saga_id=saga_id,
            saga_type=definition.name,
            input=In().model_dump(mode="json"),
            at=T0,
            deadline_at=T0 + deadline if deadline is not None else None,
        )
        rt, decision = SagaRuntime.start(definition, start)
        world = cls(definition, rt, decision, T0, sent=list(decision.commands))
        world.start_timers = rt.pending_timers()
        return world

    @classmethod
    def adopt(cls, definition: SagaDefinition, rt: SagaRuntime, now: datetime) -> World:
        """Goes on with a runtime rebuilt elsewhere (its earlier commands count as sent)."""
        world = cls(definition, rt, None, now)
        world.sent = [
            rt._outbound(e) for e in rt.history if isinstance(e, CommandIssued | CompensationIssued)
        ]
        return world

    # ------------------------------------------------------------------ delivering

    def tick(self) -> datetime:
        self.now += TICK
        return self.now

    def sorted_timers(self) -> list[tuple[str, datetime]]:
        return sorted(self.rt.pending_timers().items(), key=lambda kv: (kv[1], kv[0]))

    def deliver(
        self, kind: str, inbound: Inbound, expected_drop: DropReason | None = None
    ) -> Decision | None:
        status_before = self.rt.status
        history_before = len(self.rt.history)
        decision: Decision | None = None
        refused: InvalidTransition | None = None
        try:
            decision = self.rt.handle(inbound)
        except InvalidTransition as exc:
            refused = exc
        for i, shadow in enumerate(self.shadows):
            self._lockstep(i, shadow, inbound, decision, refused)
        if decision is not None:
            self.sent.extend(decision.commands)
        self.deliveries.append(
            Delivery(
                kind=kind,
                inbound=inbound,
                decision=decision,
                refused=refused,
                status_before=status_before,
                status_after=self.rt.status,
                history_before=history_before,
                history_after=len(self.rt.history),
                expected_drop=expected_drop,
                outstanding_after=self.rt.outstanding_commands(),
                timers_after=self.rt.pending_timers(),
            )
        )
        return decision

    def fire(self, kind: str, timer_id: str, fire_at: datetime) -> None:
        self.now = max(self.now, fire_at)
        self.deliver(kind, TimerDue(timer_id, self.now))
        self.fired.append(timer_id)

    def _lockstep(
        self,
        index: int,
        shadow: SagaRuntime,
        inbound: Inbound,
        live: Decision | None,
        live_refused: InvalidTransition | None,
    ) -> None:
        where = f"shadow {index}, input #{len(self.deliveries) + 1} {inbound!r}"
        try:
            replayed: Decision | None = shadow.handle(inbound)
        except InvalidTransition:
            replayed = None
        if (replayed is None) != (live_refused is not None):
            self.mismatches.append(f"{where}: live refused={live_refused}, replayed refused")
            return
        if replayed is None or live is None:
            return
        for what, a, b in (
            ("events", live.events, replayed.events),
            ("commands", live.commands, replayed.commands),
            ("dropped", live.dropped, replayed.dropped),
            ("status", live.status, replayed.status),
            ("nondeterminism", live.nondeterminism, replayed.nondeterminism),
        ):
            if a != b:
                self.mismatches.append(f"{where}: {what} differ: live {a!r}, replayed {b!r}")

    # ------------------------------------------------------------------ snapshots

    def snapshot(self) -> Snapshot:
        history = self.rt.history
        replayed, decision = SagaRuntime.replay(self.definition, self.rt.saga_id, history)
        snap = Snapshot(
            deliveries=len(self.deliveries),
            history=history,
            status=self.rt.status,
            outstanding=self.rt.outstanding_commands(),
            timers=self.rt.pending_timers(),
            replay_decision=decision,
            replayed_status=replayed.status,
            replayed_outstanding=replayed.outstanding_commands(),
            replayed_timers=replayed.pending_timers(),
            replayed_history=replayed.history,
        )
        self.snapshots.append(snap)
        self.shadows.append(replayed)
        return snap

    # ------------------------------------------------------------------ behaviour

    def random_step(self, data: st.DataObject) -> None:
        out = self.rt.outstanding_commands()
        out_ids = {c.command_id for c in out}
        timers = self.sorted_timers()
        late = list(dict.fromkeys(c.command_id for c in self.sent if c.command_id not in out_ids))
        kinds: list[str] = []
        if out:
            kinds += ["reply"] * 6
        if timers:
            kinds += ["timer"] * 3
        kinds += ["unknown", "stale_timer", "cancel", "resume"]
        if late:
            kinds.append("late")
        kind = data.draw(st.sampled_from(kinds), label="action")
        if kind == "reply":
            cmd = out[data.draw(st.integers(0, len(out) - 1), label="which command replies")]
            outcome = data.draw(st.sampled_from(OUTCOMES), label="outcome")
            reply = _reply(cmd.command_id, outcome, self.tick())
            self.deliver("reply", reply)
            if data.draw(st.booleans(), label="reply delivered twice"):
                self.deliver("duplicate", reply, DropReason.DUPLICATE_REPLY)
        elif kind == "timer":
            timer_id, fire_at = timers[data.draw(st.integers(0, len(timers) - 1), label="timer")]
            self.fire("timer", timer_id, fire_at)
        elif kind == "late":
            command_id = late[data.draw(st.integers(0, len(late) - 1), label="late reply")]
            outcome = data.draw(st.sampled_from(OUTCOMES), label="late outcome")
            self.deliver(
                "late", _reply(command_id, outcome, self.tick()), DropReason.DUPLICATE_REPLY
            )
        elif kind == "unknown":
            # uuid5 ids carry version bits; a small integer UUID never collides with one.
            bogus = str(uuid.UUID(int=data.draw(st.integers(0, 2**32), label="bogus id")))
            self.deliver(
                "unknown", _reply(bogus, "success", self.tick()), DropReason.UNKNOWN_COMMAND
            )
        elif kind == "stale_timer":
            pending = self.rt.pending_timers()
            stale = [t for t in self.fired if t not in pending] + ["timeout:nobody:1"]
            timer_id = stale[data.draw(st.integers(0, len(stale) - 1), label="stale timer")]
            self.deliver("stale_timer", TimerDue(timer_id, self.tick()), DropReason.STALE_TIMER)
        elif kind == "cancel":
            self.deliver("cancel", Cancel("the world changed its mind", self.tick(), "tester"))
        else:
            self.deliver("resume", Resume(self.tick(), "operator", "try again"))

    def drain(self, *, resume_when_stuck: bool) -> None:
        """Answers everything with success and fires every timer until nothing is left."""
        while True:
            out = self.rt.outstanding_commands()
            timers = self.sorted_timers()
            stuck = self.rt.status == SagaStatus.COMPENSATION_STUCK
            if not out and not timers and not (stuck and resume_when_stuck):
                return
            if len(self.deliveries) >= MAX_INPUTS:
                raise AssertionError(
                    f"saga still {self.rt.status.value} after {MAX_INPUTS} inputs, with "
                    f"{len(out)} command(s) and {len(timers)} timer(s) still deliverable"
                )
            if out:
                self.deliver("drain_reply", _reply(out[0].command_id, "success", self.tick()))
            elif timers:
                self.fire("drain_timer", *timers[0])
            else:
                self.deliver("drain_resume", Resume(self.tick(), "operator", "drain"))


def _reply(command_id: str, outcome: Outcome, at: datetime) -> Reply:
    error = None if outcome == "success" else f"{outcome} from the world"
    return Reply(command_id, outcome, at, payload={"outcome": outcome}, error=error)


@dataclass
class Run:
    world: World
    resume_when_stuck: bool


def simulate(saga: type[PropertySaga], data: st.DataObject, *, snapshots: bool = True) -> Run:
    """Starts a saga and lets the world drive it to its end (terminal or parked)."""
    saga_id = f"saga-{data.draw(st.integers(0, 3), label='saga id')}"
    deadline = data.draw(st.sampled_from(DEADLINES), label="deadline")
    budget = data.draw(st.integers(0, 60), label="random inputs")
    snap_at = data.draw(st.integers(0, 40), label="snapshot after") if snapshots else -1
    resume = data.draw(st.booleans(), label="operator resumes stuck sagas")
    world = World.begin(saga, saga_id, deadline)
    for _ in range(budget):
        if len(world.deliveries) == snap_at and not world.snapshots:
            world.snapshot()
        world.random_step(data)
    if snapshots and not world.snapshots:
        world.snapshot()
    world.drain(resume_when_stuck=resume)
    return Run(world, resume)
