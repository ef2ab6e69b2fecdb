"""The transaction of a batch: every command's claim, answer and stored outcome, together.

One transaction on one connection, for a run of commands (a single command is a run of
one):

1. the claim of every command id, in one statement (``_sql.CLAIM``): an id already
   there was processed before, and is a duplicate;
2. the tombstones of the forward commands the run's compensations undo;
3. the stored replies of the duplicates, in one statement;
4. every other command answered, in record order: its fixed reply, the refusal heard in
   an earlier pass, or its handler's;
5. every fresh outcome recorded with its reply, in one statement.

The claim and the handlers' writes commit together, or not at all. ``answer`` raises
:class:`Refused` or :class:`HandlerFailed` to have the whole transaction rolled back:
what comes next is the caller's (``_batch``).
"""

from __future__ import annotations

from typing import Final

from saga_engine.kernel._errors import Rejected, Retryable
from saga_engine.kernel._serde import check_storable
from saga_engine.participant._context import ParticipantContext
from saga_engine.participant._handler import (
    Isolation,
    Transaction,
    answer_counter,
    answer_reply,
    json_payload,
)
from saga_engine.participant._reading import Item
from saga_engine.participant._sql import (
    CLAIM,
    RECORD_OUTCOMES,
    STORED_REPLIES,
    TOMBSTONE,
    TOMBSTONE_REPLY,
    Connection,
    Outgoing,
    check_size,
    stored_reply,
)
from saga_engine.transport._wire import Envelope, ReplyBody

#: For the rest of a transaction that records several outcomes: a plan made for this
#: execution (the handlers have run: their statements are planned as the user's session
#: would). The update joins the batch to the table; a generic plan cached while the
#: table was small scans it whole on every batch until autovacuum's next ANALYZE
#: (measured: 3x the cost at 20,000 rows, and growing with the table).
_CUSTOM_PLANS: Final = "SET LOCAL plan_cache_mode = force_custom_plan"


class HandlerFailed(Exception):
    """A handler raised (not a refusal): the transaction is rolled back, and the run is
    split around its command."""

    def __init__(self, item: Item, cause: Exception) -> None:
        self.item = item
        self.cause = cause
        super().__init__(str(cause))


class Refused(Exception):
    """A handler of a pass without savepoints refused (or answered Retryable): the pass
    is rolled back and runs again with savepoints, its answer recorded as it was given."""


async def transact(
    ctx: ParticipantContext, conn: Connection, run: list[Item], *, savepoints: bool
) -> None:
    """Answers ``run`` in one transaction on ``conn`` (see the module docstring).

    ``savepoints``: each handler runs in a savepoint, so that a refusal undoes its writes
    alone. Without (a savepoint costs two more round trips per command, measured at
    about 2.5x the cost of a one-statement handler), a refusal raises Refused.
    """
    # READ COMMITTED explicitly, whatever the server's default, unless the handler asks
    # for another level: the claim's reasoning (a concurrent duplicate waits on the
    # primary key, then sees the conflict) is READ COMMITTED's.
    async with conn.transaction(isolation=_isolation(run)):
        firsts = _dedupe(run)
        claimed = await _claim(conn, _claimable(firsts))
        await _tombstone(conn, firsts, claimed)
        stored = await _stored(conn, [i for i in firsts if not i.command_id_in(claimed)])
        for item in firsts:
            command = _cmd(item)
            if not item.command_id_in(claimed):
                # Processed before (and committed, or the claim would still be waiting):
                # the same answer again, without running the handler.
                item.duplicate = True
                reply = stored_reply(stored[command.command_id], ctx.codec)
                item.outgoing = ctx.reply(command, reply, item.topic)
            else:
                await answer(ctx, conn, item, savepoints=savepoints)
        fresh = [i for i in firsts if i.outgoing is not None and not i.duplicate]
        if len(fresh) > 1:
            await conn.execute(_CUSTOM_PLANS)
        if fresh:
            await conn.execute(
                RECORD_OUTCOMES,
                [_cmd(i).command_id for i in fresh],
                [_out(i).reply.outcome for i in fresh],
                # The reply record's value is the reply's JSON already: no second dump.
                [_out(i).value.decode() for i in fresh],
                [_out(i).reply.error for i in fresh],
            )


async def answer(
    ctx: ParticipantContext, conn: Connection, item: Item, *, savepoints: bool
) -> None:
    """Decides the reply of a claimed command: its fixed reply, the refusal heard in an
    earlier pass, or what its handler answers."""
    command = _cmd(item)
    if item.fixed is not None:
        item.outgoing = ctx.fitted(command, item.fixed, item.topic)
    elif item.refused is not None:
        item.answered = answer_counter(item.refused)
        item.outgoing = ctx.fitted(command, answer_reply(item.refused), item.topic)
    else:
        with ctx.command_span(item.record, command) as span:
            await _run_handler(ctx, conn, item, ctx.traced(command, span), savepoints=savepoints)


async def _run_handler(
    ctx: ParticipantContext, conn: Connection, item: Item, command: Envelope, *, savepoints: bool
) -> None:
    tx = Transaction(conn, command, participant=ctx.name, attempt=item.attempt)
    try:
        if not savepoints:
            try:
                item.outgoing = await _attempt(ctx, command, item, tx)
            except (Rejected, Retryable) as answered:
                # Its writes are in this transaction with its neighbours': all of it
                # rolls back and runs again, with this answer as it was given.
                item.refused = answered
                raise Refused from answered
            return
        try:
            # A savepoint: a refusal (or Retryable) undoes the handler's writes but keeps
            # the claim, so the answer is recorded in this transaction.
            async with conn.transaction():
                item.outgoing = await _attempt(ctx, command, item, tx)
        except (Rejected, Retryable) as answered:
            # An answer, not a crash: no in-process retry (a Retryable asks the engine
            # for a new attempt at once).
            item.answered = answer_counter(answered)
            item.outgoing = ctx.fitted(command, answer_reply(answered), item.topic)
    except Refused:
        raise
    except Exception as exc:
        # Leaving the transaction with an exception rolls all of it back, this command's
        # claim included: nothing is recorded, and its next attempt starts from scratch.
        raise HandlerFailed(item, exc) from exc


async def _attempt(
    ctx: ParticipantContext, command: Envelope, item: Item, tx: Transaction
) -> Outgoing:
    """The handler's success reply; whatever it raises is the caller's."""
    assert item.handler is not None
    assert item.model is not None
    payload = json_payload(await item.handler.fn(item.model, tx))
    # A reply Postgres cannot store, or one too large to send, is the handler's bug.
    check_storable(payload, f"the reply of the {command.subject} handler")
    outgoing = ctx.reply(command, ReplyBody(outcome="success", payload=payload), item.topic)
    check_size(outgoing, ctx.reply_limit)
    return outgoing


async def _claim(conn: Connection, items: list[Item]) -> set[str]:
    """Claims the items' command ids; returns those claimed now (the others were
    processed before)."""
    if not items:
        return set()
    rows = await conn.fetch(
        CLAIM,
        [_cmd(i).command_id for i in items],
        [_cmd(i).saga_id for i in items],
        [_cmd(i).subject for i in items],
        [_cmd(i).step for i in items],
    )
    return {r["command_id"] for r in rows}


async def _tombstone(conn: Connection, firsts: list[Item], claimed: set[str]) -> None:
    """Writes the tombstones of the forward commands the claimed compensations undo, in
    record order relative to the claims (``_claimable`` left out the forward commands
    that come after their compensation in this run)."""
    for item in firsts:
        command = _cmd(item)
        forward_ids = [x for x in command.compensates.split(",") if x]
        if command.compensation and forward_ids and item.command_id_in(claimed):
            await conn.execute(
                TOMBSTONE, forward_ids, command.saga_id, command.step, TOMBSTONE_REPLY
            )


async def _stored(conn: Connection, duplicates: list[Item]) -> dict[str, str]:
    """The stored replies of the commands processed before, by command id."""
    if not duplicates:
        return {}
    rows = await conn.fetch(STORED_REPLIES, [_cmd(i).command_id for i in duplicates])
    return {r["command_id"]: r["reply"] for r in rows}


def _isolation(run: list[Item]) -> Isolation:
    """The run's isolation level: its handler's, for a command that runs alone."""
    handler = run[0].handler
    if len(run) == 1 and handler is not None:
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


def _claimable(firsts: list[Item]) -> list[Item]:
    """The items to claim: all but a forward command that a compensation earlier in the
    run tombstones (it must find the tombstone, as it would have one at a time)."""
    tombstoned: set[str] = set()
    out: list[Item] = []
    for item in firsts:
        command = _cmd(item)
        if command.command_id not in tombstoned:
            out.append(item)
        if command.compensation:
            tombstoned.update(x for x in command.compensates.split(",") if x)
    return out


def _cmd(item: Item) -> Envelope:
    assert item.command is not None
    return item.command


def _out(item: Item) -> Outgoing:
    assert item.outgoing is not None
    return item.outgoing
