"""The step span's context on every command the engine sends.

A command leaves with the W3C context of its step span (``step_context``: the saga's
trace, a span id derived from the command id and attempt), so the participant's span is
that span's child. The span itself is opened by the observer once the engine reports the
send: both derive it from the command, so tracing changes neither what the engine decides
nor when it sends. With no SDK nothing records, and the command keeps the context its
saga stored (the caller's).

Flow control sends through this sender too (it stands in front of it), so a command
passes here when it actually leaves: one that flow control held finds its span open
already, and the span gets a ``flow.held`` event (``SagaSpans.leaving``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Coroutine
from typing import Any

from saga_engine.core.history._decision import PARENT_PARTICIPANT, OutboundCommand
from saga_engine.core.history._structs import replace
from saga_engine.telemetry._spans import SagaSpans, step_context
from saga_engine.transport._bus import CommandSender, PipelinedSender


class StepContextSender:
    """A CommandSender in front of the broker's that puts the step span's context on
    each command (``step_context_sender`` builds it pipelined when the broker's is)."""

    def __init__(self, inner: CommandSender, spans: SagaSpans) -> None:
        self._inner = inner
        self._spans = spans
        self._telemetry = spans.telemetry

    def _traced(self, command: OutboundCommand) -> OutboundCommand:
        # A child's answer to its parent is the parent's step's reply, not a step of its
        # own: it keeps the context it has, as its parent's step span covers it.
        if command.participant == PARENT_PARTICIPANT or not self._telemetry.records:
            return command
        self._spans.leaving(command)
        return replace(command, trace_context=step_context(command))

    def send_command(self, command: OutboundCommand) -> Coroutine[Any, Any, None]:
        # The broker's send itself, awaited by the caller: no coroutine of this layer's
        # own per command.
        return self._inner.send_command(self._traced(command))


class _PipelinedStepContextSender(StepContextSender):
    def __init__(self, inner: CommandSender, spans: SagaSpans) -> None:
        super().__init__(inner, spans)
        assert isinstance(inner, PipelinedSender)
        self._pipelined = inner

    def start_command(self, command: OutboundCommand) -> Coroutine[Any, Any, Awaitable[None]]:
        return self._pipelined.start_command(self._traced(command))


def step_context_sender(inner: CommandSender, spans: SagaSpans) -> StepContextSender:
    """``inner`` behind the step span's context (of ``spans``, the observer's), pipelined
    if ``inner`` is (a sender that is not would hand over acknowledgements already
    given, for nothing)."""
    if isinstance(inner, PipelinedSender):
        return _PipelinedStepContextSender(inner, spans)
    return StepContextSender(inner, spans)
