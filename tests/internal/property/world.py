"""A simulated world around one ``SagaRuntime``: participants, a clock and an operator.

The world keeps no model of the saga. It looks at what the runtime says is outstanding
(commands, timers) and, step by step, lets hypothesis choose what happens next:

- a participant replies to one of the outstanding commands (success, business failure
  or retryable), in any order, and maybe the same reply arrives twice;
- a participant answers success with a payload the step's reply model refuses, or that
  Postgres cannot store: the runtime holds that reply and the saga is ``step_stuck``;
- a participant stays silent, so a pending timer (attempt timeout, retry backoff,
  sleep, deadline) fires instead;
- noise: a late reply for a command no longer awaited, a reply for a command id
  nobody issued, a timer firing that is no longer pending;
- an operator cancels, force-compensates or resumes the saga, whether or not that makes
  sense; skips a step whose reply is held (with a valid result, or an invalid one that
  must be refused), asks for a held reply to be checked again (refused: the code did not
  change), skips a step still waiting for its reply, or retries a step in its back-off.

The fake clock only moves forward: each input is a millisecond after the previous one,
and a timer fires at ``max(now, fire_at)``. After the random phase, the world drains:
every outstanding command gets a success reply, every held step is skipped with a valid
result (unless the run leaves them to an operator who never comes), and every timer
fires, until nothing is left to deliver. Every input and its outcome is recorded for the
oracles; a refused input is recorded with its error.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

from hypothesis import strategies as st

from saga_engine.core.authoring._definition import SagaDefinition
from saga_engine.core.history._decision import (
    Cancel,
    Decision,
    DropReason,
    ForceCompensate,
    Inbound,
    OutboundCommand,
    Reply,
    Resume,
    RetryStep,
    SignalInput,
    Skip,
    StartSaga,
    TimerDue,
)
from saga_engine.core.history._events import CommandIssued, CompensationIssued, Event
from saga_engine.core.history._status import SagaStatus
from saga_engine.core.runtime._runtime import SagaRuntime
from saga_engine.kernel._errors import InvalidPayload, InvalidTransition
from saga_engine.kernel._serde import JsonDict
from tests.internal.property.sagas import In, PropertySaga
from tests.internal.property.sagas import definition as saga_definition

T0 = datetime(2025, 1, 1, tzinfo=UTC)
TICK = timedelta(milliseconds=1)
#: No run may need more inputs than this to reach a terminal or parked state.
MAX_INPUTS = 200

Outcome = Literal["success", "failure", "retryable"]
#: Success first: hypothesis shrinks towards the first element.
OUTCOMES: list[Outcome] = ["success", "success", "failure", "retryable"]
DEADLINES = [None, timedelta(seconds=40), timedelta(seconds=90)]

#: Success payloads the steps' reply model (``Ack``: ``outcome: str``) refuses...
MALFORMED: list[JsonDict] = [{"outcome": 7}, {}, {"outcome": None}, {"outcome": ["ok"]}]
#: ...and ones Postgres cannot store (the model alone would accept them).
UNSTORABLE: list[JsonDict] = [
    {"outcome": "ok\u0000"},
    {"outcome": "ok", "note": "\ud800"},
    {"outcome": "ok", "n": 2**70},
]
#: What an operator answers a step with: valid for ``Ack``, or not.
VALID_RESULT: JsonDict = {"outcome": "skipped by an operator"}
INVALID_RESULTS: list[JsonDict] = [{"outcome": 7}, {}, {"outcome": "a\u0000b"}]

#: An input the runtime refused; it must leave no trace.
Refusal = InvalidTransition | InvalidPayload


@dataclass
class Delivery:
    """One input the world delivered, and what came of it."""

    kind: str
    inbound: Inbound
    decision: Decision | None
    refused: Refusal | None
    status_before: SagaStatus
    status_after: SagaStatus
    history_before: int
    history_after: int
    #: What the world expects the runtime to drop this input as (None: not a drop).
    expected_drop: DropReason | None
    outstanding_before: list[OutboundCommand]
    outstanding_after: list[OutboundCommand]
    timers_before: dict[str, datetime]
    timers_after: dict[str, datetime]
    #: The runtime's own account of the steps whose reply is held.
    held_before: list[str]
    held_after: list[str]


@dataclass
class Snapshot:
    """The live runtime at a decision boundary, and a replay of its history at that point."""

    deliveries: int
    history: list[Event]
    status: SagaStatus
    outstanding: list[OutboundCommand]
    timers: dict[str, datetime]
    held: list[str]
    replay_decision: Decision
    #: The replayed runtime's state right after the replay (it then runs in lockstep).
    replayed_status: SagaStatus
    replayed_outstanding: list[OutboundCommand]
    replayed_timers: dict[str, datetime]
    replayed_held: list[str]
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
    #: How often, against a weight of 6 for a good reply, a participant replies badly.
    bad_reply_weight: int = 2
    #: Signals someone may send (none unless a test asks: the other sagas declare none).
    signals: tuple[str, ...] = ()
    #: The outcomes a participant's reply is drawn from (success first, for shrinking).
    outcomes: tuple[Outcome, ...] = tuple(OUTCOMES)
    #: The most inputs a run may take before ``drain`` calls it stranded.
    max_inputs: int = MAX_INPUTS

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
        outstanding_before = self.rt.outstanding_commands()
        timers_before = self.rt.pending_timers()
        held_before = self.rt.held_steps()
        decision: Decision | None = None
        refused: Refusal | None = None
        try:
            decision = self.rt.handle(inbound)
        except (InvalidTransition, InvalidPayload) as exc:
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
                outstanding_before=outstanding_before,
                outstanding_after=self.rt.outstanding_commands(),
                timers_before=timers_before,
                timers_after=self.rt.pending_timers(),
                held_before=held_before,
                held_after=self.rt.held_steps(),
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
        live_refused: Refusal | None,
    ) -> None:
        where = f"shadow {index}, input #{len(self.deliveries) + 1} {inbound!r}"
        replayed_refused: Refusal | None = None
        try:
            replayed: Decision | None = shadow.handle(inbound)
        except (InvalidTransition, InvalidPayload) as exc:
            replayed, replayed_refused = None, exc
        if (replayed is None) != (live_refused is not None):
            self.mismatches.append(
                f"{where}: live refused={live_refused!r}, replayed refused={replayed_refused!r}"
            )
            return
        if live_refused is not None and (
            type(live_refused) is not type(replayed_refused)
            or str(live_refused) != str(replayed_refused)
        ):
            self.mismatches.append(
                f"{where}: refused differently: live {live_refused!r}, "
                f"replayed {replayed_refused!r}"
            )
            return
        if replayed is None or live is None:
            return
        if shadow.held_steps() != self.rt.held_steps():
            self.mismatches.append(
                f"{where}: held steps differ: live {self.rt.held_steps()}, "
                f"replayed {shadow.held_steps()}"
            )
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
            held=self.rt.held_steps(),
            replay_decision=decision,
            replayed_status=replayed.status,
            replayed_outstanding=replayed.outstanding_commands(),
            replayed_timers=replayed.pending_timers(),
            replayed_held=replayed.held_steps(),
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
        held = self.rt.held_steps()
        parked = self.parked_steps()
        waiting = sorted({c.step for c in out if not c.compensation})
        backoffs = sorted(
            t.split(":")[1]
            for t, _ in timers
            if t.startswith("retry:") and not t.startswith("retry:compensate:")
        )
        kinds: list[str] = []
        if out:
            kinds += ["reply"] * 6 + ["bad_reply"] * self.bad_reply_weight
        if timers:
            kinds += ["timer"] * 3
        kinds += ["unknown", "stale_timer", "cancel", "resume"]
        if late:
            kinds.append("late")
        if held:
            kinds += ["skip_held"] * 3 + ["retry_held"] * 2 + ["skip_invalid"] * 2
        if waiting:
            kinds += ["skip_waiting"]
        if backoffs:
            kinds += ["retry_backoff"]
        if parked:
            kinds += ["retry_parked"] * 3 + ["skip_parked", "cancel"]
        if self.signals:
            kinds += ["signal"] * 3
        kind = data.draw(st.sampled_from(kinds), label="action")
        if kind == "signal":
            name = data.draw(st.sampled_from(self.signals), label="signal")
            signal_id = str(uuid.UUID(int=len(self.deliveries) + 1))
            self.deliver("signal", SignalInput(signal_id, name, self.tick(), {"ok": True}))
            return
        if kind == "bad_reply":
            cmd = out[data.draw(st.integers(0, len(out) - 1), label="which command replies")]
            payload = data.draw(st.sampled_from(MALFORMED + UNSTORABLE), label="bad payload")
            reply = Reply(cmd.command_id, "success", self.tick(), payload=dict(payload))
            self.deliver("bad_reply", reply)
            if data.draw(st.booleans(), label="bad reply delivered twice"):
                self.deliver("duplicate", reply, DropReason.DUPLICATE_REPLY)
        elif kind == "skip_held":
            step = held[data.draw(st.integers(0, len(held) - 1), label="held step")]
            self.deliver("skip_held", self._skip(step, VALID_RESULT))
        elif kind == "skip_invalid":
            steps = sorted({*held, *waiting})
            step = steps[data.draw(st.integers(0, len(steps) - 1), label="step to skip")]
            result = data.draw(st.sampled_from(INVALID_RESULTS), label="invalid result")
            self.deliver("skip_invalid", self._skip(step, result))
        elif kind == "retry_parked":
            step = parked[data.draw(st.integers(0, len(parked) - 1), label="parked step")]
            self.deliver("retry_parked", RetryStep(step, self.tick(), "operator", "fixed"))
        elif kind == "skip_parked":
            step = parked[data.draw(st.integers(0, len(parked) - 1), label="parked step")]
            self.deliver("skip_parked", self._skip(step, VALID_RESULT))
        elif kind == "retry_held":
            step = held[data.draw(st.integers(0, len(held) - 1), label="held step")]
            self.deliver("retry_held", RetryStep(step, self.tick(), "operator", "check again"))
        elif kind == "skip_waiting":
            step = waiting[data.draw(st.integers(0, len(waiting) - 1), label="waiting step")]
            self.deliver("skip_waiting", self._skip(step, VALID_RESULT))
        elif kind == "retry_backoff":
            step = backoffs[data.draw(st.integers(0, len(backoffs) - 1), label="backoff")]
            self.deliver("retry_backoff", RetryStep(step, self.tick(), "operator", "now"))
        elif kind == "reply":
            cmd = out[data.draw(st.integers(0, len(out) - 1), label="which command replies")]
            outcome = data.draw(st.sampled_from(self.outcomes), label="outcome")
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
            if data.draw(st.integers(0, 2), label="force instead of cancel") == 0:
                self.deliver("force", ForceCompensate("undo it all", self.tick(), "operator"))
            else:
                self.deliver("cancel", Cancel("the world changed its mind", self.tick(), "tester"))
        else:
            self.deliver("resume", Resume(self.tick(), "operator", "try again"))

    def parked_steps(self) -> list[str]:
        """Steps parked after they could not succeed (``on_exhausted="park"``, or past
        the pivot), waiting for an operator's retry or skip."""
        return sorted(self.rt.state.parked_steps)

    def _skip(self, step: str, result: JsonDict) -> Skip:
        return Skip(step, self.tick(), dict(result), "operator", "answered by hand")

    def drain(self, *, resume_when_stuck: bool, release_held: bool = True) -> None:
        """Answers everything with success, skips held steps with a valid result (when
        ``release_held``) and fires every timer until nothing is left."""
        while True:
            out = self.rt.outstanding_commands()
            timers = self.sorted_timers()
            stuck = self.rt.status == SagaStatus.COMPENSATION_STUCK
            held = self.rt.held_steps() if release_held else []
            parked = self.parked_steps() if release_held else []
            if not (out or timers or held or parked or (stuck and resume_when_stuck)):
                return
            if len(self.deliveries) >= self.max_inputs:
                raise AssertionError(
                    f"saga still {self.rt.status.value} after {self.max_inputs} inputs, with "
                    f"{len(out)} command(s), {len(held)} held step(s) and {len(timers)} "
                    "timer(s) still deliverable"
                )
            if out:
                self.deliver("drain_reply", _reply(out[0].command_id, "success", self.tick()))
            elif held:
                self.deliver("drain_skip", self._skip(held[0], VALID_RESULT))
            elif parked:
                self.deliver("drain_retry", RetryStep(parked[0], self.tick(), "operator", "drain"))
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
    #: Whether the drain skipped held steps (else the run may end step_stuck).
    release_held: bool


def simulate(
    saga: type[PropertySaga],
    data: st.DataObject,
    *,
    snapshots: bool = True,
    bad_reply_weight: int = 2,
    signals: tuple[str, ...] = (),
    outcomes: tuple[Outcome, ...] = tuple(OUTCOMES),
) -> Run:
    """Starts a saga and lets the world drive it to its end (terminal or parked)."""
    saga_id = f"saga-{data.draw(st.integers(0, 3), label='saga id')}"
    deadline = data.draw(st.sampled_from(DEADLINES), label="deadline")
    budget = data.draw(st.integers(0, 60), label="random inputs")
    snap_at = data.draw(st.integers(0, 40), label="snapshot after") if snapshots else -1
    resume = data.draw(st.booleans(), label="operator resumes stuck sagas")
    release = data.draw(st.integers(0, 3), label="operator answers held steps (0: never)") > 0
    world = World.begin(saga, saga_id, deadline)
    world.bad_reply_weight = bad_reply_weight
    world.signals = signals
    world.outcomes = outcomes
    for _ in range(budget):
        if len(world.deliveries) == snap_at and not world.snapshots:
            world.snapshot()
        world.random_step(data)
        # Also rebuild the saga the first time a reply is held: the rebuilt copy then
        # goes on in lockstep through the operator's actions on it.
        stuck = world.rt.status == SagaStatus.STEP_STUCK
        if (
            snapshots
            and stuck
            and not any(s.status == SagaStatus.STEP_STUCK for s in world.snapshots)
        ):
            world.snapshot()
    if snapshots and not world.snapshots:
        world.snapshot()
    world.drain(resume_when_stuck=resume, release_held=release)
    return Run(world, resume, release)
