"""One saga's state in the decision core: the fold of its history, and its code's own.

:class:`SagaState` *is* the :class:`~saga_engine.core.history._fold.Fold` of the saga's history
(status, error, commands in flight, timers, the stuck compensation: the same fold the
operator's view is made of), and adds what only a saga whose code runs has: the history
and the cursor replay has reached, the deterministic loop, the futures its code awaits
(hung on the fold's commands and timers), the signals it waits for, and the compensation
stack its code builds as steps complete. Four modules work on it:

- ``_intents``: how the code records an intent, or on replay matches the recorded one;
- ``_operations``: what the saga's ``ctx`` does (steps, timers, signals, side effects,
  patches);
- ``_lifecycle``: the run around the user's ``run``: finishing, failing, compensating;
- ``_inputs``: an input from outside, refused, dropped or turned into its event, and the
  code it wakes.

The methods here are what more than one of them needs: the compensation stack
(:meth:`SagaState.owe`), and how the code is stopped when the code deployed cannot drive
the saga (:meth:`SagaState.park`).
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections import deque
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Literal, NoReturn

import msgspec

from saga_engine.core.authoring._context import SagaContext
from saga_engine.core.authoring._definition import SagaDefinition
from saga_engine.core.history._decision import DEADLINE_TIMER
from saga_engine.core.history._events import (
    TERMINAL_EVENTS,
    CompensationSpec,
    ErrorInfo,
    Event,
    RunContinued,
    SagaParked,
)
from saga_engine.core.history._fold import END_STATUS, NO_ENTRIES, NO_IDS, Awaited, Fold, Ids
from saga_engine.core.runtime._loop import DeterministicLoop
from saga_engine.kernel._errors import DefinitionError, NondeterminismError, PermanentError
from saga_engine.kernel._serde import JsonDict
from saga_engine.kernel._settings import CallbackSettings


class Halt(BaseException):
    """Unwinds saga code after nondeterminism; a BaseException so `except Exception` won't eat it."""


class OwedCompensation(msgspec.Struct, frozen=True):
    step: str
    spec: CompensationSpec
    #: The forward command ids the step issued: the compensation names them, so a
    #: participant can refuse a forward command that arrives after its compensation.
    forward_ids: tuple[str, ...] = ()
    #: When the step began (its first command) and when it was owed (applied, or given
    #: up in doubt), on the saga's own count of these moments (``SagaState.tick``): a
    #: step owed before another began came before it, and is undone after it.
    began: int = 0
    owed_at: int = 0
    #: The steps it was declared to depend on (a graph saga's node), or None: then the
    #: moments above alone order its undo.
    after: frozenset[str] | None = None
    #: The run that applied the step (``ctx.continue_as_new``): its compensation's
    #: command ids are that run's (``id_scope``).
    run: int = 1


def id_scope(saga_id: str, run: int) -> str:
    """What a run's command and child ids derive from: the saga's id in its first run,
    and the id with the run's number in a later one, so a run that continued as new may
    use its step names again without meeting the commands of the runs before."""
    return saga_id if run == 1 else f"{saga_id}#run{run}"


class Poll(msgspec.Struct):
    """A command sent again every ``every`` while unanswered; next at ``due``."""

    every: timedelta
    due: datetime


#: A poll's timer id: ``poll:<command id>`` (never recorded; see ``SagaState.polls``).
POLL_PREFIX = "poll:"


class SagaState(Fold):
    """Everything about one saga that changes while it runs. No I/O, no clock."""

    # Slots, not an instance dict: an engine holds up to engine.cache_size of these, and
    # a dict of three dozen attributes is a kilobyte and a half of each.
    __slots__ = (
        "callback_keys",
        "cancel_message",
        "cancel_reason",
        "clock",
        "closing",
        "continued",
        "counters",
        "ctx",
        "cursor",
        "declared_after",
        "definition",
        "given_up",
        "history",
        "key_waiter",
        "lifecycle",
        "loop",
        "new",
        "nondeterminism",
        "now",
        "offset",
        "owed",
        "patches",
        "polls",
        "resume_waiters",
        "rng",
        "run_input",
        "saga",
        "saga_id",
        "saga_type",
        "signal_waiters",
        "signals",
        "skipped_ids",
        "step_names",
        "ticks",
        "trace_context",
        "undo_waiter",
        "unwinding",
        "update_waiters",
        "user_running",
    )

    checked = True

    def __init__(
        self, definition: SagaDefinition, saga_id: str, ctx: SagaContext, clock: datetime
    ) -> None:
        super().__init__()
        self.definition = definition
        self.saga_id = saga_id
        self.saga_type = definition.name
        self.trace_context: dict[str, str] = NO_ENTRIES
        #: The saga's time: the time of the input its code reacts to (``ctx.now()``).
        self.now: datetime = datetime.min
        #: The runner's time for the input being handled (for a replay, the time it
        #: rebuilds the saga): what a park is stamped with.
        self.clock = clock
        # mypy sees AbstractEventLoop's I/O methods as abstract; saga code needs none of them.
        self.loop = DeterministicLoop()  # type: ignore[abstract]
        self.ctx = ctx
        self.history: list[Event] = []
        self.cursor = 0  # events of history already consumed by the code
        #: The events of the decision being made (appended to history too).
        self.new: list[Event] = []
        #: Why the code deployed cannot drive the saga, once it cannot (it is parked).
        self.nondeterminism: PermanentError | None = None
        #: The keys callback URLs are signed with (None: none configured, as in a replay
        #: check, where a URL the code reads parks the saga).
        self.callback_keys: CallbackSettings | None = None
        #: The events of the history not held (the runs before this one, past its
        #: ``saga_started``): ``history[i]``'s sequence number is ``i + 1 + offset``
        #: for ``i >= 1``.
        self.offset = 0
        #: The input of a run that continued as new (None: ``saga_started``'s).
        self.run_input: JsonDict | None = None
        #: The code continued as new: the run ends, its next begins (``_continuing``).
        self.continued: RunContinued | None = None
        self._init_code()

    def _init_code(self) -> None:
        """The state only the saga's code keeps (no event records it). Its dicts are the
        shared read-only ``NO_ENTRIES`` until their first entry (``owned``)."""
        #: Signals received before the code waited for them, per name.
        self.signals: dict[str, deque[JsonDict]] = NO_ENTRIES
        self.signal_waiters: dict[str, asyncio.Future[JsonDict | None]] = NO_ENTRIES
        #: ``ctx.wait_update`` waits, by update name (None until the first: most sagas
        #: never wait for an update).
        self.update_waiters: dict[str, asyncio.Future[Any]] | None = None
        #: The compensations owed, in the order their steps were applied.
        self.owed: list[OwedCompensation] = []
        self.step_names: Ids = NO_IDS
        self.counters: dict[str, itertools.count[int]] = NO_ENTRIES
        self.patches: dict[str, bool] = NO_ENTRIES
        #: Seeded on first use (see ``_operations``): most sagas never ask for randomness.
        self.rng: random.Random | None = None
        self.lifecycle: asyncio.Task[None] | None = None
        #: The user's ``run`` is under way (in the lifecycle's task: ``run_lifecycle``).
        self.user_running = False
        self.cancel_reason: Literal["cancel", "deadline", "forced"] | None = None
        self.cancel_message = ""
        self.closing = False
        #: The run failed and its lifecycle stops what still runs: a step stopped now
        #: joins the compensation stack (``_undo.give_up``), it is not given up alone.
        self.unwinding = False
        #: The steps the code gave up while going forward whose compensations were
        #: started at once (``_undo.give_up``), each with the task undoing it: the saga
        #: ends only once they are done. A tuple: most sagas never give a step up, and
        #: the empty one is shared.
        self.given_up: tuple[tuple[OwedCompensation, asyncio.Task[None]], ...] = ()
        #: While compensations are stuck: what the operator decides ("retry" or "skip"),
        #: per step.
        self.resume_waiters: dict[str, asyncio.Future[str]] = NO_ENTRIES
        #: The dependencies each graph node's step declared (``StepRequest.after``).
        self.declared_after: dict[str, frozenset[str]] = NO_ENTRIES
        #: The saga's count of the moments that order its undo (``tick``).
        self.ticks = 0
        #: Forward commands an operator answered by hand: they owe no compensation.
        self.skipped_ids: Ids = NO_IDS
        #: A completed child waits here for its parent's undo (``UndoRequested``).
        self.undo_waiter: asyncio.Future[None] | None = None
        #: The saga object its ``run`` works on: updates and queries use its state.
        self.saga: Any = None
        #: A run waiting for its concurrency key waits here (``KeyAcquired``).
        self.key_waiter: asyncio.Future[None] | None = None
        #: Commands sent again at a period while unanswered, recording nothing (a child's
        #: start, ``StepRequest.poll``), by command id. No event records a poll: a loaded
        #: saga sends what it owes anyway, and then polls again from there.
        self.polls: dict[str, Poll] = NO_ENTRIES

    # ------------------------------------------------------------------ queries

    @property
    def replaying(self) -> bool:
        return self.cursor < len(self.history)

    @property
    def dead(self) -> bool:
        """Parked as nondeterministic: the code cannot go on until a fixed deploy."""
        return self.nondeterminism is not None or self.parked

    def awaited(self) -> Awaited:
        """What the code waits for now: the fold's open waits it has not given up."""
        held = frozenset([*self.inflight, *self.timers, *self.event_waits, *self.callback_waits])
        return Awaited(tuple(sorted(self.signal_waiters)), held, run_ended=self.closing)

    def describe_waiting(self) -> str:
        waits = [
            f"a reply to step {f.event.step!r}"
            if f.held is None
            else f"an operator for step {f.event.step!r} (its reply is held)"
            for f in self.inflight.values()
        ]
        waits += [f"an operator for step {step!r} (it is parked)" for step in self.parked_steps]
        waits += [f"timer {tid!r}" for tid in self.timers if tid != DEADLINE_TIMER]
        waits += [f"signal {name!r}" for name in self.signal_waiters]
        waits += [f"update {name!r}" for name in self.update_waiters or ()]
        waits += [f"event {w.event.source} key={w.event.key}" for w in self.event_waits.values()]
        waits += [f"callback {w.event.name!r}" for w in self.callback_waits.values()]
        if self.key_waiter is not None:
            waits.append("its concurrency key")
        if self.status.is_terminal:
            return f"nothing (the saga already ended {self.status.value})"
        return "nothing more; the code waits for " + (", ".join(waits) or "nothing")

    def seq_of(self, index: int) -> int:
        """The sequence number of ``history[index]``."""
        return index + 1 + (self.offset if index >= 1 else 0)

    @property
    def scope(self) -> str:
        """What this run's command and child ids derive from (``id_scope``)."""
        return id_scope(self.saga_id, self.run)

    # ------------------------------------------------------------------ the fold, with code

    def settle_held(self) -> None:
        # Nothing moves once the code deployed cannot drive the saga.
        if self.nondeterminism is None:
            super().settle_held()

    def tick(self) -> int:
        """The next moment on the saga's own count: a step's beginning or its being owed.
        The code runs the same way on replay, so the count does too."""
        self.ticks += 1
        return self.ticks

    def owe(
        self, step: str, spec: CompensationSpec | None, sent: Sequence[str], began: int = 0
    ) -> None:
        """``step`` was (or may have been) applied: its compensation, if it has one, is
        owed. The stack is the code's: it decides the order compensation_started records;
        ``_undo.undo_plan`` decides what may be undone at once."""
        if spec is not None:
            owed = OwedCompensation(
                step,
                spec,
                tuple(sent),
                began,
                self.tick(),
                self.declared_after.get(step),
                self.run,
            )
            self.owed.append(owed)

    # ------------------------------------------------------------------ parking

    def nondeterministic(self, index: int | None, expected: str, actual: str) -> None:
        """The code no longer matches the history at ``index``: the saga is parked."""
        seq = self.seq_of(index) if index is not None and index < len(self.history) else None
        nd = NondeterminismError(self.saga_id, seq, expected, actual)
        self.park(
            nd,
            "nondeterministic",
            ErrorInfo(
                type="NondeterminismError",
                message=str(nd),
                details={"seq": seq, "expected": expected, "actual": actual},
            ),
        )

    def definition_error(self, message: str) -> NoReturn:
        """The saga's code cannot run as written. A bug in the code is not a reason to
        undo a business transaction: the saga is parked (like a nondeterministic one) for
        a fixed deploy and a resume, and the code is unwound without compensating."""
        error = DefinitionError(message)
        self.park(
            error,
            "definition_error",
            ErrorInfo(type="DefinitionError", message=message, step=self.current_step),
        )
        raise Halt

    def park(
        self,
        cause: PermanentError,
        reason: Literal["nondeterministic", "definition_error"],
        error: ErrorInfo,
    ) -> None:
        """Stops the code where it stands: the code deployed cannot drive this saga."""
        self.nondeterminism = cause
        self.loop.discard()
        self.inflight.clear()
        self.timers.clear()
        self.polls.clear()
        ended = next((e for e in reversed(self.history) if isinstance(e, TERMINAL_EVENTS)), None)
        if ended is not None:
            # The saga finished long ago under the old code: report the mismatch, but a
            # finished saga stays finished; nothing of it will ever run again.
            self.status = END_STATUS[type(ended)]
            return
        self.parked = True
        if isinstance(self.history[-1], SagaParked):
            return  # parked already, by an earlier deploy: nothing new to record
        parked = SagaParked(
            # When the runner parks it (live: the input's time; rebuilt: the runner's
            # clock, not the replayed time), and never before the history it ends.
            at=max(self.clock, self.history[-1].at),
            reason=reason,
            error=error,
        )
        # The code is abandoned where it stands; the recorded history stays as it was
        # and the marker goes at its end.
        self.history.append(parked)
        self.new.append(parked)
        self.error = parked.error
