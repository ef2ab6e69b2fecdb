"""A consumed batch of commands, from its records to the offsets to commit: the
participant's one path. Every command takes it; a single command is a batch of one.

For the records one ``getmany`` returned (every partition), :class:`RecordBatchRunner`:

1. reads every record (``_reading``): a poison record is dead-lettered; a command with
   no handler, an invalid or unstorable body gets a fixed failure reply;
2. cuts the commands into runs, in record order: a command whose handler asks for
   another isolation level than READ COMMITTED is a run of its own;
3. answers each run in ONE transaction (``_transaction``), then sends its replies
   together (``_replies``). Its first pass is claimed by its outcomes' insert alone
   (optimistic) when its handlers keep their effects in their transaction; a pass that
   fails so goes again the locked way, which then decides as described below;
4. returns, per partition, the offset past the records answered: the caller commits it.

A handler that refuses or raises must not undo its neighbours. The first pass runs the
handlers back to back with no savepoint. If one of them refuses (``Rejected``, or an
explicit ``Retryable``), the transaction is rolled back and the run goes again with a
savepoint per command: the refusal rolls back to its savepoint and is recorded, its
handler not run again. If one raises, the run is split where it stands: what comes
before it is answered as a run, it is retried alone (after a back-off, as attempt n+1;
after ``handler_attempts``, answered ``retryable``), and what comes after it forms the
next run, so record order holds (a compensation after it must find it answered, or
tombstone it, not overtake it). Either way its neighbours may run twice (their first
writes rolled back).

An outage (Postgres or Kafka away) retries the run until it ends or the participant
stops. A statement failing for another reason, which no command can be blamed for,
splits the run into runs of one; a run of one that fails so is dead-lettered as
``engine_error``, so that a bug or a broken table never stalls its partition.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator, Sequence
from typing import Any

from aiokafka import TopicPartition

from saga_engine.kernel._retry import OUTAGE, is_transient, jittered
from saga_engine.participant._context import Abandoned, ParticipantContext, log
from saga_engine.participant._handler import gave_up_reply
from saga_engine.participant._handler_timing import stamp_timings
from saga_engine.participant._reading import Item, Reader
from saga_engine.participant._replies import send_replies
from saga_engine.participant._sql import NO_BLOBS, Outgoing
from saga_engine.participant._transaction import (
    ClaimLost,
    HandlerFailed,
    Refused,
    any_stored,
    optimistic,
    transact,
)


class RecordBatchRunner:
    """Takes a consumed batch to answered replies; the caller commits the offsets."""

    def __init__(self, ctx: ParticipantContext) -> None:
        self._ctx = ctx
        self._reader = Reader(ctx)

    async def run(self, records: Sequence[tuple[TopicPartition, Any]]) -> dict[TopicPartition, int]:
        """Processes ``records`` (record order within each partition) and returns, per
        partition, the offset to commit: past every record answered. If the participant
        stops meanwhile, what was done is reported by the offsets of the items done
        before."""
        received = time.time()
        items = [Item(tp, record, received) for tp, record in records]
        try:
            for run in _runs(await self._reader.prepare(items)):
                await self._answer(run)
        except Abandoned:
            pass
        return _offsets(items)

    async def _answer(self, run: list[Item]) -> None:
        """Answers a run: its transaction committed, then its replies sent; or split, if
        a handler raised or a statement failed for no command's fault."""
        try:
            failed = await self._commit(run)
        except Abandoned:
            raise
        except Exception as exc:
            await self._unattributable(run, exc)
            return
        if failed is not None:
            await self._split(run, failed)
            return
        await self._after_commit(run)

    async def _commit(self, run: list[Item]) -> HandlerFailed | None:
        """Runs the run's transaction until it commits, waiting out outages. Returns the
        failure of a handler that raised (the transaction rolled back); raises what no
        command can be blamed for.

        The first pass is optimistic when it may be (``_transaction.optimistic``). One
        that fails (a copy's outcome found stored, a refusal, a statement raising) goes
        again the locked way, which answers a copy from its stored reply, and acts on a
        refusal as if there had been no optimistic pass (the refusal is not asked for
        twice). A handler that raised on it failed as on the locked way (its attempt
        counted, the handler not run again at once), unless an outcome of the run is
        stored: it may have raised for being a copy, and the locked way tells.
        """
        ctx = self._ctx
        backoff = OUTAGE.backoff()
        savepoints = False
        by_insert = optimistic(run)  # this pass is claimed by its outcomes' insert
        while True:
            _reset(run)
            try:
                async with ctx.pool.acquire() as conn:
                    await transact(ctx, conn, run, savepoints=savepoints, optimistic=by_insert)
                return None
            except Refused:
                savepoints = True
                ctx.stats["batch_replays"] += 1
            except ClaimLost:
                ctx.stats["claims_lost"] += 1
            except HandlerFailed as failed:
                ctx.stats["batch_replays"] += 1
                # A handler that raised on the optimistic pass failed, unless the run
                # holds a copy whose outcome is stored: then the locked way answers it.
                if not (by_insert and await any_stored(ctx, run)):
                    return failed
            except Exception as exc:
                if is_transient(exc):
                    savepoints = False
                    for item in run:
                        item.refused = None  # a pass cut short by an outage proved nothing
                    delay = backoff.next_delay()
                    log.warning("transient failure (%r); retrying the batch in %.2fs", exc, delay)
                    await ctx.pause(delay)
                elif not by_insert:
                    raise
                # Else an optimistic pass's statement failed (say, a deadlock with a copy
                # on another instance): the locked way tells whether it was the copy.
            by_insert = False  # every pass after a failed one goes the locked way

    async def _after_commit(self, run: list[Item]) -> None:
        ctx = self._ctx
        committed = time.time()
        ctx.checkpoint("after_commit")
        if len(run) > 1:
            ctx.checkpoint("after_batch_commit")
        replies: list[Outgoing] = []
        for item in run:
            first = item.same_as
            if first is not None and first.outgoing is not None:
                # A copy of a command earlier in this run: the same answer, to its own
                # message.
                assert item.command is not None
                item.outgoing = copy = ctx.reply(item.command, first.outgoing.reply, item.topic)
                if copy.blobs:  # by reference: the first's value, whose blob was kept
                    copy.value, copy.blobs = first.outgoing.value, NO_BLOBS
            if item.outgoing is not None:
                self._count(item)
                stamp_timings(item, committed)
                replies.append(item.outgoing)
        await send_replies(ctx, replies)
        for item in run:
            item.done = True

    async def _split(self, run: list[Item], failed: HandlerFailed) -> None:
        """Answers what comes before the command whose handler raised, then retries it
        alone, then answers what comes after it."""
        if len(failed.items) > 1:
            await self._ungroup(run, failed)
            return
        [item] = failed.items
        for other in run:
            # The one to blame is found: the others go to their batch handlers together
            # again (a group that raises again is split again).
            other.solo = other.solo and other is item
        index = run.index(item)
        if index:
            await self._answer(run[:index])
        await self._retry(item, failed.cause)
        if index + 1 < len(run):
            await self._answer(run[index + 1 :])

    async def _ungroup(self, run: list[Item], failed: HandlerFailed) -> None:
        """A batch handler raised for a group of several: the run goes again with each
        of the group's commands called alone, in its place, so that the one to blame is
        found (and retried as any handler that raised) and its neighbours' answers
        stand. No attempt is counted: none of them is known to have failed."""
        ctx = self._ctx
        ctx.stats["batch_handler_splits"] += 1
        handler = failed.items[0].handler
        log.warning(
            "participant %s: the batch handler for %s raised for %d commands (%r); "
            "calling it for each alone",
            ctx.name,
            handler and handler.command_type,
            len(failed.items),
            failed.cause,
        )
        for item in failed.items:
            item.solo = True
        await self._answer(run)

    async def _retry(self, item: Item, cause: Exception) -> None:
        """Runs a command whose handler raised again, alone: its next attempt after a
        back-off, or, its attempts spent, the ``retryable`` answer."""
        ctx = self._ctx
        ctx.stats["handler_errors"] += 1
        attempts = ctx.settings.participant.handler_attempts
        command = item.command
        assert command is not None
        if item.attempt < attempts:
            # The handler's attempts are this loop's failures: attempt n waits as a
            # Backoff's n-th delay would.
            delay = jittered(item.attempt, *ctx.backoff, random.random)
            log.warning(
                "participant %s: %s %s attempt %d/%d failed (%r); retrying in %.2fs",
                ctx.name,
                command.subject,
                command.command_id,
                item.attempt,
                attempts,
                cause,
                delay,
            )
            await ctx.pause(delay)
            item.attempt += 1
        else:
            log.error(
                "participant %s: %s %s failed %d times; replying retryable",
                ctx.name,
                command.subject,
                command.command_id,
                attempts,
                exc_info=cause,
            )
            # Recorded like any answer, in a transaction of its own (the failed one
            # rolled back), and in one at the default level, as no handler runs.
            item.handler, item.model = None, None
            item.fixed, item.counter = gave_up_reply(cause), "retryable"
        await self._answer([item])

    async def _unattributable(self, run: list[Item], exc: Exception) -> None:
        ctx = self._ctx
        if len(run) == 1:
            await ctx.engine_error(run[0].record, exc)
            run[0].done = True
            return
        log.warning(
            "participant %s: a batch of %d failed (%r); one command at a time",
            ctx.name,
            len(run),
            exc,
        )
        ctx.stats["batch_fallbacks"] += 1
        for item in run:
            await self._answer([item])

    def _count(self, item: Item) -> None:
        stats = self._ctx.stats
        if item.same_as is not None or item.duplicate:
            stats["duplicates"] += 1
            return
        stats["processed"] += 1
        if item.fixed is not None:
            stats[item.counter] += 1
        elif item.answered:
            stats[item.answered] += 1


def _reset(run: list[Item]) -> None:
    """Clears what a rolled-back pass decided (a refusal it heard is kept: the refusing
    handler does not run again)."""
    for item in run:
        item.outgoing = None
        item.duplicate = False
        item.answered = ""
        item.same_as = None
        if item.refused is None:
            item.handler_times = None


def _runs(items: list[Item]) -> Iterator[list[Item]]:
    """The items in runs, in order: each one that must run apart (another isolation
    level) is a run of its own, but for the commands of one batch handler that follow
    each other, which are one run, so that the handler is called for them together."""
    run: list[Item] = []
    for item in items:
        if run and _together(run[-1], item):
            run.append(item)
            continue
        if run:
            yield run
        run = [item]
    if run:
        yield run


def _together(last: Item, item: Item) -> bool:
    if not (last.alone or item.alone):
        return True
    return last.handler is item.handler and item.handler is not None and item.handler.batch


def _offsets(items: list[Item]) -> dict[TopicPartition, int]:
    """Per partition, the offset past the longest run of done records from the start."""
    offsets: dict[TopicPartition, int] = {}
    blocked: set[TopicPartition] = set()
    for item in items:
        if item.tp in blocked:
            continue
        if not item.done:
            blocked.add(item.tp)
            continue
        offsets[item.tp] = item.record.offset + 1
    return offsets
