"""Why a record went to the dead-letter topic: the values of its ``dlq_reason`` header
(``PoisonMessage`` in ``_errors`` carries one; ``_errors`` re-exports it)."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["PoisonReason"]


class PoisonReason(StrEnum):
    """Why a message went to the dead-letter topic (the ``dlq_reason`` header)."""

    MALFORMED_JSON = "malformed_json"
    MISSING_HEADER = "missing_header"
    UNKNOWN_TYPE = "unknown_type"
    WRONG_SCHEMA_VERSION = "wrong_schema_version"
    OVERSIZED = "oversized"
    INVALID_BODY = "invalid_body"
    UNKNOWN_SAGA = "unknown_saga"
    UNKNOWN_SAGA_TYPE = "unknown_saga_type"
    UNKNOWN_COMMAND = "unknown_command"
    REJECTED = "rejected"
    KEY_MISMATCH = "key_mismatch"
    #: A signal the saga does not declare, or whose payload its declared model refuses.
    INVALID_SIGNAL = "invalid_signal"
    #: A start whose input the saga's input model refuses.
    INVALID_INPUT = "invalid_input"
    #: A signal or cancel the saga cannot take in its state (ended, undoing its steps,
    #: parked): ``dlq_detail`` names the state.
    NOT_ACCEPTED = "not_accepted"
    #: A value Postgres cannot store (a NUL character, an unpaired surrogate, a number
    #: JSON cannot carry), in a start, a signal or a command.
    UNSTORABLE_VALUE = "unstorable_value"
    #: A start that reuses an idempotency key (or saga id) with a different input.
    IDEMPOTENCY_CONFLICT = "idempotency_conflict"
    #: A child's start or undo naming a parent the child was not started by.
    NOT_PARENT = "not_parent"
    #: A message for a saga written by a newer engine (an event or saga version this
    #: engine does not have, during a rolling deploy): the saga is left untouched; once a
    #: newer engine owns it, it re-sends what is in flight, and ``saga dlq replay``
    #: re-drives a signal or cancel.
    NEWER_VERSION = "newer_version"
    #: An encoded value (a ``saga-codec`` header) this process cannot decode: no codec
    #: configured, a key id it does not hold, or a tag that does not verify. Replay it
    #: from the dead-letter topic once the key is configured.
    UNDECODABLE = "undecodable"
    #: A payload stored by reference (docs/large-payloads.md) whose blob is gone from
    #: the blob store: the saga is not driven. Restore the blob (its content hash is in
    #: ``dlq_detail``) and replay the record.
    BLOB_MISSING = "blob_missing"
    #: A payload stored by reference whose reference MAC or blob content hash does not
    #: verify: altered in the store or on the way. The saga is not driven.
    BLOB_TAMPERED = "blob_tampered"
    #: Not the message's fault: the consumer failed on it for a reason of its own (a bug,
    #: a saga that kept conflicting). ``saga dlq replay`` re-drives it.
    ENGINE_ERROR = "engine_error"
