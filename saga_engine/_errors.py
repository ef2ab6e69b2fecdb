"""The error hierarchy. The class tells the caller how to react.

- ``TransientError``: retry later; nothing is wrong with the request itself.
- ``StepFailed``: a participant refused or could not complete a step; the saga may
  catch it, otherwise it compensates.
- ``PermanentError``: retrying will not help; fix the code, the input or the call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


class SagaError(Exception):
    """Root of every error saga-engine raises."""


# --------------------------------------------------------------------------- retry


class TransientError(SagaError):
    """Retry later: the system is busy, unreachable or lost a race."""


class ResultTimeout(TransientError):
    """``SagaClient.result`` waited its timeout and the saga has not ended (or, its start
    still on its way, does not exist yet). Wait again: nothing was lost."""

    def __init__(self, saga_id: str, timeout_s: float, status: str | None) -> None:
        self.saga_id = saga_id
        self.status = status
        where = f"is still {status}" if status else "does not exist (yet)"
        super().__init__(f"saga {saga_id} {where} after waiting {timeout_s:g} s for its end")


class ConcurrencyError(TransientError):
    """An append lost the optimistic-concurrency check: the saga moved on elsewhere.

    A stale owner that sees this must drop its in-memory copy of the saga and must not
    send the effects it was about to send.
    """

    def __init__(self, saga_id: str, expected_seq: int, actual_seq: int | None) -> None:
        self.saga_id = saga_id
        self.expected_seq = expected_seq
        self.actual_seq = actual_seq
        super().__init__(
            f"saga {saga_id}: append expected last sequence {expected_seq}, "
            f"but the history is at {actual_seq}; another writer got there first"
        )


# --------------------------------------------------------------------------- compensate


class StepFailed(SagaError):
    """A step did not succeed. Raised inside ``run``; uncaught, the saga compensates."""

    def __init__(
        self,
        step: str,
        reason: str,
        *,
        details: dict[str, Any] | None = None,
        applied: bool = False,
    ) -> None:
        self.step = step
        self.reason = reason
        self.details = details or {}
        #: True when the step's effect may have been applied (its outcome is unknown).
        self.applied = applied
        super().__init__(f"step {step!r} failed: {reason}")


class StepTimedOut(StepFailed):
    """Every attempt timed out. The outcome is unknown, so the step's compensation is owed."""

    def __init__(self, step: str, attempts: int) -> None:
        super().__init__(
            step, f"no reply after {attempts} attempt(s); outcome unknown", applied=True
        )
        self.attempts = attempts


class SignalTimeout(SagaError):
    """``ctx.wait_signal`` reached its timeout before the signal arrived."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"signal {name!r} did not arrive before its timeout")


# --------------------------------------------------------------------------- fail


class PermanentError(SagaError):
    """Retrying will not help: fix the definition, the input or the call."""


class SagaUnsuccessful(PermanentError):
    """The saga ended without completing: it ``failed`` (nothing to undo), was
    ``compensated`` (its applied steps undone) or ``cancelled``. ``SagaClient.result``
    raises it; ``status`` says which, ``error`` is the error the saga recorded."""

    def __init__(self, saga_id: str, status: str, error: Mapping[str, Any] | None) -> None:
        self.saga_id = saga_id
        self.status = status
        self.error = dict(error or {})
        what = f": {self.error.get('type')}: {self.error.get('message')}" if error else ""
        super().__init__(f"saga {saga_id} ended {status}{what}")


class DefinitionError(PermanentError):
    """A saga definition cannot work. The message says how to fix it."""


class NondeterminismError(PermanentError):
    """The saga's code asked for something different from what its history recorded."""

    def __init__(self, saga_id: str, seq: int | None, expected: str, actual: str) -> None:
        self.saga_id = saga_id
        self.seq = seq
        self.expected = expected
        self.actual = actual
        where = f"event #{seq}" if seq is not None else "the end of the history"
        super().__init__(
            f"saga {saga_id}: nondeterminism at {where}: history has {expected}, "
            f"but the code now does {actual}"
        )


class UnknownSagaType(PermanentError):
    def __init__(self, saga_type: str, known: list[str]) -> None:
        self.saga_type = saga_type
        super().__init__(
            f"no saga named {saga_type!r} is registered (known: {', '.join(sorted(known)) or 'none'})"
        )


class SagaNotFound(PermanentError):
    def __init__(self, saga_id: str) -> None:
        self.saga_id = saga_id
        super().__init__(f"no saga with id {saga_id!r}")


class InvalidTransition(PermanentError):
    """An action or event makes no sense in the saga's current status."""


class InvalidSagaId(PermanentError):
    """A saga id must be 1 to 200 characters long."""


class SerializationError(PermanentError):
    """A value could not be turned into JSON or back."""


class InvalidPayload(SerializationError):
    """A payload does not match what it was declared as: a saga's input model, a
    declared signal, a step's reply model (``returns=``) or an operator's skip result.
    Nothing was recorded; fix the payload and send it again.

    ``errors`` lists each problem as ``{"loc": [...], "msg": ..., "type": ...}``, the shape
    pydantic and FastAPI use; ``loc`` is relative to the request that carried it (e.g.
    ``["payload", "ok"]`` for a signal's payload field).
    """

    def __init__(
        self, what: str, errors: Sequence[Mapping[str, Any]], *, step: str | None = None
    ) -> None:
        self.what = what
        #: The step whose reply it was, when it was one (an error of the saga names it).
        self.step = step
        self.errors: list[dict[str, Any]] = [
            {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": e.get("type", "")}
            for e in errors
        ]
        shown = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(value)'}: {e['msg']}"
            for e in self.errors[:5]
        )
        more = f" (and {len(self.errors) - 5} more)" if len(self.errors) > 5 else ""
        super().__init__(f"{what}: {shown}{more}")


class UnstorableValue(InvalidPayload):
    """A value Postgres cannot store (a NUL character, an unpaired surrogate, a number
    JSON cannot carry). Refused before anything is recorded; ``errors`` names where."""


class IdempotencyConflict(PermanentError):
    """A start reused an idempotency key (or a saga id) with a different input.

    The saga started with it first is untouched; ``saga_id`` names it. Use a new key for
    a new request, or send the original input to get the original saga back.
    """

    def __init__(self, saga_id: str, idempotency_key: str | None) -> None:
        self.saga_id = saga_id
        self.idempotency_key = idempotency_key
        used = (
            f"idempotency key {idempotency_key!r} was already used"
            if idempotency_key
            else "this saga id was already used"
        )
        super().__init__(
            f"{used} to start saga {saga_id} with a different input; use a new key for a new "
            "request, or repeat the original input to get that saga back"
        )


class PayloadTooLarge(PermanentError):
    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(f"payload of {size} bytes exceeds the limit of {limit} bytes")
