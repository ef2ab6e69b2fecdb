"""Which inbox partitions an engine owns, and what a rebalance does to their sagas.

One object is both the engine's ``Ownership`` (does this engine drive a saga? tell the
owner to reload one) and the inbox consumer's rebalance listener:

- **on revocation** the batch in hand is finished and its offsets committed; the sagas
  of the revoked partitions stay in memory with their timers stopped (rebalances are
  eager: every member gives up every partition, and with sticky assignment most come
  straight back);
- **on assignment** the sagas of partitions that went elsewhere are dropped, those of
  partitions kept are driven on (their timers armed again), and the open sagas of the
  partitions new here are recovered from the store: rebuilt by replay, their
  outstanding commands re-sent under the same ids, their timers armed.

A stale owner that still writes loses the optimistic-concurrency check in Postgres, drops
the saga and sends nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiokafka import ConsumerRebalanceListener, TopicPartition

from saga_engine.kernel._errors import ShardUnavailable, TransientError
from saga_engine.kernel._partitioning import partition_for
from saga_engine.runner._engine import Engine
from saga_engine.runner._parts import EngineParts
from saga_engine.store._store import EventStore
from saga_engine.telemetry._telemetry import detach_from_trace

log = logging.getLogger("saga_engine.worker")


class InboxOwnership(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(
        self,
        *,
        inbox: str,
        default_count: int,
        instance_id: str,
        before_revoke: Callable[[], Awaitable[None]],
        partition_ids: Callable[[], set[int] | None],
        notify: Callable[[str], Awaitable[None]],
        generation: Callable[[], int | None] = lambda: None,
    ) -> None:
        self._inbox = inbox
        self._default_count = default_count
        self._instance_id = instance_id
        self._before_revoke = before_revoke
        self._partition_ids = partition_ids
        self._notify = notify
        self._generation = generation
        #: The revocation came after this member lost its membership (aiokafka resets
        #: the generation when the coordinator no longer knows the member).
        self._expelled = False
        self._engine: Engine | None = None
        self._parts: EngineParts | None = None
        #: Every partition assigned now (the offset committer commits only these).
        self.owned: set[TopicPartition] = set()
        #: The inbox partitions among them and the inbox's partition count, kept at each
        #: assignment and revocation for ``owns``, which is asked on every input.
        self._mine: frozenset[int] = frozenset()
        self._count = 0
        #: Inbox partitions revoked by a rebalance still under way: their sagas are held
        #: in memory, not driven, until the assignment keeps or drops them.
        self._suspended: set[int] = set()
        #: Set once an assignment's recovery is done.
        self.assigned_event = asyncio.Event()
        #: Recoveries of partitions whose shard did not answer (``_recover_or_defer``).
        self._late_recoveries: set[asyncio.Task[None]] = set()

    def attach(self, engine: Engine, parts: EngineParts) -> None:
        """Drives ``engine``'s sagas, with the collaborators it was built from."""
        self._engine = engine
        self._parts = parts

    # ------------------------------------------------------------------ Ownership

    def owns(self, saga_id: str) -> bool:
        mine = self._mine
        return bool(mine) and partition_for(saga_id, self._count) in mine

    async def notify_owner(self, saga_id: str) -> None:
        await self._notify(saga_id)

    def partitions(self) -> tuple[frozenset[int], int]:
        """The inbox partitions owned now, and the inbox's partition count."""
        return self._mine, self._count

    def _partition_count(self) -> int:
        known = self._partition_ids()
        return len(known) if known else self._default_count

    def _note_owned(self) -> None:
        self._mine = frozenset(tp.partition for tp in self.owned if tp.topic == self._inbox)
        self._count = self._partition_count()
        flow = self._parts.flow if self._parts is not None else None
        if flow is not None:
            # Limits are cluster-wide: this engine enforces its partition share of them.
            flow.set_share(len(self._mine), self._count)

    # ------------------------------------------------------------------ rebalances

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        detach_from_trace()  # aiokafka's coordinator task runs this; it is no one's trace
        self._expelled = self._expelled or self._generation() is None
        await self._before_revoke()
        self.owned -= set(revoked)
        self._note_owned()
        gone = {tp.partition for tp in revoked if tp.topic == self._inbox}
        parts = self._parts
        if parts is None or not gone:
            return
        parts.stats.inc("partitions_revoked", len(gone))
        self._suspended |= gone
        count = self._partition_count()
        held = 0
        for saga_id in parts.live.ids():
            if partition_for(saga_id, count) in gone:
                parts.live.suspend(saga_id)
                held += 1
        log.info(
            "engine %s gave up partitions %s (%d sagas held until the assignment)",
            self._instance_id,
            sorted(gone),
            held,
        )

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        detach_from_trace()  # recovery's queries serve many sagas: no span for each
        self.owned |= set(assigned)
        self._note_owned()
        mine = {tp.partition for tp in assigned if tp.topic == self._inbox}
        kept, lost = self._suspended & mine, self._suspended - mine
        if self._expelled:
            # This member was expelled (it stalled past the session timeout) before this
            # rebalance: another engine may have driven these partitions meanwhile, so
            # what is held is dropped and recovered from the store.
            kept, lost = set(), set(self._suspended)
            self._expelled = False
        self._suspended = set()
        engine, parts = self._engine, self._parts
        if engine is None or parts is None:
            self.assigned_event.set()
            return
        count = self._partition_count()
        dropped = held = 0
        for saga_id in parts.live.ids():
            partition = partition_for(saga_id, count)
            if partition in lost:
                parts.live.evict(saga_id)  # another engine drives it now
                dropped += 1
            elif partition in kept:
                parts.live.rearm(saga_id)
                held += 1
        parts.stats.inc("sagas_kept_across_rebalance", held)
        if parts.flow is not None:
            parts.flow.drop_unowned(self.owns)  # their new owner sends what they owe
        if dropped:
            log.info(
                "engine %s dropped %d sagas of partitions %s, now elsewhere",
                self._instance_id,
                dropped,
                sorted(lost),
            )
        if mine:
            recovered = await self._recover_or_defer(engine, parts.store, mine - kept, count)
            log.info(
                "engine %s took partitions %s (kept %s) and recovered %d sagas",
                self._instance_id,
                sorted(mine),
                sorted(kept),
                recovered,
            )
        self.assigned_event.set()

    async def _recover_or_defer(
        self, engine: Engine, store: EventStore, new: set[int], count: int
    ) -> int:
        """Recovers the new partitions, as ``_recover``; past one database, when a shard
        does not answer, partition by partition: the partitions whose shard answers are
        recovered now, and the others' recovery goes on in the background until their
        shard is back (or they are no longer this engine's), so that one shard down does
        not stop the sagas of every other shard."""
        if not new:
            return 0
        try:
            return await self._recover(engine, store, new, count)
        except ShardUnavailable as exc:
            log.warning("recovery of partitions %s: %s; by partition", sorted(new), exc)
        recovered, waiting = 0, set()
        for partition in sorted(new):
            try:
                recovered += await engine.recover(await store.open_saga_ids({partition}, count))
            except TransientError:
                waiting.add(partition)
        if waiting:
            task = asyncio.create_task(self._recover_later(engine, store, waiting, count))
            self._late_recoveries.add(task)
            task.add_done_callback(self._late_recoveries.discard)
        return recovered

    async def _recover_later(
        self, engine: Engine, store: EventStore, waiting: set[int], count: int
    ) -> None:
        delay = 0.1
        while waiting := waiting & self._mine:
            try:
                recovered = await engine.recover(await store.open_saga_ids(waiting, count))
            except TransientError as exc:
                log.warning("recovery of partitions %s waits (%s)", sorted(waiting), exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            log.info("recovered %d sagas of partitions %s", recovered, sorted(waiting))
            return

    async def close(self) -> None:
        """Stops the recoveries still waiting for a shard (the engine is stopping)."""
        tasks = list(self._late_recoveries)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    @staticmethod
    async def _recover(engine: Engine, store: EventStore, new: set[int], count: int) -> int:
        """Only the partitions new here are recovered, in parallel (bounded by
        engine.recovery_concurrency). A kept partition's sagas are in memory or were
        evicted here: their wake-ups are due from the store, and an input reloads them."""
        if not new:
            return 0
        delay = 0.1
        while True:
            try:
                return await engine.recover(await store.open_saga_ids(new, count))
            except TransientError as exc:
                if isinstance(exc, ShardUnavailable):
                    raise  # the caller recovers the other shards' partitions first
                log.warning("recovery failed (%s); retrying", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
