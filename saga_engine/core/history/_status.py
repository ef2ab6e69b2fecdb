"""The saga status machine: an enum and its explicit transition table."""

from __future__ import annotations

from enum import StrEnum

from saga_engine.kernel._errors import InvalidTransition


class SagaStatus(StrEnum):
    RUNNING = "running"
    COMPENSATING = "compensating"
    COMPLETED = "completed"
    COMPENSATED = "compensated"
    FAILED = "failed"
    CANCELLED = "cancelled"
    COMPENSATION_STUCK = "compensation_stuck"
    NONDETERMINISTIC = "nondeterministic"
    #: A forward step's reply did not match its model: the step waits for an operator.
    STEP_STUCK = "step_stuck"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL

    @property
    def is_parked(self) -> bool:
        return self in PARKED

    @property
    def is_open(self) -> bool:
        return self not in TERMINAL


TERMINAL = frozenset(
    {SagaStatus.COMPLETED, SagaStatus.COMPENSATED, SagaStatus.FAILED, SagaStatus.CANCELLED}
)
PARKED = frozenset(
    {SagaStatus.COMPENSATION_STUCK, SagaStatus.NONDETERMINISTIC, SagaStatus.STEP_STUCK}
)

S = SagaStatus
#: Every allowed move. Anything else is a bug or a wrong operator action.
TRANSITIONS: dict[SagaStatus, frozenset[SagaStatus]] = {
    # failed: the run ended in error, or its deadline passed, with nothing to undo;
    # cancelled: a cancel request with nothing to undo (with something to undo it goes
    # through compensating, and still ends cancelled, not compensated).
    S.RUNNING: frozenset(
        {S.COMPLETED, S.COMPENSATING, S.FAILED, S.CANCELLED, S.NONDETERMINISTIC, S.STEP_STUCK}
    ),
    # A step's reply was held as invalid. The rest of the run may still move (a gather's
    # other branches), so it can go wherever running can; an operator's retry or skip of
    # the last held step brings it back to running.
    S.STEP_STUCK: frozenset(
        {S.RUNNING, S.COMPLETED, S.COMPENSATING, S.FAILED, S.CANCELLED, S.NONDETERMINISTIC}
    ),
    S.COMPENSATING: frozenset(
        {S.COMPENSATED, S.CANCELLED, S.COMPENSATION_STUCK, S.NONDETERMINISTIC}
    ),
    # An operator retries the stuck compensation, or the code changed under it.
    S.COMPENSATION_STUCK: frozenset({S.COMPENSATING, S.NONDETERMINISTIC}),
    # Resumed after a fixed deploy: back to where it was.
    S.NONDETERMINISTIC: frozenset({S.RUNNING, S.COMPENSATING, S.COMPENSATION_STUCK, S.STEP_STUCK}),
    # A child saga whose parent compensates undoes its applied steps (``undo_requested``).
    S.COMPLETED: frozenset({S.COMPENSATING}),
    S.COMPENSATED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
}


def check_transition(current: SagaStatus, new: SagaStatus) -> SagaStatus:
    """Returns ``new`` when the move is allowed; raises InvalidTransition otherwise."""
    if new == current:
        return new
    if new not in TRANSITIONS[current]:
        allowed = ", ".join(sorted(s.value for s in TRANSITIONS[current])) or "nothing (terminal)"
        raise InvalidTransition(
            f"a saga cannot go from {current.value} to {new.value}; from {current.value} it "
            f"can go to: {allowed}"
        )
    return new
