"""Continue-as-new in the pure core: the old run's end and the new run's first intents
in one decision, a replay of the continued run alone (and of the whole history) that
matches, the refusal while anything is in flight, and carried against dropped
compensations (issue 41 section 4)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from pydantic import BaseModel

from saga_engine import Saga, SagaContext, SagaStatus, Signal
from saga_engine.core.authoring._definition import SagaDefinition
from saga_engine.core.history._decision import Cancel, Reply, SignalInput, StartSaga, TimerDue
from saga_engine.core.history._events import (
    CommandIssued,
    CompensationIssued,
    Event,
    RunContinued,
    event_from_json,
    event_to_json,
)
from saga_engine.core.runtime._runtime import SagaRuntime
from saga_engine.core.views._view import saga_view_of

T0 = datetime(2030, 1, 1, tzinfo=UTC)


class Loop(BaseModel):
    n: int = 0
    until: int = 3
    carry: bool = True


class Charge(BaseModel):
    n: int


class Refund(BaseModel):
    n: int


class Done(BaseModel):
    n: int


class Nudge(BaseModel):
    pass


class Looping(Saga[Loop, Done]):
    """Each run charges (always step "charge": the runs may reuse names), waits for a
    nudge, and continues with n + 1."""

    name = "looping"
    nudge = Signal(Nudge)

    async def run(self, ctx: SagaContext, loop: Loop) -> Done:
        await ctx.step("charge", to="pay", command=Charge(n=loop.n), compensate=Refund(n=loop.n))
        await ctx.wait_signal(self.nudge)
        if loop.n + 1 >= loop.until:
            return Done(n=loop.n)
        return await ctx.continue_as_new(
            loop.model_copy(update={"n": loop.n + 1}), carry_compensations=loop.carry
        )


class Hasty(Saga[Loop, Done]):
    """Continues while a sleep of another task is still pending."""

    name = "hasty"
    nudge = Signal(Nudge)

    async def run(self, ctx: SagaContext, loop: Loop) -> Done:
        napping = asyncio.ensure_future(ctx.sleep(timedelta(hours=1)))
        await ctx.wait_signal(self.nudge)
        await ctx.continue_as_new(loop)
        await napping
        raise AssertionError("unreachable")


LOOPING = SagaDefinition.of(Looping)


def _start(definition: SagaDefinition, loop: Loop) -> SagaRuntime:
    rt, _ = SagaRuntime.start(
        definition,
        StartSaga(saga_id="s-1", saga_type=definition.name, input=loop.model_dump(), at=T0),
    )
    return rt


def _charge_id(rt: SagaRuntime) -> str:
    return next(e.command_id for e in reversed(rt.history) if isinstance(e, CommandIssued))


def _one_period(rt: SagaRuntime, i: int) -> list[Event]:
    """Answers the run's charge and nudges it: the events the two decisions recorded."""
    at = T0 + timedelta(days=i + 1)
    events = rt.handle(Reply(_charge_id(rt), "success", at)).events
    return events + rt.handle(SignalInput(signal_id=f"n-{i}", name="nudge", at=at)).events


def _json(events: list[Event]) -> list[Event]:
    return [event_from_json(event_to_json(e)) for e in events]


def test_a_continue_records_the_end_and_the_next_runs_first_intents_in_one_decision() -> None:
    rt = _start(LOOPING, Loop())
    first_charge = _charge_id(rt)
    decided = _one_period(rt, 0)
    kinds = [e.kind for e in decided]
    assert kinds[-3:] == ["signal_received", "run_continued", "command_issued"]
    continued = decided[-2]
    assert isinstance(continued, RunContinued)
    assert continued.run == 2
    assert continued.input == {"n": 1, "until": 3, "carry": True}
    assert continued.first_seq == rt.last_seq - 1  # what the store numbers it
    assert [c.step for c in continued.carried] == ["charge@run1"]
    assert rt.run == 2
    # The same step name in the next run is another command.
    assert _charge_id(rt) != first_charge
    assert rt.history[0].kind == "saga_started"
    assert rt.history[1] is continued  # the runtime holds the current run only
    assert rt.run_events == 2


def test_a_continued_run_replays_from_its_own_start_and_the_whole_history_too() -> None:
    rt = _start(LOOPING, Loop(until=5))
    whole: list[Event] = list(rt.history)
    for i in range(3):
        whole += _one_period(rt, i)
    assert rt.run == 4
    current = rt.history
    again, decision = SagaRuntime.replay(LOOPING, "s-1", _json(current))
    assert decision.nondeterminism is None
    assert decision.events == []
    assert (again.run, again.last_seq, again.status) == (4, rt.last_seq, SagaStatus.RUNNING)
    assert [c.command_id for c in again.outstanding_commands()] == [_charge_id(rt)]
    # The charge of run 4 is in flight (not owed yet); the runs before owe theirs.
    assert again.owed_compensations() == ["charge@run3", "charge@run2", "charge@run1"]
    # The whole history replays to the same place through each run's end.
    full, decision = SagaRuntime.replay(LOOPING, "s-1", _json(whole))
    assert decision.nondeterminism is None
    assert decision.events == []
    assert (full.run, full.last_seq) == (4, rt.last_seq)
    assert full.owed_compensations() == again.owed_compensations()
    # The view of the current run alone numbers it where it stands, and owes the same.
    view = saga_view_of(current, saga_id="s-1")
    assert view.run == 4
    # (and lists the charge in flight first: undone first if the run stopped now)
    assert [o.step for o in view.owed] == ["charge", *again.owed_compensations()]
    for runtime in (again, full):
        runtime.close()


def _cancelled_refunds(carry: bool) -> list[tuple[str, int]]:
    rt = _start(LOOPING, Loop(until=9, carry=carry))
    for i in range(2):
        _one_period(rt, i)
    at = T0 + timedelta(days=10)
    rt.handle(Reply(_charge_id(rt), "success", at))
    refunds: list[tuple[str, int]] = []
    decision = rt.handle(Cancel(at=at, reason="stop"))
    while True:
        issued = [e for e in decision.events if isinstance(e, CompensationIssued)]
        if not issued:
            break
        refunds += [(e.step, e.payload["n"]) for e in issued]
        decision = rt.handle(Reply(issued[-1].command_id, "success", at))
    assert rt.status == SagaStatus.CANCELLED
    return refunds


def test_carried_compensations_are_undone_in_one_long_runs_order() -> None:
    assert _cancelled_refunds(carry=True) == [
        ("charge", 2),
        ("charge@run2", 1),
        ("charge@run1", 0),
    ]


def test_without_carrying_only_the_current_runs_steps_are_undone() -> None:
    assert _cancelled_refunds(carry=False) == [("charge", 2)]


def test_a_continue_with_work_in_flight_parks_naming_it_and_records_no_new_run() -> None:
    rt = _start(SagaDefinition.of(Hasty), Loop())
    decision = rt.handle(SignalInput(signal_id="n", name="nudge", at=T0))
    assert [e.kind for e in decision.events] == ["signal_received", "saga_parked"]
    assert rt.status == SagaStatus.NONDETERMINISTIC
    parked = decision.events[-1]
    message = parked.error.message  # type: ignore[union-attr]
    assert "continue_as_new is refused" in message
    assert "timer 'sleep:1'" in message
    assert rt.run == 1


def test_a_timer_of_the_old_run_never_reaches_the_new_one() -> None:
    rt = _start(LOOPING, Loop())
    _one_period(rt, 0)
    decision = rt.handle(TimerDue("sleep:1", T0 + timedelta(days=3)))
    assert decision.dropped is not None
    assert decision.events == []


class Wrong(Saga[Loop, Done]):
    """Continues with an input its own model refuses."""

    name = "wrong"
    nudge = Signal(Nudge)

    async def run(self, ctx: SagaContext, loop: Loop) -> Done:
        await ctx.wait_signal(self.nudge)
        return await ctx.continue_as_new({"n": "not a number", "until": 3})


def test_a_next_input_the_model_refuses_parks_naming_the_field() -> None:
    rt = _start(SagaDefinition.of(Wrong), Loop())
    decision = rt.handle(SignalInput(signal_id="n", name="nudge", at=T0))
    assert [e.kind for e in decision.events] == ["signal_received", "saga_parked"]
    message = decision.events[-1].error.message  # type: ignore[union-attr]
    assert "the next run's input is refused" in message
    assert "n" in message
    assert rt.run == 1


def test_a_signal_received_before_the_continue_is_waited_for_by_the_next_run() -> None:
    rt = _start(LOOPING, Loop())
    at = T0 + timedelta(days=1)
    rt.handle(Reply(_charge_id(rt), "success", at))
    # Two nudges in a row: the first ends run 1; the second waits for run 2's code.
    rt.handle(SignalInput(signal_id="n-1", name="nudge", at=at))
    rt.handle(SignalInput(signal_id="n-2", name="nudge", at=at))
    assert rt.run == 2
    continued = rt.history[1]
    assert isinstance(continued, RunContinued)
    assert continued.seen_signals == ["n-1"]
    # Run 2's charge answered: it finds n-2 buffered and continues at once.
    decision = rt.handle(Reply(_charge_id(rt), "success", at))
    assert [e.kind for e in decision.events][:2] == ["reply_received", "run_continued"]
    assert rt.run == 3
    # A late copy of a signal the ended run took is still recognised.
    again = rt.handle(SignalInput(signal_id="n-2", name="nudge", at=at))
    assert again.dropped is not None


def test_a_signal_not_yet_waited_for_is_carried_into_the_next_run() -> None:
    rt = _start(LOOPING, Loop(until=9))
    at = T0 + timedelta(days=1)
    for sid in ("n-1", "n-2"):  # both come while run 1 waits for its charge
        rt.handle(SignalInput(signal_id=sid, name="nudge", at=at))
    rt.handle(Reply(_charge_id(rt), "success", at))  # takes n-1, continues
    continued = rt.history[1]
    assert isinstance(continued, RunContinued)
    assert continued.signals == {"nudge": [{}]}  # n-2, not lost at the boundary
    decision = rt.handle(Reply(_charge_id(rt), "success", at))  # run 2 takes n-2
    assert "run_continued" in [e.kind for e in decision.events]
    assert rt.run == 3
    replayed, check = SagaRuntime.replay(LOOPING, "s-1", _json(rt.history))
    assert check.nondeterminism is None
    assert check.events == []
    replayed.close()
