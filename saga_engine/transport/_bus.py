"""The message-bus port (the engine's side): commands out.

Replies, signals and start requests come back to the engine through its inbox; the
Kafka adapter (aiokafka) and the in-memory adapter both feed ``Engine`` the same way.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol, runtime_checkable

from saga_engine.core._decision import OutboundCommand


class Ownership(Protocol):
    """Which sagas an engine drives, when several share them (by Kafka partition)."""

    def owns(self, saga_id: str) -> bool:
        """Whether this engine drives ``saga_id`` (keeps it live, with its timers)."""
        ...

    async def notify_owner(self, saga_id: str) -> None:
        """Tells the owner that this engine changed the saga's history, so it reloads it."""
        ...


@runtime_checkable
class CommandSender(Protocol):
    async def send_command(self, command: OutboundCommand) -> None:
        """Publishes a command durably (acks from the broker) or raises TransientError."""
        ...


@runtime_checkable
class PipelinedSender(Protocol):
    """A sender that can hand many commands over before any is acknowledged (Kafka's
    producer batches them into few requests). The engine's batch path uses it when the
    sender has it, and ``send_command`` one at a time otherwise."""

    async def start_command(self, command: OutboundCommand) -> Awaitable[None]:
        """Hands the command over; the awaitable completes when it is durable (or raises
        TransientError)."""
        ...
