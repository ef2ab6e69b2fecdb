"""The message-bus port (the engine's side): commands out.

Replies, signals and start requests come back to the engine through its inbox; the
Kafka adapter (aiokafka) and the in-memory adapter both feed ``Engine`` the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any, Protocol, runtime_checkable

from saga_engine.core.history._decision import OutboundCommand
from saga_engine.kernel._errors import KafkaUnavailable, PermanentError

#: Upper bound on one publish, metadata wait included: aiokafka can otherwise wait
#: indefinitely for a topic's metadata (and forever once the producer is stopped).
SEND_TIMEOUT_S = 30.0


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


def handed_over() -> asyncio.Future[None]:
    """The acknowledgement of a command already sent (or held: flow control's queue)."""
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    future.set_result(None)
    return future


async def await_acks(deliveries: Sequence[Awaitable[Any]]) -> list[BaseException | None]:
    """Awaits acknowledgements together (at most SEND_TIMEOUT_S); each one's error or None."""
    if not deliveries:
        return []
    try:
        # asyncio.timeout, not wait_for: no task per wait.
        async with asyncio.timeout(SEND_TIMEOUT_S):
            results = await asyncio.gather(*deliveries, return_exceptions=True)
    except TimeoutError:
        results = [
            d.exception()
            if isinstance(d, asyncio.Future) and d.done() and not d.cancelled()
            else TimeoutError()
            for d in deliveries
        ]
    return [
        None
        if not isinstance(r, BaseException)
        else r
        if isinstance(r, KafkaUnavailable | PermanentError)  # a refusal for good stays one
        else KafkaUnavailable(f"could not publish: {r!r}")
        for r in results
    ]


class DeadLetterPublisher(Protocol):
    """Where a record that can never be processed goes, with its reason."""

    async def publish_record(
        self, record: Any, *, reason: str, detail: str, consumer: str
    ) -> None: ...
