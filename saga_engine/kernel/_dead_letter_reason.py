"""Which dead-letter reason a failure makes of the message being processed: the one
mapping every consumer uses (the saga inbox, the trigger and event-source consumers, a
participant reading its commands).

A failure either is transient (``is_transient``: wait and retry the message, never
dead-letter it) or gives a reason (the ``dlq_reason`` header, ``PoisonReason``):

- a ``PoisonMessage`` carries its own;
- a saga error the message caused names what is wrong with it (an unknown saga, a value
  Postgres cannot store, a key reused, a parent that is not the parent, ...);
- an input its model refuses is ``invalid_signal`` for a signal, else ``invalid_input``;
- an action the saga's state refuses is ``not_accepted`` for a signal or a cancel (the
  timing is at fault, not the message), else ``rejected``;
- while a record's body is read (``reading``): text that is not JSON is
  ``malformed_json``, a body its pydantic model refuses ``invalid_body``;
- a payload stored by reference whose blob is missing or altered is ``blob_missing`` or
  ``blob_tampered`` (a ``CodecError`` of that failure);
- any other ``PermanentError`` is ``rejected``;
- anything else is not the message's fault (a bug, a broken table): ``unexpected``,
  ``engine_error`` unless the caller says otherwise (a trigger whose mapping code raised
  for the message says ``rejected``).
"""

from __future__ import annotations

from typing import Final

from pydantic import ValidationError

from saga_engine.kernel._errors import (
    CodecError,
    IdempotencyConflict,
    InvalidPayload,
    InvalidTransition,
    NewerVersionError,
    NotParent,
    PermanentError,
    PoisonMessage,
    SagaNotFound,
    SerializationError,
    UnknownSagaType,
    UnstorableValue,
)
from saga_engine.kernel._poison import PoisonReason
from saga_engine.kernel._retry import is_transient

__all__ = ["dead_letter_detail", "dead_letter_reason"]

#: Saga errors a message causes, and the reason each is (the first class that matches).
_BY_CLASS: Final[tuple[tuple[type[BaseException], PoisonReason], ...]] = (
    (SagaNotFound, PoisonReason.UNKNOWN_SAGA),
    (UnknownSagaType, PoisonReason.UNKNOWN_SAGA_TYPE),
    (UnstorableValue, PoisonReason.UNSTORABLE_VALUE),
    (IdempotencyConflict, PoisonReason.IDEMPOTENCY_CONFLICT),
    # The saga is untouched: its own parent is unaffected.
    (NotParent, PoisonReason.NOT_PARENT),
    # Kept for `saga dlq replay` once a newer engine runs.
    (NewerVersionError, PoisonReason.NEWER_VERSION),
    # The saga's history: replayable once the key is here.
    (CodecError, PoisonReason.UNDECODABLE),
)

#: A payload stored by reference that cannot be resolved (docs/large-payloads.md): its
#: own reasons, so an operator knows to restore a blob, not to configure a key.
_BLOB_REASONS: Final = {
    PoisonReason.BLOB_MISSING.value: PoisonReason.BLOB_MISSING,
    PoisonReason.BLOB_TAMPERED.value: PoisonReason.BLOB_TAMPERED,
}

#: The ``ce_type`` of the messages whose refusal by the saga's state is ``not_accepted``.
_BY_STATE: Final = frozenset({"saga.signal", "saga.cancel"})


def dead_letter_reason(
    exc: BaseException,
    *,
    message_type: str = "",
    reading: bool = False,
    unexpected: PoisonReason = PoisonReason.ENGINE_ERROR,
) -> PoisonReason | None:
    """The reason ``exc`` dead-letters the message it was raised for; None when it is
    transient (retry the message). See the module docstring for the rules.

    ``message_type``: the message's ``ce_type`` ("saga.signal", ...), where it changes
    the reason; ``reading``: ``exc`` was raised reading the record's body;
    ``unexpected``: the reason of an error that is none of the saga's.
    """
    if isinstance(exc, PoisonMessage):
        return exc.reason
    if is_transient(exc):
        return None
    if isinstance(exc, CodecError) and exc.failure.value in _BLOB_REASONS:
        return _BLOB_REASONS[exc.failure.value]
    for kind, reason in _BY_CLASS:
        if isinstance(exc, kind):
            return reason
    if isinstance(exc, InvalidPayload):
        signal = message_type == "saga.signal"
        return PoisonReason.INVALID_SIGNAL if signal else PoisonReason.INVALID_INPUT
    if isinstance(exc, InvalidTransition):
        by_state = message_type in _BY_STATE
        return PoisonReason.NOT_ACCEPTED if by_state else PoisonReason.REJECTED
    if reading and isinstance(exc, SerializationError):
        return PoisonReason.MALFORMED_JSON
    if reading and isinstance(exc, ValidationError):
        return PoisonReason.INVALID_BODY
    if isinstance(exc, PermanentError):
        return PoisonReason.REJECTED
    return unexpected


def dead_letter_detail(exc: BaseException, reason: PoisonReason | None = None) -> str:
    """The ``dlq_detail`` of a dead letter ``exc`` made: a poison message's own detail,
    a saga error's or a model's refusal as it says it, or, for anything else and for an
    ``engine_error`` (not the message's fault), the class and message of ``exc``."""
    if isinstance(exc, PoisonMessage):
        return exc.detail
    if reason is not PoisonReason.ENGINE_ERROR and isinstance(
        exc, PermanentError | ValidationError
    ):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
