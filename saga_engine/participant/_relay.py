"""The outbox relay: publishes the replies in ``saga_reply_outbox`` that no batch got out.

A batch writes a reply there only when it could not publish it (``_replies``). The relay
publishes every such row older than a grace period, every ``interval_s``, and at start
with no grace (rows a previous process left).
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass
from typing import Final

import orjson
from aiokafka import AIOKafkaProducer

from saga_engine.kernel._errors import KafkaUnavailable
from saga_engine.kernel._retry import is_transient
from saga_engine.participant._context import Pool, log
from saga_engine.participant._sql import MARK_PUBLISHED, RELAY_BATCH, publish
from saga_engine.telemetry._telemetry import detach_from_trace
from saga_engine.transport._wire import Headers

#: Outbox rows published per relay transaction.
_RELAY_LIMIT: Final = 200


@dataclass(eq=False)
class Relay:
    """Publishes a participant's unpublished outbox rows."""

    name: str
    pool: Pool
    producer: AIOKafkaProducer
    #: The participant's counters: ``outbox_relayed`` counts the rows published.
    stats: collections.Counter[str]
    stopping: asyncio.Event
    interval_s: float
    #: How old a row must be before the loop publishes it.
    grace_s: float

    async def loop(self) -> None:
        """Publishes the rows past their grace every ``interval_s``, until stopping."""
        detach_from_trace()
        while not self.stopping.is_set():
            try:
                await asyncio.wait_for(self.stopping.wait(), self.interval_s)
                return
            except TimeoutError:
                pass
            try:
                await self.pending(grace_s=self.grace_s)
            except Exception as exc:
                if is_transient(exc):
                    log.warning("outbox relay failed (%r); retrying", exc)
                else:
                    log.exception("outbox relay failed; retrying")

    async def pending(self, *, grace_s: float) -> None:
        """Publishes every unpublished outbox row older than ``grace_s``."""
        while True:
            found, published = await self._batch(grace_s)
            if published:
                self.stats["outbox_relayed"] += published
                log.info("participant %s: relayed %d unpublished replies", self.name, published)
            if found < _RELAY_LIMIT:
                return

    async def _batch(self, grace_s: float) -> tuple[int, int]:
        """Publishes up to _RELAY_LIMIT rows in one transaction that holds their row locks.

        Returns (rows found, rows published). Raises KafkaUnavailable after marking the
        rows it did publish, so a broker outage costs no duplicate on the next pass.
        """
        published: list[int] = []
        failure: KafkaUnavailable | None = None
        async with self.pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(RELAY_BATCH, grace_s, _RELAY_LIMIT)
            for row in rows:
                headers: Headers = [(k, v.encode()) for k, v in orjson.loads(row["headers"])]
                try:
                    await publish(
                        self.producer,
                        row["topic"],
                        row["key"].encode(),
                        row["body"].encode(),
                        headers,
                    )
                except KafkaUnavailable as exc:
                    failure = exc
                    break
                published.append(row["id"])
            if published:
                await conn.execute(MARK_PUBLISHED, published)
        if failure is not None:
            raise failure
        return len(rows), len(published)
