"""The participant kit: idempotent command handlers for the services a saga calls.

A participant service consumes its command topic, applies each command exactly once in
its OWN Postgres database, and replies on the engine's inbox::

    from saga_engine import Settings
    from saga_engine.participant import Participant, Rejected, Retryable, Transaction

    payments = Participant("payments", settings)

    @payments.handles(ReserveCredit)
    async def reserve(cmd: ReserveCredit, tx: Transaction) -> CreditReserved:
        balance, audited = await tx.fetchrow(
            "SELECT balance, audited FROM accounts WHERE id = $1", cmd.account
        )
        if audited:  # for now: the engine asks again under a new attempt
            raise Retryable("account under audit", after=timedelta(minutes=1))
        if balance < cmd.amount:
            raise Rejected("insufficient credit", details={"balance": balance})
        await tx.execute("UPDATE accounts SET balance = balance - $2 WHERE id = $1", ...)
        return CreditReserved(reservation_id=tx.command_id)

    await payments.run()

What it guarantees, per command (matched to a handler by its ``ce_subject``, the command
model's class name):

- **Once.** The command id is recorded in ``saga_processed_commands`` in the same
  transaction as the handler's writes. A redelivered command is not applied again: it
  gets the stored reply, whatever instance receives it. By default a handler's effects
  are its writes in ``tx``, and the outcome's insert at the end of the transaction is
  the claim (no lock): a copy may run the handler in a transaction that is then rolled
  back, nothing of it kept, before the stored reply is sent. A handler that also acts
  outside ``tx`` (an HTTP call, a message) is registered with ``effects="outside"``: its
  commands are claimed with a lock before it runs, and a copy never runs it.
- **Refusals are answers.** ``Rejected`` rolls the handler's writes back (a savepoint)
  and stores a ``failure`` reply; the saga compensates.
- **"Not now" is an answer too.** ``Retryable(reason, after=...)`` rolls the handler's
  writes back and stores a ``retryable`` reply at once, without the in-process retries
  below: the engine retries the step under a new command id and attempt, after its
  retry policy's back-off, or ``after`` (a timedelta or seconds, carried as
  ``retry_after_s`` in the reply's payload) if that is longer.
- **Crashes are not answers.** Any other exception rolls everything back, the claim
  included, and the handler is retried with capped exponential backoff and jitter, up to
  ``settings.participant.handler_attempts``. Then the reply is ``retryable``: nothing was
  applied, and the answer is stored like the others, because the engine retries under a
  new command id and a late copy of this one must not apply anything.
- **Replies are never lost.** A reply is stored with the command id in the same
  transaction and published after COMMIT; Kafka offsets are committed only after that.
  If the process dies in between, the command comes again and gets the stored reply. A
  reply that cannot be published while the process lives goes to ``saga_reply_outbox``
  before its offset moves on, and a relay publishes it.
- **Bad input flows on.** A record that cannot be read (malformed JSON, wrong schema
  version, missing headers, oversized) goes to the dead-letter topic. A command whose
  body does not validate against the handler's model is dead-lettered *and* answered
  with a ``failure`` reply, so its saga compensates instead of waiting for a timeout. A
  command type with no handler gets a ``failure`` reply. An outage (Postgres or Kafka
  away) is retried until it ends; any other failure outside a handler (a bug, a broken
  table) dead-letters the record as ``engine_error`` (the contract's reason for "failed
  unexpectedly"; ``dlq_consumer`` names the participant) rather than stall the partition.
- **Batches.** What one fetch returns (every partition, up to 500 records) is one unit:
  one transaction on one connection for all of its commands (each handler still sees
  one command and one ``Transaction``), the replies sent together, one offset commit.
  A refusal in one handler rolls the batch back and runs it again with a savepoint per
  command, the refusal as given; a handler that raises splits the batch around it and
  is retried on its own. Either way its neighbours may run twice (their first writes
  rolled back). Records of one partition (one saga's commands) are processed in order.
  A single command is a batch of one: there is no other path. A handler registered with
  another ``isolation`` runs in a transaction of its own, with the same guarantees.
- **Batch handlers.** ``@payments.handles_batch(Model)`` registers
  ``async def handler(batch: CommandBatch[Model]) -> list[...]``: one call answers the
  commands of that type in a transaction (a :class:`CommandBatch` of
  :class:`BatchCommand`, with ``execute``/``fetch``/... as on ``Transaction``), so that
  set-wise statements replace a round trip per command. It returns one entry per
  command, in order: a reply payload, or a ``Rejected``/``Retryable`` *instance* that
  answers that command alone and means nothing was written for it (the others' writes
  commit). A wrong number of entries or an entry of another type counts as raising. A
  call for several commands that raises is made again for each command alone, and the
  one that raises alone is retried as above. A saga's commands are still applied in
  record order; duplicates and tombstoned commands are never applied (with
  ``effects="outside"``, they never reach the handler).

Inside, in the order a batch meets them: ``_kit`` (``Participant``: registration,
lifecycle, the consumer loop, rebalancing), ``_batch`` (the one path, from a fetched
batch to the offsets to commit), ``_reading`` (records to commands, dead letters),
``_transaction`` (a run of commands in one transaction), ``_groups`` (the groups of a batch
handler), ``_replies`` (the sends after
COMMIT, the outbox), ``_relay`` (the outbox relay); shared by them: ``_context`` (the
connections and common acts), ``_handler`` (``Transaction``, the replies decided) and
``_sql`` (reply records and statements).

An edge and a composition root of its own (its Postgres pool and its Kafka clients). May
import ``saga_engine.store``, ``saga_engine.transport`` and the layers below them;
never the runner.
"""

from saga_engine.kernel._errors import Rejected, Retryable
from saga_engine.participant._handler import BatchCommand, CommandBatch, HandlerResult, Transaction
from saga_engine.participant._kit import Participant

__all__ = [
    "BatchCommand",
    "CommandBatch",
    "HandlerResult",
    "Participant",
    "Rejected",
    "Retryable",
    "Transaction",
]
