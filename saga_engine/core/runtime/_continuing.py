"""Continue-as-new: a run ends and the saga's next run begins, under the same saga id.

``ctx.continue_as_new(state)`` (:func:`continue_as_new`) records one event,
``run_continued``, that closes the run and opens the next with ``state`` as its input.
Being one event in one append, the old run's end and the new run's beginning are atomic:
a crash leaves either the old run whole (the input that led to it is applied again) or
the new one begun. What the new run inherits is recorded in that event, once: the
compensations still owed (unless ``carry_compensations=False``, an explicit commit
point), the saga's counters, signals not yet waited for, a passed pivot, a held key.

A run loaded later is read from its ``saga_started`` and its ``run_continued`` only
(:func:`begin_run` rebuilds the state from them): replay time and memory follow one run,
not the saga's life. ``ctx.should_continue_as_new()`` (:func:`should_continue`) says when
the run's history has passed the runner's bound (``engine.continue_as_new_after``).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from typing import Any, NoReturn

from pydantic import BaseModel

from saga_engine.core.history._decision import DEADLINE_TIMER
from saga_engine.core.history._events import (
    CarriedCompensation,
    RunContinued,
    SagaStarted,
    SignalReceived,
)
from saga_engine.core.history._fold import owned
from saga_engine.core.runtime._intents import check_open, emit
from saga_engine.core.runtime._lifecycle import run_lifecycle
from saga_engine.core.runtime._state import OwedCompensation, SagaState
from saga_engine.kernel._errors import InvalidPayload
from saga_engine.kernel._serde import JsonDict

#: ``should_continue_as_new`` says True past this many events in a run, unless the
#: runner says otherwise (``EngineSettings.continue_as_new_after``).
DEFAULT_RUN_EVENTS = 10_000


def run_events(s: SagaState) -> int:
    """How many events the current run has recorded (its first event included)."""
    return len(s.history) - (1 if s.run > 1 else 0)


def should_continue(s: SagaState, bound: int | None) -> bool:
    """The run's history has reached ``bound`` events (the runner's setting)."""
    return run_events(s) >= (DEFAULT_RUN_EVENTS if bound is None else bound)


def in_flight(s: SagaState) -> list[str]:
    """What the run still has under way, in words: a run continues only with nothing."""
    busy = [
        f"step {f.event.step!r}" + (" (its reply is held)" if f.held is not None else "")
        for f in s.inflight.values()
    ]
    busy += [f"parked step {step!r}" for step in s.parked_steps]
    busy += [f"timer {tid!r}" for tid in s.timers if tid != DEADLINE_TIMER]
    busy += [f"event wait {w.event.source} key={w.event.key}" for w in s.event_waits.values()]
    busy += [f"callback {w.event.name!r}" for w in s.callback_waits.values()]
    busy += [f"the compensation of given-up step {o.step!r}" for o, t in s.given_up if not t.done()]
    busy += [f"update {name!r}" for name in s.update_waiters or ()]
    current = asyncio.current_task(s.loop)
    others = [t for t in s.loop.tasks if not t.done() and t is not current and t is not s.lifecycle]
    if others:
        busy.append(
            f"{len(others)} other task(s) of the run (a gather's branches, ctx.first's "
            "racers, an update's handler)"
        )
    return busy


def _qualified(step: str, run: int) -> str:
    """A carried step's name with the run that applied it, once."""
    suffix = f"@run{run}"
    return step if step.endswith(suffix) else step + suffix


def _carried(s: SagaState) -> list[CarriedCompensation]:
    return [
        CarriedCompensation(
            step=_qualified(o.step, o.run),
            spec=o.spec,
            forward_ids=list(o.forward_ids),
            began=o.began,
            owed_at=o.owed_at,
            after=None if o.after is None else sorted(_qualified(a, o.run) for a in o.after),
            run=o.run,
        )
        for o in s.owed
    ]


def _counters(s: SagaState) -> dict[str, int]:
    # Each count's next value (the state is about to be dropped: reading it is free).
    return {kind: next(count) for kind, count in sorted(s.counters.items())}


def _has_waited(s: SagaState) -> bool:
    """The run took an input since it began: a run that continues before it waited for
    anything would continue again at once, for ever, in one decision."""
    return any(not e.is_intent for e in s.history[2 if s.run > 1 else 1 :])


async def continue_as_new(s: SagaState, state: BaseModel | JsonDict, *, carry: bool) -> NoReturn:
    """Ends this run and begins the next with ``state`` as its input. Never returns: the
    run's code is dropped once the event is recorded, and the next run's begins."""
    check_open(s)
    raw = state.model_dump(mode="json", by_alias=True) if isinstance(state, BaseModel) else state
    try:
        value = s.definition.validate_input(raw)
    except InvalidPayload as exc:
        s.definition_error(f"ctx.continue_as_new: the next run's input is refused: {exc}")
    busy = in_flight(s)
    if busy:
        s.definition_error(
            "ctx.continue_as_new is refused while the run has work in flight: "
            + ", ".join(busy)
            + ". Await it (or give it up) first, then continue as new."
        )
    if not _has_waited(s) and s.cursor >= len(s.history):
        s.definition_error(
            "ctx.continue_as_new is refused in a run that has waited for nothing since it "
            "began: it would continue again at once, for ever"
        )
    event = RunContinued(
        at=s.now,
        run=s.run + 1,
        first_seq=s.seq_of(len(s.history)),  # where it goes (a recorded one says)
        input=value.model_dump(mode="json", by_alias=True),
        carry_compensations=carry,
        carried=_carried(s) if carry and not s.past_pivot else [],
        ticks=s.ticks,
        counters=_counters(s),
        signals={name: list(queue) for name, queue in sorted(s.signals.items()) if queue},
        seen_signals=sorted({e.signal_id for e in s.history if isinstance(e, SignalReceived)}),
        pivot_step=s.pivot_step if s.past_pivot else None,
        key=s.key.key if s.key is not None and s.key.held else None,
    )
    s.continued = emit(s, event)
    s.closing = True
    never: asyncio.Future[Any] = s.loop.create_future()
    await never
    raise AssertionError("a run that continued as new never resumes")  # pragma: no cover


def begin_run(s: SagaState, started: SagaStarted, continued: RunContinued) -> None:
    """Sets a fresh state to the beginning of the run ``continued`` opens, and starts its
    code (the caller runs it). ``s.history`` holds ``[started, continued, ...]``."""
    s.now = continued.at
    s.apply(started)
    s.apply(continued)
    s.offset = continued.first_seq - 2
    s.trace_context = started.trace_context
    s.run_input = continued.input
    s.ticks = continued.ticks
    s.counters = {kind: itertools.count(n) for kind, n in continued.counters.items()}
    s.signals = {name: deque(items) for name, items in continued.signals.items()}
    for c in continued.carried:
        after = None if c.after is None else frozenset(c.after)
        s.owed.append(
            OwedCompensation(c.step, c.spec, tuple(c.forward_ids), c.began, c.owed_at, after, c.run)
        )
        if after is not None:
            s.declared_after = owned(s.declared_after)
            s.declared_after[c.step] = after
    s.lifecycle = s.loop.create_task(run_lifecycle(s, started))
