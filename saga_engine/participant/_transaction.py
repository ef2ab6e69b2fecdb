"""The transaction of a batch: every command's claim, answer and stored outcome, together.

One transaction on one connection, for a run of commands (a single command is a run of
one). A run goes one of two ways.

**Optimistic** (the first pass of a run whose handlers keep every effect in the
transaction, ``optimistic=True``): BEGIN, every command answered (step 4 below), every
outcome inserted with its reply in one statement (step 5), COMMIT. The insert is the
claim: its ``RETURNING`` returns a row for each command it stored; a command id that
another transaction stored first (a copy answered before) returns none, and one stored
meanwhile (on another instance: the unique index makes the insert wait for that
transaction) fails the insert with a unique violation. Then the whole transaction is rolled back (ClaimLost), the
handlers' writes with it, and the run goes again the locked way, which answers the copy
from its stored reply. Two statements fewer than the locked way, and no lock.

**Locked** (every other pass: a run with a handler whose effects are outside its
transaction, with a compensation, with a command retried after its handler raised, or a
run going again after its optimistic pass failed: a copy found stored, a refusal, a
statement raising, a handler raising while an outcome of the run is stored):

1. the claim of every command id, and of every forward id its compensations undo, in
   one statement (``_sql.CLAIM``, an advisory lock each): a concurrent transaction of
   the same ids is waited for;
2. the tombstones of the forward commands the run's compensations undo;
3. the stored replies of every command id, in one statement: an id stored is a
   duplicate, answered with its stored reply;
4. every other command answered, in record order: its fixed reply, the refusal heard in
   an earlier pass, or its handler's; the commands of a batch handler are gathered into
   groups, one call each, a saga's commands still applied in record order (``_groups``);
5. every fresh outcome inserted with its reply, in one statement, its one row written
   once.

The claim and the handlers' writes commit together, or not at all. A handler call raises
:class:`Refused` or :class:`HandlerFailed` to have the whole transaction rolled back, and
the last statement :class:`ClaimLost` if another transaction stored one of the ids
meanwhile: what comes next is the caller's (``_batch``).
"""

from __future__ import annotations

import contextlib

import asyncpg
from pydantic import BaseModel

from saga_engine.core.history._blobref import resolving
from saga_engine.kernel._errors import PayloadTooLarge, Rejected, Retryable
from saga_engine.kernel._serde import check_storable
from saga_engine.participant._context import ParticipantContext, log
from saga_engine.participant._groups import Groups, checked_results, grouped
from saga_engine.participant._handler import (
    BatchCommand,
    CommandBatch,
    HandlerAnswer,
    Isolation,
    Transaction,
    answer_counter,
    answer_reply,
    json_payload,
)
from saga_engine.participant._handler_timing import CpuTimed, record_handler_times
from saga_engine.participant._ledger import record_applications
from saga_engine.participant._reading import Item
from saga_engine.participant._sql import (
    CLAIM,
    OUTCOMES_KEY,
    RECORD_OUTCOMES,
    STORED_REPLIES,
    TOMBSTONE,
    TOMBSTONE_REPLY,
    Connection,
    Outgoing,
    check_size,
    stored_reply,
    success_body,
)
from saga_engine.transport._record_blobs import fetch_record_blobs
from saga_engine.transport._wire import CODEC_HEADER, Envelope


class HandlerFailed(Exception):
    """A handler raised (not a refusal): the transaction is rolled back, and the run is
    split around its command, or, for a batch handler's group of several, its commands
    are called alone (``_batch``)."""

    def __init__(self, items: list[Item], cause: Exception) -> None:
        self.items = items
        self.cause = cause
        super().__init__(str(cause))


class Refused(Exception):
    """A handler of a pass without savepoints refused (or answered Retryable): the pass
    is rolled back and runs again with savepoints, its answer recorded as it was given."""


class ClaimLost(Exception):
    """An outcome's row was stored by another transaction: on an optimistic pass, a
    copy answered before or meanwhile; on a locked one, after the claim (by a kit that
    does not take this kit's lock). The pass is rolled back and runs again the locked
    way, and finds it stored."""


async def transact(
    ctx: ParticipantContext,
    conn: Connection,
    run: list[Item],
    *,
    savepoints: bool,
    optimistic: bool = False,
) -> None:
    """Answers ``run`` in one transaction on ``conn`` (see the module docstring).

    ``savepoints``: each handler call runs in a savepoint, so that a refusal undoes its
    writes alone. Without (a savepoint costs two more round trips per command, measured
    at about 2.5x the cost of a one-statement handler), a refusal raises Refused.
    ``optimistic``: the run is claimed by its outcomes' insert alone (no lock, no read
    of the stored replies); the caller decides it (``_batch``).
    """
    # READ COMMITTED explicitly, whatever the server's default, unless the handler asks
    # for another level: the claim's reasoning (a concurrent duplicate waits on its lock,
    # then its next statement's snapshot sees the stored reply) is READ COMMITTED's. At
    # REPEATABLE READ the snapshot predates the wait: the duplicate's insert then fails
    # to serialize, and the retried transaction finds the row.
    async with conn.transaction(isolation=_isolation(run)):
        firsts = _dedupe(run)
        stored = {} if optimistic else await _claimed(ctx, conn, firsts)
        groups = Groups()
        for item in firsts:
            if stored and stored.get(_cmd(item).command_id) is not None:
                continue  # answered with its stored reply
            group = groups.before(item)
            if group is not None:  # an earlier command of its saga is applied first
                await _handle(ctx, conn, group, savepoints=savepoints)
            if grouped(item):
                groups.add(item)
            elif not _answered_without_handler(ctx, item):
                await _handle(ctx, conn, [item], savepoints=savepoints)
        for group in groups.rest():
            await _handle(ctx, conn, group, savepoints=savepoints)
        fresh = [i for i in firsts if i.outgoing is not None and not i.duplicate]
        await _record(conn, fresh)
        if optimistic:
            # The run's rows are inserted, not committed: a death here must undo them
            # and every handler's writes, and a copy then finds nothing stored.
            ctx.checkpoint("after_optimistic_insert")
        await _keep_blobs(ctx, firsts)
        if ctx.settings.participant.drill_ledger:
            # In this transaction: a command's ledger row commits with its effects.
            applied = [_cmd(i) for i in fresh if _out(i).reply.outcome == "success"]
            await record_applications(conn, applied)


async def _claimed(ctx: ParticipantContext, conn: Connection, firsts: list[Item]) -> dict[str, str]:
    """The locked claim (the module docstring's steps 1-3): the run's ids locked, its
    tombstones written, and its duplicates answered with their stored replies, which
    are returned by command id."""
    await _claim(conn, firsts)
    await _tombstone(conn, firsts)
    stored = await _stored(conn, firsts)
    blobs = await _stored_blobs(ctx, stored)
    for item in firsts:
        command = _cmd(item)
        reply_text = stored.get(command.command_id)
        if reply_text is not None:
            # Processed before (and committed, or the claim would still be waiting):
            # the same answer again, without running the handler.
            item.duplicate = True
            with resolving(blobs):
                body = stored_reply(reply_text, ctx.codec)
            item.outgoing = ctx.reply(command, body, item.topic)
    return stored


def optimistic(run: list[Item]) -> bool:
    """Whether a first pass of ``run`` may go the optimistic way (module docstring): no
    handler of it acts outside its transaction (it would have acted for a copy before
    the insert finds the copy), no command is a compensation (its tombstones are claimed
    under the lock, before any handler runs, as a late forward command claims itself),
    and no command is retried after its handler raised (it would run twice per attempt
    if it raised again: the optimistic pass and the locked one)."""
    for item in run:
        command = _cmd(item)
        if command.compensation or item.attempt > 1:
            return False
        if item.handler is not None and item.handler.effects == "outside":
            return False
    return True


async def _stored_blobs(ctx: ParticipantContext, stored: dict[str, str]) -> dict[str, bytes]:
    """The blobs of the stored replies that went by reference (sent again as they were)."""
    found: dict[str, bytes] = {}
    if ctx.blobs is None:
        return found
    header = [(CODEC_HEADER, ctx.codec.header)] if ctx.codec is not None else []
    for text in stored.values():
        found.update(await fetch_record_blobs(text.encode(), header, ctx.codec, ctx.blobs))
    return found


async def _keep_blobs(ctx: ParticipantContext, items: list[Item]) -> None:
    """Before the transaction commits: the blobs of its replies by reference, with a
    reference from each reply's saga, so a reply recorded never names a missing blob."""
    if ctx.blobs is None:
        return
    for item in items:
        out = item.outgoing
        if out is not None and out.blobs:
            await ctx.blobs.keep(out.saga_id, out.blobs)


async def _record(conn: Connection, fresh: list[Item]) -> None:
    """Stores the fresh outcomes with their replies, in one statement."""
    if not fresh:
        return
    # In command id order: two optimistic transactions holding copies of the same
    # commands (on two instances, after a rebalance) insert them in the same order, so
    # one waits for the other instead of deadlocking on the unique index.
    outcomes = sorted(_outcome_row(i) for i in fresh)
    try:
        rows = await conn.fetch(RECORD_OUTCOMES, *map(list, zip(*outcomes, strict=True)))
    except asyncpg.UniqueViolationError as exc:
        if exc.constraint_name != OUTCOMES_KEY:
            raise
        raise ClaimLost from exc  # stored by a transaction that committed meanwhile
    if len(rows) != len(fresh):
        raise ClaimLost


def _outcome_row(item: Item) -> tuple[str, str, str, str, str, str, str | None]:
    """An outcome's row as RECORD_OUTCOMES takes it (the command id first)."""
    command, reply = _cmd(item), _out(item)
    # The reply record's value is the reply's JSON already: no second dump.
    body = reply.reply
    return (
        command.command_id,
        command.saga_id,
        command.subject,
        command.step,
        body.outcome,
        reply.value.decode(),
        body.error,
    )


def _answered_without_handler(ctx: ParticipantContext, item: Item) -> bool:
    """Decides the reply of a claimed command that is not in a group when its handler
    is not to give it: its fixed reply, or the refusal heard in an earlier pass. False
    when its handler is to answer."""
    if item.fixed is not None:
        item.outgoing = ctx.fitted(_cmd(item), item.fixed, item.topic)
    elif item.refused is not None:
        _refuse(ctx, item, _cmd(item), item.refused)
    else:
        return False
    return True


async def _handle(
    ctx: ParticipantContext, conn: Connection, items: list[Item], *, savepoints: bool
) -> None:
    """Calls the items' handler once (a single handler's one command, or a batch
    handler's group) and decides each item's reply from its answer."""
    # A span per command, as each has alone: its reply continues that span's trace.
    if len(items) == 1:
        command = _cmd(items[0])
        with ctx.command_span(items[0].record, command) as span:
            await _decide(ctx, conn, items, [ctx.traced(command, span)], savepoints=savepoints)
        return
    with contextlib.ExitStack() as spans:
        commands = [
            ctx.traced(_cmd(i), spans.enter_context(ctx.command_span(i.record, _cmd(i))))
            for i in items
        ]
        await _decide(ctx, conn, items, commands, savepoints=savepoints)


async def _decide(
    ctx: ParticipantContext,
    conn: Connection,
    items: list[Item],
    commands: list[Envelope],
    *,
    savepoints: bool,
) -> None:
    """Each item's reply from its handler's answer (within the items' spans). What the
    handler raises fails the items (HandlerFailed), but a refusal it raises for a single
    command: that is recorded (with savepoints), or raises Refused."""
    try:
        if not savepoints:
            try:
                results = await _attempt(ctx, conn, items, commands)
            except (Rejected, Retryable) as answered:
                if len(items) > 1:
                    raise  # a group's handler raised: no command is refused by it
                # Its writes are in this transaction with its neighbours': all of it
                # rolls back and runs again, with this answer as it was given.
                items[0].refused = answered
                raise Refused from answered
        else:
            try:
                # A savepoint: a refusal (or Retryable) undoes the handler's writes but
                # keeps the claim, so the answer is recorded in this transaction.
                async with conn.transaction():
                    results = await _attempt(ctx, conn, items, commands)
            except (Rejected, Retryable) as answered:
                if len(items) > 1:
                    raise
                # An answer, not a crash: no in-process retry (a Retryable asks the
                # engine for a new attempt at once).
                results = [answered]
    except Refused:
        raise
    except Exception as exc:
        # Leaving the transaction with an exception rolls all of it back, these
        # commands' claims included: nothing is recorded, and each next attempt
        # starts from scratch.
        raise HandlerFailed(items, exc) from exc
    for item, command, result in zip(items, commands, results, strict=True):
        if isinstance(result, Outgoing):
            item.outgoing = result
        else:
            _refuse(ctx, item, command, result)


async def _attempt(
    ctx: ParticipantContext, conn: Connection, items: list[Item], commands: list[Envelope]
) -> list[Outgoing | HandlerAnswer]:
    """The handler's success replies, and the refusals a batch handler returned."""
    spec = items[0].handler
    assert spec is not None
    if not spec.batch:
        tx = Transaction(
            conn,
            commands[0],
            participant=ctx.name,
            attempt=items[0].attempt,
            reports=ctx.step_reports,
        )
        timed = CpuTimed(spec.fn(items[0].model, tx))
        try:
            result = await timed
        finally:  # a refusal is an answer too: its handler's times are reported
            record_handler_times(items, timed)
        return [_success(ctx, commands[0], items[0], result)]
    batch = CommandBatch(
        conn,
        [BatchCommand.of(_model(i), c, i.attempt) for i, c in zip(items, commands, strict=True)],
        participant=ctx.name,
    )
    timed = CpuTimed(spec.fn(batch))
    try:
        returned = await timed
    finally:
        record_handler_times(items, timed)
    results = checked_results(spec, returned, len(items))
    answers = [
        r if isinstance(r, Rejected | Retryable) else _success(ctx, c, i, r)
        for i, c, r in zip(items, commands, results, strict=True)
    ]
    # The group's writes are done, not committed: a death here must undo all of them.
    ctx.checkpoint("in_batch_handler")
    return answers


def _success(ctx: ParticipantContext, command: Envelope, item: Item, result: object) -> Outgoing:
    """The success reply to ``command``; TypeError or an unstorable value is the
    handler's bug. A reply too large to send is refused once (Rejected)."""
    payload = json_payload(result)
    if payload:  # (an empty one is storable)
        # A reply Postgres cannot store is the handler's bug.
        check_storable(payload, f"the reply of the {command.subject} handler")
    reply, dumped = success_body(payload)
    outgoing = ctx.reply(command, reply, item.topic, dumped)
    try:
        check_size(outgoing, ctx.reply_limit, ctx.settings.codec.blobs.max_bytes)
    except PayloadTooLarge as exc:
        # The handler would answer the same every time: running it again (handler
        # attempts) or asking again (the engine's retry policy) cannot help. Answered
        # once, as a refusal: its writes roll back, and the step fails now, naming the limit.
        ctx.stats["reply_too_large"] += 1
        raise Rejected(
            _too_large(command, exc, bool(outgoing.blobs)),
            details={"size_bytes": exc.size, "limit_bytes": exc.limit},
        ) from exc
    return outgoing


def _too_large(command: Envelope, exc: PayloadTooLarge, by_reference: bool) -> str:
    """Why the reply is refused, naming the limit and the setting it comes from (the one
    size rule: the broker's message size; for a reply by reference, the largest blob)."""
    setting = "SAGA_CODEC__BLOBS__MAX_BYTES" if by_reference else "SAGA_KAFKA__MAX_MESSAGE_BYTES"
    return (
        f"the reply of the {command.subject} handler is {exc.size} bytes, over the limit of "
        f"{exc.limit} bytes ({setting}): nothing was applied; return a "
        "smaller result (a reference to the data rather than the data)"
    )


def _refuse(
    ctx: ParticipantContext, item: Item, command: Envelope, answered: HandlerAnswer
) -> None:
    """Records a handler's refusal (or Retryable) as ``item``'s answer; kept for a pass
    that runs again, so that the refusing handler is not asked twice."""
    item.refused = answered
    item.answered = answer_counter(answered)
    item.outgoing = ctx.fitted(command, answer_reply(answered), item.topic)


async def _claim(conn: Connection, firsts: list[Item]) -> None:
    """Locks the run's command ids and the forward ids its compensations undo, waiting
    for a concurrent transaction that holds one of them."""
    ids = [_cmd(i).command_id for i in firsts]
    ids.extend(x for i in firsts for x in _undone(_cmd(i)))
    await conn.execute(CLAIM, ids)


async def _tombstone(conn: Connection, firsts: list[Item]) -> None:
    """Writes the tombstones of the forward commands the run's compensations undo, in
    one statement; but a forward command that comes before its compensation in the run
    is applied, as it would be one at a time, and one after it finds its tombstone."""
    earlier: set[str] = set()
    ids: list[str] = []
    saga_ids: list[str] = []
    steps: list[str] = []
    for item in firsts:
        command = _cmd(item)
        earlier.add(command.command_id)
        for forward_id in _undone(command):
            if forward_id not in earlier:
                ids.append(forward_id)
                saga_ids.append(command.saga_id)
                steps.append(command.step)
    if ids:
        await conn.execute(TOMBSTONE, ids, saga_ids, steps, TOMBSTONE_REPLY)


async def _stored(conn: Connection, firsts: list[Item]) -> dict[str, str]:
    """The stored replies of the run's command ids, by command id: those processed
    before, and the forward commands tombstoned just now."""
    rows = await conn.fetch(STORED_REPLIES, [_cmd(i).command_id for i in firsts])
    return {r["command_id"]: r["reply"] for r in rows}


async def any_stored(ctx: ParticipantContext, run: list[Item]) -> bool:
    """Whether an outcome of ``run`` is stored (committed): after an optimistic pass
    whose handler raised, whether it may have raised for a copy (a business row the
    first one wrote, say) rather than failed. A read that fails proves nothing: True."""
    try:
        async with ctx.pool.acquire() as conn:
            return bool(await _stored(conn, run))
    except Exception as exc:
        log.debug("participant %s: the stored outcomes unread (%r)", ctx.name, exc)
        return True


def _undone(command: Envelope) -> list[str]:
    """The forward command ids a compensation undoes (none for a forward command)."""
    if not command.compensation:
        return []
    return [x for x in command.compensates.split(",") if x]


def _isolation(run: list[Item]) -> Isolation:
    """The run's isolation level: its handler's, for commands that run apart (``_runs``
    gives such a run one handler)."""
    handler = run[0].handler
    if run[0].alone and handler is not None:
        return handler.isolation
    return "read_committed"


def _dedupe(run: list[Item]) -> list[Item]:
    """The first item of each command id; a later copy in the same run is answered with
    the first one's reply."""
    first: dict[str, Item] = {}
    out: list[Item] = []
    for item in run:
        cid = _cmd(item).command_id
        seen = first.get(cid)
        if seen is None:
            first[cid] = item
            out.append(item)
        else:
            item.same_as = seen
    return out


def _cmd(item: Item) -> Envelope:
    assert item.command is not None
    return item.command


def _model(item: Item) -> BaseModel:
    assert item.model is not None
    return item.model


def _out(item: Item) -> Outgoing:
    assert item.outgoing is not None
    return item.outgoing
