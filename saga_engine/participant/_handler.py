"""What a handler is given and what its answer becomes.

The :class:`Transaction` a handler receives, the :class:`CommandBatch` a batch handler
receives (both with the :class:`Statements` delegates), a registered handler
(:class:`HandlerSpec`), and the replies the kit decides: a handler's return value
(``json_payload``), its ``Rejected`` or ``Retryable`` (``answer_reply``), and the
failures given without running it (a body that cannot be stored, an invalid body, an
unknown command type).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Generic, Literal, TypeAlias, TypeVar, overload

import asyncpg
import orjson
from pydantic import BaseModel, ValidationError

from saga_engine.kernel._errors import InvalidPayload, Rejected, Retryable, UnstorableValue
from saga_engine.kernel._serde import (
    JsonDict,
    model_payload,
    storable_copy,
    unstorable,
    without_input,
)
from saga_engine.participant._sql import Connection
from saga_engine.participant._step_reports import StepReporter
from saga_engine.transport._wire import Envelope, ReplyBody

Isolation = Literal["read_committed", "repeatable_read", "serializable"]
#: Where a handler's effects are: all in the transaction it is given ("transaction", the
#: default), or some outside it too ("outside": an HTTP call, a message, a file), which
#: keeps its commands on the locked claim (``Participant.handles``).
Effects = Literal["transaction", "outside"]
#: What a handler may return: its reply payload.
HandlerResult: TypeAlias = BaseModel | Mapping[str, Any] | None
#: What a handler raises to answer rather than crash: its writes roll back and the
#: answer is recorded in the same transaction (the claim kept).
HandlerAnswer: TypeAlias = Rejected | Retryable

M = TypeVar("M", bound=BaseModel)


class Statements:
    """``execute``/``fetch``/``fetchrow``/``fetchval`` on ``connection``: what a handler's
    :class:`Transaction` and a batch handler's :class:`CommandBatch` both offer.

    ``connection`` is the asyncpg connection, inside a transaction that also records the
    commands as processed: commit and rollback belong to the participant, so a handler
    must not end the transaction itself (nested ``connection.transaction()`` blocks are
    savepoints and are fine).
    """

    __slots__ = ("connection",)

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    # The delegates leave out asyncpg's per-call ``timeout``; use ``.connection`` for it.
    async def execute(self, query: str, *args: Any) -> str:
        return await self.connection.execute(query, *args)

    async def fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        return await self.connection.fetch(query, *args)

    async def fetchrow(self, query: str, *args: Any) -> asyncpg.Record | None:
        return await self.connection.fetchrow(query, *args)

    async def fetchval(self, query: str, *args: Any, column: int = 0) -> Any:
        return await self.connection.fetchval(query, *args, column=column)


class Transaction(Statements):
    """The participant's own database transaction a handler runs in, and the command's ids.

    ``connection`` is the asyncpg connection (see :class:`Statements`);
    ``execute``/``fetch``/``fetchrow``/``fetchval`` delegate to it. ``attempt`` counts
    from 1; it grows when a previous attempt raised. ``progress(...)`` reports how far
    the handler got, shown on the step while it runs (docs/progress.md).
    """

    __slots__ = (
        "_command",
        "_reports",
        "_seq",
        "attempt",
        "command_id",
        "command_type",
        "compensation",
        "participant",
        "saga_id",
        "saga_type",
        "step",
    )

    def __init__(
        self,
        connection: Connection,
        command: Envelope,
        *,
        participant: str,
        attempt: int,
        reports: StepReporter | None = None,
    ) -> None:
        super().__init__(connection)
        self._command = command
        self._reports = reports
        self._seq = 0
        self.participant = participant
        self.attempt = attempt
        self.command_id = command.command_id
        self.command_type = command.subject
        self.saga_id = command.saga_id
        self.saga_type = command.saga_type
        self.step = command.step
        self.compensation = command.compensation

    @property
    def trace_context(self) -> dict[str, str]:
        """The W3C trace headers of the command (``traceparent``, ``tracestate``: those
        it has)."""
        return trace_context(self._command)

    def progress(self, body: BaseModel | Any) -> None:
        """Reports how far the handler got on this step (a model or any JSON value, at
        most 8 KiB as JSON), shown on the step while it runs: on ``GET /sagas/{id}``,
        the stream (``?steps=true``) and the saga's page. Not durable, sent in the
        background, and never raises: a report that cannot be sent is dropped and
        counted (``Participant.stats["step_progress_dropped"]``)."""
        if self._reports is None:
            return
        self._seq += 1
        self._reports.report(self._command, self.attempt, self._seq, body)

    def __repr__(self) -> str:
        return (
            f"Transaction(participant={self.participant!r}, command_id={self.command_id!r}, "
            f"saga_id={self.saga_id!r}, step={self.step!r}, attempt={self.attempt})"
        )


@dataclass(frozen=True, slots=True)
class BatchCommand(Generic[M]):
    """One command of a :class:`CommandBatch`: the validated model and its ids, as a
    :class:`Transaction` has them for a single handler."""

    command: M
    command_id: str
    saga_id: str
    saga_type: str
    step: str
    #: Counts from 1; above 1 only in a batch of one (a command whose handler raised is
    #: retried alone).
    attempt: int
    compensation: bool
    trace_context: Mapping[str, str]

    @classmethod
    def of(cls, model: M, command: Envelope, attempt: int) -> BatchCommand[M]:
        return cls(
            model,
            command.command_id,
            command.saga_id,
            command.saga_type,
            command.step,
            attempt,
            command.compensation,
            trace_context(command),
        )


class CommandBatch(Statements, Sequence[BatchCommand[M]], Generic[M]):
    """The commands a batch handler answers together, in record order, and the
    participant's transaction they are answered in (``connection`` and the delegates, as
    on :class:`Transaction`).

    The handler returns one entry per command, in this order: its reply payload (as a
    single handler's return value), or a :class:`Rejected` or :class:`Retryable` instance
    that answers that command alone and says the handler wrote nothing for it.
    """

    __slots__ = ("_commands", "participant")

    def __init__(
        self, connection: Connection, commands: list[BatchCommand[M]], *, participant: str
    ) -> None:
        super().__init__(connection)
        self._commands = commands
        self.participant = participant

    @overload
    def __getitem__(self, index: int) -> BatchCommand[M]: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[BatchCommand[M]]: ...
    def __getitem__(self, index: int | slice) -> BatchCommand[M] | Sequence[BatchCommand[M]]:
        return self._commands[index]

    def __len__(self) -> int:
        return len(self._commands)

    def __repr__(self) -> str:
        return f"CommandBatch(participant={self.participant!r}, commands={len(self)})"


def trace_context(command: Envelope) -> dict[str, str]:
    """The W3C trace headers ``command`` carries (those it has)."""
    found: dict[str, str] = {}
    if command.traceparent:
        found["traceparent"] = command.traceparent
    if command.tracestate:
        found["tracestate"] = command.tracestate
    return found


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    command_type: str
    model: type[BaseModel]
    #: ``async def fn(cmd, tx)``, or with ``batch``, ``async def fn(batch)``.
    fn: Callable[..., Awaitable[Any]]
    isolation: Isolation
    #: Registered with ``handles_batch``: it answers a group of commands in one call.
    batch: bool = False
    effects: Effects = "transaction"
    #: ``model.model_validate``, as the model validates a command's body: its validator
    #: called directly (what ``BaseModel.model_validate`` does, without its keyword
    #: arguments per command) unless the model validates its own way.
    validate: Callable[[Any], BaseModel] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        validate: Callable[[Any], BaseModel] = self.model.model_validate
        if getattr(validate, "__func__", None) is _MODEL_VALIDATE:
            validate = self.model.__pydantic_validator__.validate_python
        object.__setattr__(self, "validate", validate)


_MODEL_VALIDATE: Final = vars(BaseModel)["model_validate"].__func__


def json_payload(result: object) -> JsonDict:
    """A handler's return value (or a refusal's details) as a JSON object; raises TypeError."""
    if result is None or (type(result) is dict and not result):
        return {}  # (an empty dict: a new one, as the round trip below would give)
    if isinstance(result, BaseModel):
        return model_payload(result)
    if isinstance(result, Mapping):
        # The round trip proves the value is JSON now, inside the handler's attempt,
        # rather than failing later when the reply is written.
        value: JsonDict = orjson.loads(orjson.dumps(dict(result), option=orjson.OPT_UTC_Z))
        return value
    raise TypeError(
        f"a handler must return a pydantic model, a dict or None, not {type(result).__name__}"
    )


def answer_reply(answer: HandlerAnswer) -> ReplyBody:
    """The reply a handler's Rejected or Retryable stands for. It is recorded whatever it
    says: what Postgres cannot store is written out as escapes."""
    if isinstance(answer, Rejected):
        return ReplyBody(
            outcome="failure",
            payload=storable_copy(json_payload(answer.details)),
            error=storable_copy(answer.reason),
        )
    if answer.after is None:
        return ReplyBody(outcome="retryable", error=storable_copy(answer.reason))
    seconds = answer.after.total_seconds()
    return ReplyBody(
        outcome="retryable",
        payload={"retry_after_s": seconds},
        error=storable_copy(f"{answer.reason} (retry after {seconds:g}s)"),
    )


def answer_counter(answer: HandlerAnswer) -> str:
    """The stats counter of a handler's answer: the one its outcome has anyway."""
    return "rejected" if isinstance(answer, Rejected) else "retryable"


def gave_up_reply(cause: BaseException) -> ReplyBody:
    """The answer to a command whose handler raised on every attempt: ``retryable``, as
    nothing was applied. It is recorded like any answer: the engine abandons this command
    id for a new one, so a copy of it processed later must not apply anything
    (PROTOCOL.md 7.3)."""
    return ReplyBody(
        outcome="retryable", error=storable_copy(f"{type(cause).__name__}: {cause}"[:2000])
    )


def unstorable_body(command: Envelope) -> UnstorableValue | None:
    """Why Postgres could not record ``command``'s handling (nor, often, the handler its
    effect), or None: such a command is refused at once, with a reply that says where,
    so the step fails now instead of waiting out its timeout."""
    problems = unstorable(command.body)
    return (
        UnstorableValue(f"{command.subject or 'the command'} body", problems) if problems else None
    )


def refusal_reply(invalid: InvalidPayload) -> ReplyBody:
    """The failure reply to a command whose body is refused before its handler runs."""
    return ReplyBody(
        outcome="failure", payload={"errors": invalid.errors}, error=str(invalid)[:2000]
    )


def unknown_command_reply(participant: str, command: Envelope, handles: Sequence[str]) -> ReplyBody:
    """The failure reply to a command type this participant has no handler for."""
    return ReplyBody(
        outcome="failure",
        payload={"command_type": command.subject, "handles": sorted(handles)},
        error=f"participant {participant} cannot handle {command.subject or '(no ce_subject)'}",
    )


def invalid_body(command: Envelope, model: type[BaseModel], exc: ValidationError) -> str:
    """The dead letter's detail for a body that does not validate against its model."""
    return f"{command.subject} body is not a valid {model.__name__}: {without_input(exc)}"


def invalid_body_reply(command: Envelope, exc: ValidationError) -> ReplyBody:
    """The failure reply to a body that does not validate: its saga compensates instead
    of waiting for the step's timeout."""
    errors = orjson.loads(exc.json(include_url=False, include_input=False))
    return ReplyBody(
        outcome="failure",
        payload={"errors": errors[:20]},
        error=f"invalid {command.subject} body: {exc.error_count()} validation error(s)",
    )
