"""The message-bus port (the engine's side): commands out.

Replies, signals and start requests come back to the engine through its inbox; the
Kafka adapter (aiokafka) and the in-memory adapter both feed ``Engine`` the same way.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from saga_engine._decision import OutboundCommand


@runtime_checkable
class CommandSender(Protocol):
    async def send_command(self, command: OutboundCommand) -> None:
        """Publishes a command durably (acks from the broker) or raises TransientError."""
        ...
