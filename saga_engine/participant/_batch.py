"""A consumed batch of commands as one unit: one transaction, one publish wait.

The participant's hot path. For the records one ``getmany`` returned (every partition):

1. each record is read and checked without I/O (a poison record is dead-lettered; a
   command with no handler, an invalid or unstorable body gets a fixed failure reply);
2. ONE transaction on ONE connection claims every command id (one statement), writes
   the compensations' tombstones (one statement), runs every handler in record order
   and records every outcome with its reply (one statement);
3. after COMMIT, every reply is handed to the producer at once and the sends are
   awaited together; only the replies that did not go out are written to the outbox,
   for the relay (see ``_publish``: uncommitted offsets are the batch's outbox);
4. the caller commits the batch's offsets once.

A handler that refuses or raises must not undo its neighbours. The first pass runs the
handlers back to back with no savepoint (a savepoint costs two more round trips per
command, measured at about 2.5x the cost of a one-statement handler). If one of them
refuses or raises, the whole transaction is rolled back and the batch runs again with a
savepoint per command: a refusal (``Rejected``, or an explicit ``Retryable``) rolls back
to its savepoint and is recorded, its handler not run again; a handler that raised has
its claim removed and is retried on its own, after the batch, by the single-command
path (with its backoff and its ``retryable`` answer).

Commands whose handler asks for another isolation level, and the cases no batch can
attribute (a statement of the batch failing for a reason other than an outage), go
through that single-command path too, in record order.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson
from aiokafka import TopicPartition
from pydantic import BaseModel, ValidationError

from saga_engine.kernel._errors import (
    InvalidPayload,
    PoisonMessage,
    PoisonReason,
    Rejected,
    Retryable,
)
from saga_engine.kernel._retry import Backoff
from saga_engine.kernel._serde import check_storable, without_input
from saga_engine.participant._participant import (
    Abandoned,
    CommandProcessor,
    HandlerAnswer,
    HandlerSpec,
    Transaction,
    answer_counter,
    answer_reply,
    is_transient,
    json_payload,
    refusal_reply,
    unstorable_body,
)
from saga_engine.participant._sql import (
    MARK_PUBLISHED,
    TOMBSTONE,
    TOMBSTONE_REPLY,
    Connection,
    Outgoing,
    check_size,
    reply_record,
    stored_reply,
)
from saga_engine.transport._kafka import delivered, ensure_topics, start_record
from saga_engine.transport._wire import (
    Envelope,
    ReplyBody,
)

log = logging.getLogger("saga_engine.participant")

# The claim of a whole batch: the same deduplication as the single-command CLAIM (the
# primary key; a concurrent claim of the same id on another instance waits for this
# transaction to end), one statement for all of them. RETURNING names the ids inserted:
# the others were processed before.
CLAIM_MANY: Final = """
INSERT INTO saga_processed_commands (command_id, saga_id, command_type, step, outcome)
SELECT c, s, t, st, 'pending' FROM unnest($1::text[], $2::text[], $3::text[], $4::text[])
    AS x(c, s, t, st)
ON CONFLICT (command_id) DO NOTHING
RETURNING command_id
"""

STORED_REPLIES: Final = """
SELECT command_id, reply::text AS reply FROM saga_processed_commands
WHERE command_id = ANY($1::text[])
"""

RECORD_OUTCOMES: Final = """
UPDATE saga_processed_commands AS p
SET outcome = x.outcome, reply = x.reply::jsonb, error = x.error, processed_at = now()
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS x(command_id, outcome, reply, error)
WHERE p.command_id = x.command_id
"""

# The replies a batch could not publish, handed to the relay. created_at is the wall
# clock at the insert: the relay's grace period counts from here.
INSERT_OUTBOX_MANY: Final = """
INSERT INTO saga_reply_outbox (command_id, saga_id, topic, key, headers, body, created_at)
SELECT c, s, t, k, h::jsonb, b::jsonb, clock_timestamp()
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[])
    AS x(c, s, t, k, h, b)
"""


@dataclass(slots=True)
class Item:
    """One record of the batch and what became of it."""

    tp: TopicPartition
    record: Any
    command: Envelope | None = None
    topic: str = ""
    handler: HandlerSpec | None = None
    model: BaseModel | None = None
    #: A reply decided without the handler (no handler, an invalid body), and its counter.
    fixed: ReplyBody | None = None
    counter: str = ""
    #: Handled on its own: its handler asks for another isolation level, or reading it
    #: failed in a way the single path knows how to handle.
    solo: bool = False
    #: Its handler refused (Rejected) or answered Retryable in a pass that was rolled
    #: back: the answer is recorded without running the handler again.
    refused: HandlerAnswer | None = None
    outgoing: Outgoing | None = None
    duplicate: bool = False
    #: The counter of the handler's answer recorded for it ("rejected", "retryable").
    answered: str = ""
    #: Answered by an earlier item of the batch with the same command id.
    same_as: Item | None = None
    #: Its record needs nothing more (dead-lettered, or answered).
    done: bool = False

    def command_id_in(self, ids: set[str]) -> bool:
        return self.command is not None and self.command.command_id in ids


class _Failed(Exception):
    """A handler raised (not a refusal): the pass is rolled back and the batch split."""

    def __init__(self, item: Item, cause: Exception) -> None:
        self.item = item
        self.cause = cause
        super().__init__(str(cause))


class _Refused(Exception):
    """A handler of the savepoint-free pass refused (or answered Retryable): the pass is
    rolled back and the batch runs again, with savepoints, its answer recorded as it was
    given."""


class BatchRunner:
    """Takes a consumed batch to answered replies; the caller commits the offsets."""

    def __init__(self, processor: CommandProcessor) -> None:
        self._p = processor

    # ------------------------------------------------------------------ the batch

    async def run(self, records: Sequence[tuple[TopicPartition, Any]]) -> dict[TopicPartition, int]:
        """Processes ``records`` (record order within each partition) and returns, per
        partition, the offset to commit: past every record answered. Raises Abandoned only
        through ``pause`` (the participant is stopping): what was done is reported by the
        offsets of the items done before."""
        items = [Item(tp, record) for tp, record in records]
        try:
            for group, solo in _segments(await self._prepare(items)):
                if group:
                    await self._group(group)
                if solo is not None:
                    await self._solo(solo)
        except Abandoned:
            pass
        return _offsets(items)

    async def _prepare(self, items: list[Item]) -> list[Item]:
        """Reads every record; dead-letters the unreadable and decides the fixed replies.
        Returns the items still to answer, in order."""
        p = self._p
        todo: list[Item] = []
        for item in items:
            try:
                command, refused = p.read_command(item.record)
            except PoisonMessage as poison:
                await p._dead_letter(item.record, poison.reason.value, poison.detail)
                item.done = True
                continue
            except Exception:
                item.solo = True  # the single path retries an outage, dead-letters a bug
                todo.append(item)
                continue
            item.command = command
            try:
                item.topic = command.reply_to or p.topics.inbox
                if item.topic not in p._reply_topics:
                    # As in the single path: the outbox only holds records that can be sent.
                    await ensure_topics(p.settings.kafka, [item.topic])
                    p._reply_topics.add(item.topic)
                await self._classify(item, command, refused)
            except Abandoned:
                raise
            except Exception:
                # Kafka away while creating a reply topic, a model validator raising
                # something other than ValidationError: the single path knows both.
                item.handler, item.model, item.fixed = None, None, None
                item.solo = True
            todo.append(item)
        return todo

    async def _classify(
        self, item: Item, command: Envelope, refused: InvalidPayload | None = None
    ) -> None:
        p = self._p
        invalid = refused or unstorable_body(command)
        if invalid is not None:
            await p._dead_letter(item.record, PoisonReason.UNSTORABLE_VALUE.value, str(invalid))
            item.fixed = refusal_reply(invalid)
            item.counter = "unstorable"
            return
        handler = p._handlers.get(command.subject)
        if handler is None:
            item.fixed = ReplyBody(
                outcome="failure",
                payload={"command_type": command.subject, "handles": sorted(p._handlers)},
                error=f"participant {p.name} cannot handle {command.subject or '(no ce_subject)'}",
            )
            item.counter = "unknown_command"
            return
        try:
            item.model = handler.model.model_validate(command.body)
        except ValidationError as exc:
            detail = (
                f"{command.subject} body is not a valid {handler.model.__name__}: "
                f"{without_input(exc)}"
            )
            await p._dead_letter(item.record, PoisonReason.INVALID_BODY.value, detail)
            errors = orjson.loads(exc.json(include_url=False, include_input=False))
            item.fixed = ReplyBody(
                outcome="failure",
                payload={"errors": errors[:20]},
                error=f"invalid {command.subject} body: {exc.error_count()} validation error(s)",
            )
            item.counter = "invalid_body"
            return
        item.handler = handler
        # One transaction has one isolation level: a handler that asks for a stricter one
        # gets a transaction of its own.
        item.solo = handler.isolation != "read_committed"

    # ------------------------------------------------------------------ one transaction

    async def _group(self, group: list[Item]) -> None:
        """Answers a run of batchable items: one transaction, then one publish wait.

        A handler that raises splits the run where it stands: what comes before it is
        answered as a batch, it is retried on its own (as the single path would), and
        what comes after it forms the next batch, so record order holds (a compensation
        after it in the batch must find it answered, or tombstone it, not overtake it).
        """
        p = self._p
        backoff = Backoff(0.1, 5.0)
        savepoints = False
        while True:
            _reset(group)
            try:
                async with p._pool.acquire() as conn:
                    await self._transact(conn, group, savepoints=savepoints)
                break
            except _Refused:
                savepoints = True
                p.stats["batch_replays"] += 1
            except _Failed as failed:
                p.stats["batch_replays"] += 1
                index = group.index(failed.item)
                if index:
                    await self._group(group[:index])
                await self._solo(failed.item, failure=failed.cause)
                if index + 1 < len(group):
                    await self._group(group[index + 1 :])
                return
            except Exception as exc:
                if not is_transient(exc):
                    # A statement of the batch failed for a reason no record can be
                    # blamed for here: each takes the single path, which dead-letters
                    # the one that fails.
                    log.warning(
                        "participant %s: a batch of %d failed (%r); one command at a time",
                        p.name,
                        len(group),
                        exc,
                    )
                    p.stats["batch_fallbacks"] += 1
                    _reset(group)
                    for item in group:
                        await self._solo(item)
                    return
                savepoints = False
                for item in group:
                    item.refused = None  # a pass cut short by an outage proved nothing
                delay = backoff.next_delay()
                log.warning("transient failure (%r); retrying the batch in %.2fs", exc, delay)
                await p.pause(delay)
        p._checkpoint("after_commit")
        if len(group) > 1:
            p._checkpoint("after_batch_commit")
        for item in group:
            first = item.same_as
            if first is not None and first.outgoing is not None:
                # A copy of a command earlier in this batch: the same answer, to its own
                # message (no outbox row: the first one's is the durable answer).
                item.outgoing = reply_record(
                    _cmd(item),
                    first.outgoing.reply,
                    source=p._source,
                    topic=item.topic,
                    codec=p.codec,
                )
        answered = [i for i in group if i.outgoing is not None]
        for item in answered:
            self._count(item)
        await self._publish(answered)
        for item in group:
            item.done = True

    async def _transact(self, conn: Connection, group: list[Item], *, savepoints: bool) -> None:
        p = self._p
        # READ COMMITTED explicitly, whatever the server's default: the claim's reasoning
        # (a concurrent duplicate waits on the primary key, then sees the conflict) is
        # READ COMMITTED's, as in the single path.
        async with conn.transaction(isolation="read_committed"):
            if self._p.unmarked:
                await conn.execute(MARK_PUBLISHED, self._p.unmarked)
                p.stats["mark_published_statements"] += 1
            firsts = self._dedupe(group)
            claimable = _claimable(firsts)
            claimed: set[str] = set()
            if claimable:
                rows = await conn.fetch(
                    CLAIM_MANY,
                    [_cmd(i).command_id for i in claimable],
                    [_cmd(i).saga_id for i in claimable],
                    [_cmd(i).subject for i in claimable],
                    [_cmd(i).step for i in claimable],
                )
                claimed = {r["command_id"] for r in rows}
            for item in firsts:
                command = _cmd(item)
                forward_ids = [x for x in command.compensates.split(",") if x]
                if command.compensation and forward_ids and item.command_id_in(claimed):
                    # Tombstones, as in the single path; written in record order relative
                    # to the claims (_claimable left out the forward commands that come
                    # after their compensation in this batch).
                    await conn.execute(
                        TOMBSTONE, forward_ids, command.saga_id, command.step, TOMBSTONE_REPLY
                    )
            stored_ids = [_cmd(i).command_id for i in firsts if not i.command_id_in(claimed)]
            stored: dict[str, str] = {}
            if stored_ids:
                stored = {
                    r["command_id"]: r["reply"]
                    for r in await conn.fetch(STORED_REPLIES, stored_ids)
                }
            for item in firsts:
                command = _cmd(item)
                if not item.command_id_in(claimed):
                    item.duplicate = True
                    reply = stored_reply(stored[command.command_id], p.codec)
                    item.outgoing = reply_record(
                        command, reply, source=p._source, topic=item.topic, codec=p.codec
                    )
                elif item.fixed is not None:
                    item.outgoing = p._fitted(command, item.fixed, item.topic)
                elif item.refused is not None:
                    item.answered = answer_counter(item.refused)
                    item.outgoing = p._fitted(command, answer_reply(item.refused), item.topic)
                else:
                    await self._run_handler(conn, item, savepoints=savepoints)
            answered = [i for i in firsts if i.outgoing is not None]
            fresh = [i for i in answered if not i.duplicate]
            if fresh:
                if len(fresh) > 1:
                    # A plan made for this execution, for the rest of this transaction (the
                    # handlers have run: their statements are planned as the user's session
                    # would). The update joins the batch to the table; a generic plan cached
                    # while the table was small scans it whole on every batch until
                    # autovacuum's next ANALYZE (measured: 3x the cost at 20,000 rows, and
                    # growing with the table).
                    await conn.execute("SET LOCAL plan_cache_mode = force_custom_plan")
                await conn.execute(
                    RECORD_OUTCOMES,
                    [_cmd(i).command_id for i in fresh],
                    [_out(i).reply.outcome for i in fresh],
                    # The reply record's value is the reply's JSON already: no second dump.
                    [_out(i).value.decode() for i in fresh],
                    [_out(i).reply.error for i in fresh],
                )
        # Committed: the marks went with it.
        self._p.unmarked = []

    async def _run_handler(self, conn: Connection, item: Item, *, savepoints: bool) -> None:
        p = self._p
        command, handler, model = _cmd(item), item.handler, item.model
        assert handler is not None
        assert model is not None
        with p.command_span(item.record, command) as span:
            traced = p.traced(command, span)
            tx = Transaction(conn, traced, participant=p.name, attempt=1)
            if not savepoints:
                try:
                    item.outgoing = await self._attempt(traced, item, handler, model, tx)
                except (Rejected, Retryable) as answer:
                    # Its writes are in this transaction with its neighbours': all of it
                    # rolls back and runs again, with this answer as it was given.
                    item.refused = answer
                    raise _Refused from answer
                except Exception as exc:
                    self._failed(item, exc)
                    raise _Failed(item, exc) from exc
                return
            try:
                try:
                    async with conn.transaction():
                        item.outgoing = await self._attempt(traced, item, handler, model, tx)
                except (Rejected, Retryable) as answer:
                    item.answered = answer_counter(answer)
                    item.outgoing = p._fitted(traced, answer_reply(answer), item.topic)
            except Exception as exc:
                self._failed(item, exc)
                raise _Failed(item, exc) from exc

    def _failed(self, item: Item, exc: Exception) -> None:
        """A handler raised: the pass rolls back and the batch is split around it."""
        p = self._p
        p.stats["handler_errors"] += 1
        log.warning(
            "participant %s: %s %s failed in a batch (%r); retrying it on its own",
            p.name,
            _cmd(item).subject,
            _cmd(item).command_id,
            exc,
        )

    async def _attempt(
        self, command: Envelope, item: Item, handler: HandlerSpec, model: BaseModel, tx: Transaction
    ) -> Outgoing:
        p = self._p
        result = await handler.fn(model, tx)
        payload = json_payload(result)
        check_storable(payload, f"the reply of the {command.subject} handler")
        outgoing = reply_record(
            command,
            ReplyBody(outcome="success", payload=payload),
            source=p._source,
            topic=item.topic,
            codec=p.codec,
        )
        check_size(outgoing, p._reply_limit)
        return outgoing

    def _dedupe(self, group: list[Item]) -> list[Item]:
        """The first item of each command id; a later copy in the same batch is answered
        with the first one's reply."""
        first: dict[str, Item] = {}
        out: list[Item] = []
        for item in group:
            cid = _cmd(item).command_id
            seen = first.get(cid)
            if seen is None:
                first[cid] = item
                out.append(item)
            else:
                item.same_as = seen
        return out

    # ------------------------------------------------------------------ after COMMIT

    async def _publish(self, items: list[Item]) -> None:
        """Hands every reply to the producer, then awaits them together.

        The batch writes no outbox row: until the offsets are committed, the commands are
        the durable "reply owed". A crash before the commit makes Kafka deliver them
        again, and their claims find the stored replies, which are sent again. Only a
        reply that does not go out while the process lives is written to the outbox (its
        offset is committed next, so redelivery would no longer cover it) for the relay
        to send. That keeps two row writes per command (the insert, the published mark)
        and the reply's second copy off the hot path.
        """
        p = self._p
        if not items:
            return
        futures: list[asyncio.Future[Any]] = []
        sent: list[Item] = []
        unsent: list[Item] = []
        for item in items:
            out = _out(item)
            try:
                futures.append(
                    await start_record(p._producer, out.topic, out.key, out.value, out.headers)
                )
                sent.append(item)
            except Exception as exc:
                log.warning("reply %s not published (%r); the relay will", out.command_id, exc)
                unsent.append(item)
        for item, error in zip(sent, await delivered(futures), strict=True):
            if error is not None:
                log.warning(
                    "reply %s not published (%r); the relay will", _out(item).command_id, error
                )
                unsent.append(item)
        p._checkpoint("after_publish")
        if unsent:
            await self._to_relay([_out(i) for i in unsent])

    async def _to_relay(self, replies: list[Outgoing]) -> None:
        """Writes replies that did not go out to the outbox, retrying an outage until it
        lands or the participant stops (Abandoned: the offsets stay uncommitted, so the
        commands come back and their stored replies are sent then)."""
        p = self._p
        backoff = Backoff(0.1, 5.0)
        while True:
            try:
                await p._pool.execute(
                    INSERT_OUTBOX_MANY,
                    [r.command_id for r in replies],
                    [r.saga_id for r in replies],
                    [r.topic for r in replies],
                    [r.key.decode() for r in replies],
                    [r.headers_json for r in replies],
                    [r.value.decode() for r in replies],
                )
                p.stats["replies_to_relay"] += len(replies)
                return
            except Exception as exc:
                if not is_transient(exc):
                    raise
                delay = backoff.next_delay()
                log.warning("outbox write failed (%r); retrying in %.2fs", exc, delay)
                await p.pause(delay)

    def _count(self, item: Item) -> None:
        stats = self._p.stats
        if item.same_as is not None or item.duplicate:
            stats["duplicates"] += 1
            return
        stats["processed"] += 1
        if item.fixed is not None:
            stats[item.counter] += 1
        elif item.answered:
            stats[item.answered] += 1

    async def _solo(self, item: Item, *, failure: Exception | None = None) -> None:
        """The single-command path, for one item (``failure``: its handler's first
        attempt, which failed in a batch)."""
        p = self._p
        command = item.command
        if command is not None and item.handler is not None and item.model is not None:
            await p.apply_alone(item.record, command, item.topic, item.handler, item.model, failure)
        elif command is not None and item.fixed is not None:
            # Already dead-lettered where that applies: only the answer is left to give.
            await p.answer_alone(item.record, command, item.topic, item.fixed, item.counter)
        else:
            await p.handle(item.record)
        item.done = True

    async def flush_marks(self) -> None:
        """Marks the published rows now (the participant is idle: no next batch)."""
        if not self._p.unmarked:
            return
        ids, self._p.unmarked = self._p.unmarked, []
        try:
            await self._p._pool.execute(MARK_PUBLISHED, ids)
            self._p.stats["mark_published_statements"] += 1
        except Exception as exc:
            log.warning("could not mark %d replies published (%r)", len(ids), exc)


# --------------------------------------------------------------------------- helpers


def _cmd(item: Item) -> Envelope:
    assert item.command is not None
    return item.command


def _out(item: Item) -> Outgoing:
    assert item.outgoing is not None
    return item.outgoing


def _reset(group: list[Item]) -> None:
    """Clears what a rolled-back pass decided (a refusal it heard is kept: the refusing
    handler does not run again)."""
    for item in group:
        item.outgoing = None
        item.duplicate = False
        item.answered = ""
        item.same_as = None


def _claimable(firsts: list[Item]) -> list[Item]:
    """The items to claim: all but a forward command that a compensation earlier in the
    batch tombstones (it must find the tombstone, as it would have one at a time)."""
    tombstoned: set[str] = set()
    out: list[Item] = []
    for item in firsts:
        command = _cmd(item)
        if command.command_id not in tombstoned:
            out.append(item)
        if command.compensation:
            tombstoned.update(x for x in command.compensates.split(",") if x)
    return out


def _segments(items: list[Item]) -> Iterator[tuple[list[Item], Item | None]]:
    """Runs of batchable items, each followed by the solo item that ended it (if any)."""
    group: list[Item] = []
    for item in items:
        if item.solo:
            yield group, item
            group = []
        else:
            group.append(item)
    if group:
        yield group, None


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
