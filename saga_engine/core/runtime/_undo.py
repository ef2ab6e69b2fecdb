"""The compensation stack: in what order what is owed is undone, and its unwinding.

One rule, for every saga (``docs/graphs.md``, "Undo by the graph"): a step is undone
only after every step that came after it has been undone, and steps that did not come
after one another are undone in parallel. A step *came after* another when

- both are a graph saga's nodes and it depends on the other, directly or through other
  nodes (``StepRequest.after``: the declared graph, whatever order they happened to
  run in); or otherwise
- it began (its first command) after the other was owed (applied, or given up in doubt):
  the order a saga's ``run`` ran its steps in, so a sequence is undone last first, and a
  ``gather``'s branches, which ran at once, are undone at once, still after everything
  that began after them.

:func:`undo_plan` states the rule; :func:`unwind` records the plan in
``compensation_started`` and runs it, each compensation under its own retry policy. One
that keeps failing is stuck (``compensation_stuck``) until an operator answers
(:func:`unblock_compensation`); the others go on meanwhile. A history recorded before the
plan existed (its ``compensation_started`` carries none) is undone as it was then: one at
a time, in ``owed``'s order.

A step the code gives up while the saga goes forward (the loser of ``ctx.first``, a step
in a ``ctx.timeout`` block whose timer fired, a task the code cancelled, a step still
running when ``run`` returned) is not left on the stack for an unwind that may never come:
:func:`give_up` records it (``step_abandoned``) and, when its command may have been
applied, issues its compensation at once, under the same retry policy, stuck and
operator rules as any (:func:`_compensate`). It came after every step owed before it, so
it is undone before any of them: an unwind that follows waits for it first
(:func:`finish_given_up`), and the saga ends only once it is undone. A step applied
already whose result the code still awaited (an HTTP step completed by callback, waiting
for its service's call) is given up by the same rule (:func:`give_up_applied`): it leaves
the stack and is undone at once.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Literal

from saga_engine.core.history._decision import command_id_for
from saga_engine.core.history._events import (
    CommandIssued,
    CompensationCompleted,
    CompensationIssued,
    CompensationSpec,
    CompensationStarted,
    CompensationStuck,
    ErrorInfo,
    StepAbandoned,
)
from saga_engine.core.history._fold import owned
from saga_engine.core.history._policy import retry_after
from saga_engine.core.runtime._intents import await_command, await_timer, emit
from saga_engine.core.runtime._state import OwedCompensation, SagaState, id_scope
from saga_engine.kernel._serde import canonical_hash

UndoReason = Literal["failure", "cancel", "deadline", "operator", "undo"]


def _ancestors(declared: Mapping[str, frozenset[str]]) -> dict[str, frozenset[str]]:
    """Every step each declared step depends on, directly or not."""
    found: dict[str, frozenset[str]] = {}

    def visit(step: str, path: frozenset[str]) -> frozenset[str]:
        known = found.get(step)
        if known is not None:
            return known
        direct = declared.get(step, frozenset())
        every = set(direct)
        for dep in direct:
            if dep not in path:  # a definition refuses cycles; never loop on one
                every |= visit(dep, path | {dep})
        found[step] = frozenset(every)
        return found[step]

    for step in declared:
        visit(step, frozenset({step}))
    return found


def _came_after(
    first: OwedCompensation, then: OwedCompensation, ancestors: Mapping[str, frozenset[str]]
) -> bool:
    if first.after is not None and then.after is not None:
        return first.step in ancestors.get(then.step, frozenset())
    return first.owed_at < then.began


def undo_plan(
    owed: Sequence[OwedCompensation], declared: Mapping[str, frozenset[str]]
) -> dict[str, list[str]]:
    """Per owed step (``owed`` in the order ``compensation_started`` records, last owed
    first), the owed steps whose compensations complete before its own begins: those
    that came after it, without the ones already implied through another."""
    ancestors = _ancestors(declared)
    later = {
        x.step: [y.step for y in owed if y is not x and _came_after(x, y, ancestors)] for x in owed
    }
    implied = {step: set(steps) for step, steps in later.items()}
    return {
        step: [y for y in steps if not any(y in implied[z] for z in steps if z != y)]
        for step, steps in later.items()
    }


def give_up(
    s: SagaState,
    step: str,
    spec: CompensationSpec | None,
    sent: Sequence[str],
    began: int,
    *,
    in_doubt: bool,
    cancelled: asyncio.CancelledError,
) -> None:
    """The forward step ``step`` was stopped (its task cancelled) after issuing the
    commands ``sent``; ``in_doubt``: the last of them may have been applied.

    While the saga stops (its run failed, a cancel, its deadline) the step joins the
    stack, and the unwind undoes it in the rule's order. While it goes forward, the code
    gave the step up: recorded, and an in-doubt step's compensation starts now (the saga
    ends only once it has completed). A history recorded before steps were given up
    this way has no ``step_abandoned`` here: it replays as it ran (the step owed)."""
    if _joins_the_stack(s, step):
        if in_doubt:
            s.owe(step, spec, sent, began)
        return
    owed = None
    if in_doubt and spec is not None:
        owed = OwedCompensation(
            step, spec, tuple(sent), began, s.tick(), s.declared_after.get(step), s.run
        )
    _abandon(s, step, sent, in_doubt, cancelled, owed)


def give_up_applied(s: SagaState, step: str, cancelled: asyncio.CancelledError) -> None:
    """The step ``step`` was applied (it is on the stack, if it has a compensation) but
    its code still waited for its result (``http_step(completion="callback")``, waiting
    for its service's call) when it was stopped: :func:`give_up`'s rule, for a step
    applied for sure. While the saga stops it stays on the stack; while it goes forward
    it leaves the stack, recorded as given up, and its compensation starts now."""
    if _joins_the_stack(s, step):
        return
    owed = next((o for o in reversed(s.owed) if o.step == step), None)
    if owed is not None:
        s.owed.remove(owed)
    sent = [e.command_id for e in s.history if isinstance(e, CommandIssued) and e.step == step]
    _abandon(s, step, list(dict.fromkeys(sent)), True, cancelled, owed)


def _joins_the_stack(s: SagaState, step: str) -> bool:
    """Whether a step stopped now joins (or stays on) the stack for the unwind, rather
    than being given up alone: the saga stops, or replays a history recorded before
    steps were given up (no ``step_abandoned`` where it would stand)."""
    stopping = s.cancel_reason is not None or s.unwinding or s.nondeterminism is not None
    legacy = s.replaying and not (
        isinstance(recorded := s.history[s.cursor], StepAbandoned) and recorded.step == step
    )
    return stopping or legacy


def _abandon(
    s: SagaState,
    step: str,
    sent: Sequence[str],
    in_doubt: bool,
    cancelled: asyncio.CancelledError,
    owed: OwedCompensation | None,
) -> None:
    """Records the step given up; what it owes (``owed``) is undone at once."""
    why = cancelled.args[0] if cancelled.args and isinstance(cancelled.args[0], str) else ""
    emit(
        s,
        StepAbandoned(at=s.now, step=step, command_ids=list(sent), in_doubt=in_doubt, reason=why),
    )
    if owed is not None:
        s.given_up = (*s.given_up, (owed, s.loop.create_task(_compensate(s, owed))))


async def finish_given_up(s: SagaState) -> None:
    """Waits until every step the code gave up is undone (no wait when none is: a saga
    that never gave one up runs exactly as it did before steps could be)."""
    while pending := [task for _, task in s.given_up if not task.done()]:
        await asyncio.gather(*pending)


async def unwind(s: SagaState, reason: UndoReason, error: ErrorInfo | None) -> bool:
    """Undoes everything owed (the stack as the steps pushed it, ``SagaState.owe``);
    False when nothing was owed (then nothing is recorded). The steps the code gave up
    are undone first (they came after everything on the stack)."""
    owed = list(reversed(s.owed))
    if not owed:
        if s.given_up:  # (no coroutine made to find none: see run_lifecycle)
            await finish_given_up(s)
        return False
    started = emit(
        s,
        CompensationStarted(
            at=s.now,
            reason=reason,
            error=error,
            owed=[o.step for o in owed],
            after=undo_plan(owed, s.declared_after),
        ),
    )
    if s.given_up:
        await finish_given_up(s)
    if started.after is None or _one_by_one(owed, started.after):
        # Recorded before plans (undone as it began), or a sequence: one at a time, in
        # owed's order (no task needed when nothing runs beside it).
        for entry in owed:
            await _compensate(s, entry)
        return True
    tasks: dict[str, asyncio.Task[None]] = {}
    for entry in owed:
        waits = [tasks[step] for step in started.after.get(entry.step, ()) if step in tasks]
        tasks[entry.step] = s.loop.create_task(_compensate_after(s, entry, waits))
    await asyncio.gather(*tasks.values())
    return True


def _one_by_one(owed: list[OwedCompensation], after: Mapping[str, list[str]]) -> bool:
    """Whether the plan is a chain: each owed step waits for the one before it, so they
    run one at a time in ``owed``'s order (a saga whose steps ran one after another)."""
    previous: list[str] = []
    for entry in owed:
        if after.get(entry.step, []) != previous:
            return False
        previous = [entry.step]
    return True


async def _compensate_after(
    s: SagaState, owed: OwedCompensation, waits: list[asyncio.Task[None]]
) -> None:
    for task in waits:
        await task
    await _compensate(s, owed)


def unblock_compensation(
    s: SagaState, action: Literal["retry", "skip"], step: str | None = None
) -> None:
    """An operator's answer to the stuck compensation of ``step`` (every stuck one when
    None: a resume): retry it, or count it done by hand (its step_skipped)."""
    for stuck, waiter in list(s.resume_waiters.items()):
        if (step is None or stuck == step) and not waiter.done():
            waiter.set_result(action)


async def _compensate(s: SagaState, owed: OwedCompensation) -> None:
    spec = owed.spec
    timeout = timedelta(seconds=spec.timeout_s) if spec.timeout_s else None
    generation, round_attempts = 0, 0
    for attempt in itertools.count(1):
        round_attempts += 1
        issued = emit(
            s,
            CompensationIssued(
                at=s.now,
                step=owed.step,
                participant=spec.participant,
                command_type=spec.command_type,
                payload=spec.payload,
                payload_hash=canonical_hash(spec.payload),
                # Replayed, the recorded attempt (its id with it) is what ``emit``
                # returns: the id is derived only for one issued live.
                command_id=command_id_for(
                    id_scope(s.saga_id, owed.run), owed.step, generation, compensation=True
                )
                if s.cursor >= len(s.history)
                else "",
                attempt=attempt,
                timeout_at=s.now + timeout if timeout else None,
                compensates=list(owed.forward_ids),
            ),
        )
        reply = await await_command(s, issued)
        if reply is not None and reply.outcome == "success":
            emit(s, CompensationCompleted(at=s.now, step=owed.step))
            _discharge(s, owed)
            return
        if reply is None:
            last_error = "timed out"
        else:
            # A refused compensation is retried under a new id: the participant stored
            # its refusal under the old one and would only repeat it.
            generation += 1
            last_error = reply.error or reply.outcome
        if round_attempts >= spec.retry.max_attempts:
            if await _stuck(s, owed, round_attempts, last_error) == "skip":
                # An operator compensated it by hand (recorded as step_skipped).
                _discharge(s, owed)
                return
            round_attempts = 0
            continue
        delay = spec.retry.backoff(attempt, seed=f"{s.saga_id}:compensate:{owed.step}")
        delay = max(delay, retry_after(reply))  # at least a Retryable(after=...)'s wait
        await await_timer(s, f"retry:compensate:{owed.step}:{attempt}", "retry", delay)


def _discharge(s: SagaState, owed: OwedCompensation) -> None:
    """No longer owed (a step given up was never on the stack)."""
    if owed in s.owed:
        s.owed.remove(owed)


async def _stuck(s: SagaState, owed: OwedCompensation, attempts: int, last_error: str) -> str:
    """Records the compensation as stuck and waits for an operator's answer."""
    emit(
        s,
        CompensationStuck(
            at=s.now,
            step=owed.step,
            error=ErrorInfo(
                type="CompensationStuck",
                message=f"compensation of {owed.step!r} still failing after "
                f"{attempts} attempts: {last_error}",
                step=owed.step,
            ),
        ),
    )
    waiter: asyncio.Future[str] = s.loop.create_future()
    s.resume_waiters = owned(s.resume_waiters)
    s.resume_waiters[owed.step] = waiter
    try:
        return await waiter
    finally:
        s.resume_waiters.pop(owed.step, None)
