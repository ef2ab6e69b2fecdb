"""The whole error tree. The class tells the caller how to react::

    SagaError                      every error saga-engine raises
    ├── TransientError             retry later: nothing is wrong with the request
    │   ├── ConcurrencyError       another writer appended first (reload, then retry)
    │   ├── StaleShardMap          a shard refused a write for a partition it does not
    │   │                          hold (reload the map, retry on the new shard) or is
    │   │                          moving away (retry later); nothing was written
    │   ├── StoreUnavailable       Postgres unreachable, or the connection broke
    │   │   └── ShardUnavailable   one shard of a sharded store (``shard`` names it)
    │   ├── KafkaUnavailable       the broker unreachable, or did not acknowledge
    │   │   └── DeadLetterTopicUnavailable  no dead-letter topic, or it did not answer
    │   ├── DependencyUnavailable  start-up gave up waiting for Kafka or Postgres
    │   ├── MigrationBusy          a migration's tables were locked; run it again
    │   ├── ResultTimeout          SagaClient.result waited its timeout
    │   └── OutcomeUnknown         sent, but whether it was recorded is unknown: look
    │                              at the saga's history before sending it again
    ├── StepFailed                 a step did not succeed: the saga compensates
    │   └── StepTimedOut           (unless its code catches it)
    ├── SignalTimeout              ctx.wait_signal's timeout passed: the same
    ├── EventTimeout               ctx.wait_event's timeout passed
    ├── SagaTimeout                ctx.timeout's block outlived its durable timer
    ├── CallbackTimeout            ctx.callback's URL was not called before its timeout
    ├── CallbackFailed             ctx.callback's caller posted to its ``/fail`` URL
    ├── Rejected                   a participant's handler refuses a command
    ├── Retryable                  a participant's handler says "not now"
    ├── NewerVersionError          written by a newer engine: leave it for one
    │   ├── NewerEventError        an event kind or version this engine cannot read
    │   └── UnknownSagaVersion     a saga version this engine does not have
    └── PermanentError             retrying will not help: fix the code, input or call
        ├── DefinitionError            a saga class cannot work
        ├── NondeterminismError        the code no longer replays the history
        ├── UnknownSagaType            no saga of that name is deployed
        ├── SagaNotFound               no saga has that id
        ├── InvalidTransition          the action does not apply to the saga's state
        │   ├── PastPivot              a cancel of a saga past its pivot step
        │   ├── UpdateRefused          an update's validator (or the saga's state) refuses it
        │   ├── CallbackGone           a callback whose wait is over (expired, answered
        │   │                          differently, given up, or its saga ended)
        │   │   └── CallbackConflict   answered already with another body (409)
        │   └── QueryFailed            a query method raised, or the saga has no state yet
        ├── UpdateFailed               an update was recorded and its handler raised
        ├── NotParent                  a child's message that does not match its link
        ├── InvalidSagaId              an id that cannot be stored
        ├── CallbackTokenInvalid       a callback URL this deployment did not sign (403)
        ├── SerializationError         a value that cannot be (de)serialised
        │   └── InvalidPayload         a payload its model refuses (names each field)
        │       └── UnstorableValue    a value Postgres cannot store
        ├── IdempotencyConflict        a key reused with a different input
        ├── PayloadTooLarge            over the configured size limit
        ├── CodecError                 an encoded payload this process cannot decode
        │                              (unknown key id, failed tag, no codec
        │                              configured) or a codec that cannot work
        ├── SagaUnsuccessful           SagaClient.result: it ended failed, compensated
        │                              or cancelled
        ├── PoisonMessage              a message that can never be processed (DLQ)
        ├── UnreadableProgress         a participant's step report a reader drops
        │                              (oversized or malformed; counted)
        ├── MigrationError             the schema cannot be migrated
        ├── ShardMapError              a shard map that cannot work (names the part)
        ├── UnknownEndpoint            an ``http:`` step's endpoint is not configured
        ├── InvalidCursor              a list cursor the admin API did not hand out
        ├── ScheduleNotFound           no schedule has that id
        ├── ScheduleConflict           a schedule id taken by another definition
        ├── BatchNotFound              no batch operation has that id
        ├── DeadLetterNotFound         no dead letter at that partition and offset
        ├── DeadLetterNotReplayable    a dead letter with nowhere to go back to
        ├── AdminConfigError           admin settings that cannot work
        │   └── InsecureAdminBinding   beyond loopback without tokens
        └── CliError                   a command line error, one line on stderr
            ├── AdminCallError         the admin API refused (exit code by status)
            └── KafkaProtocolError     a broker's answer the drill's link proxy cannot read

Every error class lives here, so one look tells how to react to any of them. The
modules that raise them import them from here (and re-export them where they were
public before). What is not here is control flow that never leaves its module: ``Halt``
unwinding saga code, a participant's batch split or stop, a request body cut off inside
the admin server (``tests/internal/unit/test_errors.py`` keeps the list).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import timedelta
from enum import StrEnum
from typing import Any

# The dead-letter reasons live in their own module; PoisonMessage carries one.
from saga_engine.kernel._poison import PoisonReason as PoisonReason


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


class StoreUnavailable(TransientError):
    """Postgres could not be reached, or the connection broke mid-operation. Retry later.

    When a write raises this, it may or may not have committed: what was lost can be the
    commit's acknowledgement. Retrying an append with the same ``expected_seq`` is safe:
    if the first attempt did commit, the retry fails with ConcurrencyError.
    """


class ShardUnavailable(StoreUnavailable):
    """One shard of a sharded store could not be reached (``shard`` names it); the
    sagas of its partitions wait, the other shards' go on. Retry later."""

    def __init__(self, shard: str, reason: str) -> None:
        self.shard = shard
        super().__init__(f"shard {shard!r} is unavailable: {reason}")


class StaleShardMap(TransientError):
    """A shard of a sharded store refused to write a saga (a create or an append) for
    the saga's inbox partition: nothing was written. ``moving`` says why:

    - False: the shard does not hold ``partition`` (its ``shard_partitions`` has no row
      for it): the writer routed by a shard map older than a move. Reload the map from
      the control database and write to the partition's new shard (``ShardedEventStore``
      does, once, before raising this).
    - True: the partition is being moved away from ``shard`` (``'moving'``): its sagas'
      writes are refused until the move ends; retry later (the engine retries the input,
      and the saga is loaded again from its shard then)."""

    def __init__(self, saga_id: str, shard: str, partition: int, *, moving: bool) -> None:
        self.saga_id = saga_id
        self.shard = shard
        self.partition = partition
        self.moving = moving
        where = f"shard {shard!r}" if shard else "this shard"
        if moving:
            why = (
                f"{where} refused saga {saga_id}: its inbox partition {partition} is being "
                "moved to another shard; retry later, once the move ends"
            )
        else:
            why = (
                f"{where} refused saga {saga_id}: it does not hold its inbox partition "
                f"{partition} (the shard map used is older than a move); reload the shard "
                "map and write to the partition's shard"
            )
        super().__init__(why + "; nothing was written")


class KafkaUnavailable(TransientError):
    """The broker could not be reached or did not acknowledge in time; retry later."""


class OutcomeUnknown(TransientError):
    """A request was sent and its answer lost: it may or may not have taken effect (the
    broker took a record and did not acknowledge it; an action failed and the saga's
    history could not be read to tell). Look at the saga (``saga show``, its history)
    before sending it again; again is safe where the request is idempotent (a start with
    its idempotency key, a signal with its ``signal_id``)."""


class DeadLetterTopicUnavailable(KafkaUnavailable):
    """The dead-letter topic does not exist, or reading it took longer than allowed."""


class DependencyUnavailable(TransientError):
    """Kafka or Postgres did not answer while starting; retried until the start-up
    timeout, then raised with how long it waited."""

    def __init__(self, dependency: str, cause: BaseException) -> None:
        super().__init__(f"{dependency} is not reachable: {cause}")
        self.dependency = dependency
        self.cause = cause


class MigrationBusy(TransientError):
    """A migration waited longer than its lock timeout for its tables (another transaction
    holds them). Nothing was changed; run it again."""


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


class EventTimeout(SagaError):
    """``ctx.wait_event`` reached its timeout before a matching domain event arrived."""

    def __init__(self, source: str, key: str) -> None:
        self.source = source
        self.key = key
        super().__init__(f"event {source} key={key} did not arrive before its timeout")


class SagaTimeout(SagaError):
    """The durable timer of ``async with ctx.timeout(delta):`` fired before its block
    finished. Raised where the block stood, after everything the block was waiting on was
    given up: a step whose command was sent is compensated at once (it may have been
    applied), a child saga is undone, waits for signals and events end. Catch it around
    the ``async with`` to take another path; uncaught, the saga compensates like any
    failure. ``scope`` names the timer (``scope:<n>``, as the history records it)."""

    def __init__(self, delta: timedelta, scope: str) -> None:
        self.delta = delta
        self.scope = scope
        super().__init__(
            f"the block under ctx.timeout({delta}) did not finish before its timer "
            f"({scope}) fired; what it waited on was given up and any step it had sent "
            "is compensated"
        )


class CallbackTimeout(SagaError):
    """``ctx.callback``'s URL was not called before its timeout (a durable timer)."""

    def __init__(self, name: str, wait_id: str) -> None:
        self.name = name
        self.wait_id = wait_id
        super().__init__(
            f"callback {name!r} ({wait_id}) was not called before its timeout; its URL "
            "no longer works"
        )


class CallbackFailed(SagaError):
    """The third party answered ``ctx.callback``'s wait on its ``/fail`` URL: ``error``
    is what it said (its body's ``error`` field), ``details`` the rest of its body. Catch
    it to take another path; uncaught, the saga compensates like any failure."""

    def __init__(self, name: str, error: str, details: Mapping[str, Any] | None = None) -> None:
        self.name = name
        self.error = error
        self.details = dict(details or {})
        super().__init__(f"callback {name!r} reported a failure: {error}")


# --------------------------------------------------------------------------- newer


class NewerVersionError(SagaError):
    """The saga was written by a newer engine than this one (during a rolling deploy):
    neither a retry here nor a fix of the request helps. The engine leaves the saga
    untouched (nothing appended, nothing dropped from its history) and reports it; once
    an engine that knows the newer version owns the saga, it goes on."""

    #: What the admin API and the dead-letter header call it.
    reason = "newer_version"

    def __init__(self, message: str, *, saga_id: str | None = None) -> None:
        self.saga_id = saga_id
        super().__init__(message)


class NewerEventError(NewerVersionError):
    """A stored event whose kind this engine does not know, or whose version is above
    the one it reads: written by a newer engine."""

    reason = "newer_event"

    def __init__(self, kind: str, version: int | None, known: int | None) -> None:
        self.kind = kind
        self.version = version
        self.known = known
        what = (
            f"an event of kind {kind!r} this engine does not know"
            if known is None
            else f"event {kind!r} at version {version}, this engine reads up to version {known}"
        )
        super().__init__(
            f"{what}: written by a newer engine; the saga is left untouched for an engine "
            "that reads it"
        )


class UnknownSagaVersion(NewerVersionError):
    """A saga recorded as version N of its type, and this engine has no class for N."""

    reason = "unknown_saga_version"

    def __init__(self, saga_type: str, version: int, known: list[int]) -> None:
        self.saga_type = saga_type
        self.version = version
        shown = ", ".join(str(v) for v in sorted(known)) or "none"
        super().__init__(
            f"saga {saga_type!r} version {version} is not deployed on this engine (it has "
            f"versions: {shown}); the saga is left untouched for an engine that has it"
        )


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


class PastPivot(InvalidTransition):
    """A cancel (or forced compensation) of a saga whose pivot step has succeeded: it
    can only go forward now (a 409 from the admin API)."""


class UpdateRefused(InvalidTransition):
    """An update the saga's state does not accept: its validator refused it (or the saga
    cannot take updates now). Nothing was recorded (a 409 from the admin API)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class CallbackGone(InvalidTransition):
    """A callback that can no longer be taken: its URL expired, its wait timed out or was
    given up, or its saga ended or undoes its steps. Nothing was recorded (a 410 from the
    admin API): the caller should stop retrying."""


class CallbackConflict(CallbackGone):
    """A callback answered already with another body (or the other of success and
    failure): the first answer stands, nothing was recorded (a 409 from the admin API)."""


class QueryFailed(InvalidTransition):
    """A query could not be answered: its method raised, or the saga's code holds no
    state to ask (a 409 from the admin API). Nothing was written."""


class UpdateFailed(PermanentError):
    """An update was accepted and recorded, and its handler raised: the error is recorded
    with it, and asking again with the same update id gives the same error."""

    def __init__(self, update_id: str, name: str, error: Mapping[str, Any]) -> None:
        self.update_id = update_id
        self.name = name
        self.error = dict(error)
        super().__init__(f"update {name!r} ({update_id}) failed: {error.get('message', '')}")


class NotParent(PermanentError):
    """A child's start or undo names a parent the child was not started by (or a saga
    that is no child at all), or a child's end comes from a saga that is not the child of
    the step it answers: the link recorded in history decides. Nothing is recorded; the
    message is dead-lettered (``not_parent``)."""

    def __init__(
        self, saga_id: str, claimed: str, recorded: str | None, message: str | None = None
    ) -> None:
        self.saga_id, self.claimed, self.recorded = saga_id, claimed, recorded
        actual = f"saga {recorded!r}" if recorded else "no saga (it was started on its own)"
        super().__init__(
            message
            or f"saga {saga_id} was started by {actual}, not by saga {claimed!r}: only its "
            "own parent may start or undo it"
        )


class InvalidSagaId(PermanentError):
    """A saga id must be 1 to 200 characters long."""


class CallbackTokenInvalid(PermanentError):
    """A callback URL's token this deployment did not sign: malformed, a key id not
    configured (``callbacks.keys``), or a signature that does not match. Nothing was
    recorded (a 403 from the admin API)."""


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
    """A message, or what would become one, above the one size limit
    (``SAGA_KAFKA__MAX_MESSAGE_BYTES``); raised by ``check_message_size``."""

    def __init__(self, size: int, limit: int, what: str = "payload") -> None:
        self.size = size
        self.limit = limit
        self.what = what
        super().__init__(
            f"{what} is {size:,} bytes, which exceeds the limit of {limit:,} bytes "
            "(SAGA_KAFKA__MAX_MESSAGE_BYTES): turn on payloads by reference "
            "(SAGA_CODEC__BLOBS__THRESHOLD_BYTES, docs/large-payloads.md), send a reference "
            "to large data instead of the data, or raise the limit together with the "
            "broker's message.max.bytes"
        )


class CodecFailure(StrEnum):
    """Why a payload codec failed (``CodecError.failure``)."""

    #: Encoded under a key id this process does not hold (rotated out, or never given).
    UNKNOWN_KEY = "unknown_key"
    #: The authentication tag does not verify: tampered, truncated, or the wrong key.
    TAMPERED = "tampered"
    #: Encoded with a codec this process does not have (``$codec`` names one it lacks).
    UNKNOWN_CODEC = "unknown_codec"
    #: An encoded payload reached a process with no codec configured at all.
    NOT_CONFIGURED = "not_configured"
    #: Not a payload this codec wrote (wrong layout, bad base64, bad flag byte).
    MALFORMED = "malformed"
    #: The codec's own configuration cannot work (a key of the wrong length).
    BAD_CONFIG = "bad_config"
    #: A payload stored by reference whose blob is not in the blob store (deleted, or
    #: written to a store this process does not read).
    BLOB_MISSING = "blob_missing"
    #: A reference whose MAC does not verify, or a blob whose bytes do not hash to the
    #: content hash its reference names: altered in the store or on the way.
    BLOB_TAMPERED = "blob_tampered"


class CodecError(PermanentError):
    """A payload codec failed: retrying will not help, configuring the right key will.

    Raised on decode (an unknown key id, a failed tag, an encoded payload reaching a
    process without a codec) and when a codec is built from a configuration that cannot
    work. Never raised for a clear payload: a process with a codec reads those as they are.
    """

    def __init__(self, failure: CodecFailure, detail: str, *, key_id: str | None = None) -> None:
        self.failure = failure
        self.key_id = key_id
        self.detail = detail
        super().__init__(f"{failure.value}: {detail}")


class MigrationError(PermanentError):
    """The database schema cannot be brought in line with this version's migrations."""


class ShardMapError(PermanentError):
    """A shard map (``SAGA_PG__SHARDS``, a stored map, or a move) that cannot work: the
    message names the shard, partition or range at fault."""


class UnknownEndpoint(PermanentError):
    """An ``http:`` step names an endpoint the engine's settings do not configure."""


class InvalidCursor(PermanentError):
    """A cursor this API did not hand out (or one from an incompatible version)."""


class ScheduleNotFound(PermanentError):
    def __init__(self, schedule_id: str) -> None:
        self.schedule_id = schedule_id
        super().__init__(f"no schedule with id {schedule_id!r}")


class ScheduleConflict(PermanentError):
    """A schedule with this id exists with another definition (or was created by an
    operator where code declares one): delete it first, or use another id."""


class BatchNotFound(PermanentError):
    def __init__(self, operation_id: str) -> None:
        self.operation_id = operation_id
        super().__init__(f"no batch operation with id {operation_id!r}")


class DeadLetterNotFound(PermanentError):
    def __init__(self, topic: str, partition: int, offset: int) -> None:
        self.partition = partition
        self.offset = offset
        super().__init__(f"no dead-lettered record at offset {offset} of {topic}[{partition}]")


class DeadLetterNotReplayable(PermanentError):
    """A dead letter that names no origin topic (replay it to a saga), or names the
    dead-letter topic itself."""


class AdminConfigError(PermanentError):
    """The admin API's settings cannot work; the message says what to change."""


class InsecureAdminBinding(AdminConfigError):
    """Refusing to serve the admin API beyond loopback without authentication."""


class CliError(PermanentError):
    """An error the command line reports as one line (e.g. a --payload that is not JSON)."""


class AdminCallError(CliError):
    """The admin API refused (or could not be reached); ``exit_code`` says which."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# --------------------------------------------------------------------------- answers


class KafkaProtocolError(CliError):
    """An answer the drill's Kafka link proxy cannot read (a version above its caps, a
    truncated frame): the proxy closes that connection and the drill fails, saying why."""


class Rejected(SagaError):
    """Raise it in a handler to refuse a command: a business "no", not a crash.

    The handler's writes are rolled back, and the saga receives a ``failure`` reply
    with ``reason`` as its error and ``details`` as its payload (the engine raises
    ``StepFailed(step, reason, details=details)`` in the saga, which then compensates).
    The refusal is stored like any reply, so a re-sent command gets the same answer
    without running the handler again.
    """

    def __init__(self, reason: str, *, details: Mapping[str, Any] | None = None) -> None:
        self.reason = reason
        self.details: dict[str, Any] = dict(details or {})
        super().__init__(reason)


class Retryable(SagaError):
    """Raise it in a handler to answer "not now, try again": nothing applied, at once.

    The handler's writes are rolled back and the saga receives a ``retryable`` reply
    right away, without the kit's in-process handler retries (those are for crashes:
    ``handler_attempts``). The engine then retries the step under a new command id and
    attempt, after its retry policy's back-off; once the policy's attempts run out the
    step fails. Like every answer, it is stored: a copy of the command gets it again.

    ``after`` (a timedelta or seconds) is when a retry may succeed. It travels as
    ``retry_after_s`` in the reply's payload (and in its ``error`` text, "... (retry
    after 30s)"), and the engine waits the longer of it and its retry policy's back-off
    before the next attempt (at most a day: ``core.history._policy.retry_after``).
    """

    def __init__(self, reason: str, *, after: timedelta | float | None = None) -> None:
        seconds = after.total_seconds() if isinstance(after, timedelta) else after
        if seconds is not None and not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"Retryable(after=...) must be a finite delay >= 0, not {after!r}")
        self.reason = reason
        self.after = None if seconds is None else timedelta(seconds=seconds)
        super().__init__(reason)


class UnreadableProgress(PermanentError):
    """A participant's step report (``{prefix}.progress``) a reader drops: ``reason`` is
    ``oversized`` or ``malformed``. Reports are not durable; the reader counts them."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class PoisonMessage(PermanentError):
    """A message that can never be processed: it is dead-lettered, never retried.

    When only its body is refused (nested too deep to be read), ``envelope`` is the
    message as its headers make it (with an empty body) and ``body_error`` the refusal:
    a participant still answers such a command, with a failure naming why. A reply or
    undo without ``ce_commandid`` carries its ``envelope`` too, without ``body_error``,
    so that a participant's earlier check (not a command) decides. (It is the
    transport's ``Envelope``; typed ``object`` because the kernel imports no layer.)"""

    def __init__(
        self,
        reason: PoisonReason,
        detail: str,
        *,
        envelope: object | None = None,
        body_error: InvalidPayload | None = None,
    ) -> None:
        self.reason = reason
        self.detail = detail
        self.envelope = envelope
        self.body_error = body_error
        super().__init__(f"{reason.value}: {detail}")
