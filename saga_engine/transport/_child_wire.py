"""How a child saga's messages look on the wire: the engine's own "participants"
(``saga.child``, ``saga.parent``) routed to the saga inbox as a start, an undo or a
reply (proto/PROTOCOL.md section 5a). Plain data and envelopes, no I/O: the Kafka sender
and the flow-control sender read it without importing the engine's runner."""

from __future__ import annotations

from saga_engine.core.history._decision import (
    CHILD_PARTICIPANT,
    PARENT_PARTICIPANT,
    ChildStart,
    ChildUndo,
    OutboundCommand,
)
from saga_engine.core.history._events import ParentLink
from saga_engine.core.runtime._start import StartRequest
from saga_engine.transport._wire import (
    Envelope,
    MessageType,
    ReplyBody,
    UndoBody,
    start_envelope,
)

__all__ = ["ENGINE_PARTICIPANTS", "engine_envelope", "parent_of"]

#: Participant names the engine answers itself: never a participant's command topic.
ENGINE_PARTICIPANTS = frozenset({CHILD_PARTICIPANT, PARENT_PARTICIPANT})


def parent_of(command: OutboundCommand) -> ParentLink:
    """The parent a child command comes from."""
    return ParentLink(
        saga_id=command.saga_id, command_id=command.command_id, saga_type=command.saga_type
    )


def engine_envelope(command: OutboundCommand, source: str) -> Envelope:
    """The inbox message that carries a child's start or undo (keyed by the child's id),
    or a child's end (the reply to its parent's command, keyed by the parent's id)."""
    trace = {
        "traceparent": command.trace_context.get("traceparent", ""),
        "tracestate": command.trace_context.get("tracestate", ""),
    }
    if command.participant == PARENT_PARTICIPANT:
        body = command.payload
        return Envelope(
            message_type=MessageType.REPLY,
            source=source,
            subject=command.command_type,
            saga_id=command.saga_id,
            saga_type=command.saga_type,
            command_id=command.command_id,
            step=command.step,
            correlation_id=command.saga_id,
            causation_id=str(body.get("child", "")),
            body=ReplyBody(
                outcome=body["outcome"],
                payload=body.get("payload") or {},
                error=body.get("error"),
            ).model_dump(mode="json"),
            **trace,
        )
    if command.compensation:
        undo = ChildUndo.model_validate(command.payload)
        return Envelope(
            message_type=MessageType.UNDO,
            source=source,
            subject=undo.saga_type,
            saga_id=undo.saga_id,
            saga_type=undo.saga_type,
            command_id=command.command_id,
            correlation_id=command.saga_id,
            causation_id=command.command_id,
            body=UndoBody(parent_id=command.saga_id).model_dump(mode="json"),
            **trace,
        )
    start = ChildStart.model_validate(command.payload)
    request = StartRequest(
        saga_type=start.saga_type,
        input=start.input,
        saga_id=start.saga_id,
        trace_context=command.trace_context,
        parent=parent_of(command),
        priority=start.priority,
        fairness_key=start.fairness_key,
    )
    return start_envelope(
        request, source=source, correlation_id=command.saga_id, causation_id=command.command_id
    )
