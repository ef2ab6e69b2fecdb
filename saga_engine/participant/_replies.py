"""After COMMIT: a batch's replies sent together, and those that did not go out handed to
the outbox, for the relay (``_relay``).

No outbox row is written in the batch's transaction: until the offsets are committed,
the commands are the durable "reply owed". A crash before the offset commit makes Kafka
deliver them again, their claims find the stored replies, and those are sent again.
Only a reply that does not go out while the process lives is written to the outbox (its
offset is committed next, so redelivery would no longer cover it). That keeps two row
writes per command (the insert, the published mark) and the reply's second copy off the
hot path.
"""

from __future__ import annotations

import asyncio
from typing import Any

from saga_engine.kernel._retry import OUTAGE, is_transient
from saga_engine.participant._context import ParticipantContext, log
from saga_engine.participant._sql import INSERT_OUTBOX, Outgoing
from saga_engine.transport._kafka import await_acks, start_record


async def send_replies(ctx: ParticipantContext, replies: list[Outgoing]) -> None:
    """Hands every reply to the producer, then awaits them together; what did not go out
    is written to the outbox before this returns."""
    if not replies:
        return
    futures: list[asyncio.Future[Any]] = []
    sent: list[Outgoing] = []
    unsent: list[Outgoing] = []
    for out in replies:
        try:
            futures.append(
                await start_record(ctx.producer, out.topic, out.key, out.value, out.headers)
            )
            sent.append(out)
        except Exception as exc:
            log.warning("reply %s not published (%r); the relay will", out.command_id, exc)
            unsent.append(out)
    for out, error in zip(sent, await await_acks(futures), strict=True):
        if error is not None:
            log.warning("reply %s not published (%r); the relay will", out.command_id, error)
            unsent.append(out)
    ctx.checkpoint("after_publish")
    if unsent:
        await _to_relay(ctx, unsent)


async def _to_relay(ctx: ParticipantContext, replies: list[Outgoing]) -> None:
    """Writes replies that did not go out to the outbox, retrying an outage until it
    lands or the participant stops (Abandoned: the offsets stay uncommitted, so the
    commands come back and their stored replies are sent then)."""
    backoff = OUTAGE.backoff()
    while True:
        try:
            await ctx.pool.execute(
                INSERT_OUTBOX,
                [r.command_id for r in replies],
                [r.saga_id for r in replies],
                [r.topic for r in replies],
                [r.key.decode() for r in replies],
                [r.headers_json for r in replies],
                [r.value.decode() for r in replies],
            )
            ctx.stats["replies_to_relay"] += len(replies)
            return
        except Exception as exc:
            if not is_transient(exc):
                raise
            delay = backoff.next_delay()
            log.warning("outbox write failed (%r); retrying in %.2fs", exc, delay)
            await ctx.pause(delay)
