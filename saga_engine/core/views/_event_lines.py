"""One line per history event, with the gist of its payload: what a person scanning a
history needs (the input, the outcome and error, the reason and who acted), not the
whole JSON. ``saga history`` prints these; the web page shows them beside the JSON."""

from __future__ import annotations

from typing import Any

import orjson

from saga_engine.core.history._events import (
    CallbackAwaited,
    CallbackReceived,
    CancelRequested,
    CompensationForced,
    CompensationStarted,
    CompensationStuck,
    DomainEventReceived,
    Event,
    EventAwaited,
    InvalidReplyReceived,
    KeyQueued,
    ProgressEmitted,
    ReplyReceived,
    RetryRequested,
    SagaCancelled,
    SagaCompensated,
    SagaCompleted,
    SagaFailed,
    SagaParked,
    SagaResumed,
    SagaStarted,
    SideEffectRecorded,
    SignalReceived,
    StepAbandoned,
    StepParked,
    StepSkipped,
    TimerStarted,
    UndoRequested,
    UpdateCompleted,
    UpdateReceived,
)

__all__ = ["event_line", "short_value"]

#: Longest rendering of a payload in a gist line.
WIDTH = 120


def event_line(event: Event) -> str:
    """``event.describe()``, followed by the gist of what it carries."""
    parts = [event.describe()] + [p for p in _details(event) if p]
    return "; ".join(parts)


def _started(event: SagaStarted) -> list[str]:
    key = f"key {event.idempotency_key!r}" if event.idempotency_key else ""
    deadline = f"deadline {event.deadline_at.isoformat()}" if event.deadline_at else ""
    parent = f"child of {event.parent.saga_id}" if event.parent else ""
    origin = event.trigger
    trigger = (
        f"from {origin.topic}[{origin.partition}]@{origin.offset}" if origin is not None else ""
    )
    rerun = f"rerun of {event.rerun_of.saga_id}" if event.rerun_of else ""
    return [f"input {_short(event.input)}", key, deadline, parent, trigger, rerun]


def _details(event: Event) -> list[str]:
    if isinstance(event, SagaStarted):
        return _started(event)
    if isinstance(event, UndoRequested):
        return [f"reason {event.reason!r}" if event.reason else ""]
    if isinstance(event, ReplyReceived):
        return [f"error {event.error!r}" if event.error else "", _payload(event.payload)]
    if isinstance(event, InvalidReplyReceived):
        return [event.error.message, _payload(event.payload)]
    if isinstance(event, SignalReceived):
        return [_payload(event.payload), _who(event.principal, event.reason)]
    if isinstance(event, EventAwaited):
        return [f"until {event.timeout_at.isoformat()}" if event.timeout_at else ""]
    if isinstance(event, DomainEventReceived):
        return [f"id {event.event_id}", _payload(event.payload)]
    if isinstance(event, CallbackAwaited):
        return [f"until {event.expires_at.isoformat()}", f"key {event.key_id}"]
    if isinstance(event, CallbackReceived):
        return ["failed" if event.failed else "", _payload(event.payload)]
    if isinstance(event, UpdateReceived):
        return [
            f"id {event.update_id}",
            _payload(event.payload),
            _who(event.principal, event.reason),
        ]
    if isinstance(event, UpdateCompleted):
        failed = _error(event.error)
        return [failed or f"result {_short(event.result)}", f"id {event.update_id}"]
    if isinstance(event, CancelRequested | CompensationForced):
        return [_who(event.principal, event.reason)]
    if isinstance(event, StepSkipped):
        result = "" if event.compensation else f"result {_short(event.payload)}"
        return [result, _who(event.principal, event.reason)]
    if isinstance(event, RetryRequested):
        edited = f"command {_short(event.command)}" if event.command is not None else ""
        return [edited, _who(event.principal, event.reason)]
    if isinstance(event, SagaResumed):
        return [_who(event.principal, event.reason)]
    return _decided(event)


def _decided(event: Event) -> list[str]:
    """The gist of what the saga's code (or the engine for it) decided and recorded."""
    if isinstance(event, StepAbandoned):
        return [f"commands {', '.join(event.command_ids)}" if event.command_ids else ""]
    if isinstance(event, StepParked):
        return [_error(event.error), "in doubt" if event.in_doubt else ""]
    if isinstance(event, SagaParked):
        return [f"{event.reason}: {event.error.message}"]
    if isinstance(event, KeyQueued):
        behind = ", ".join(event.behind) or "nobody"
        return [f"position {event.position}", f"behind saga {behind}"]
    if isinstance(event, TimerStarted):
        return [f"fires {event.fire_at.isoformat()}"]
    if isinstance(event, SideEffectRecorded):
        return [f"value {_short(event.value)}"]
    if isinstance(event, ProgressEmitted):
        return [f"#{event.number} {event.topic}", _short(event.payload)]
    if isinstance(event, CompensationStarted | CompensationStuck | SagaFailed | SagaCompensated):
        return [_error(event.error)]
    if isinstance(event, SagaCompleted):
        return [f"output {_short(event.output)}"]
    if isinstance(event, SagaCancelled):
        return [f"reason {event.reason!r}"]
    return []


def _who(principal: str, reason: str) -> str:
    return f"by {principal}" + (f": {reason!r}" if reason else "")


def _error(error: Any) -> str:
    return f"{error.type}: {error.message}" if error is not None else ""


def _payload(payload: dict[str, Any]) -> str:
    return f"payload {_short(payload)}" if payload else ""


def short_value(value: Any) -> str:
    """A value as a gist shows it: compact JSON, cut at :data:`WIDTH`."""
    return _short(value)


def _short(value: Any) -> str:
    text = orjson.dumps(value, default=str, option=orjson.OPT_SORT_KEYS).decode()
    return text if len(text) <= WIDTH else text[: WIDTH - 1] + "…"
