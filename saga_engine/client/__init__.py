"""Start, signal and cancel sagas from any process, through the saga inbox on Kafka.

::

    async with SagaClient(settings) as client:
        saga_id = await client.start("checkout", {"customer": "c-1"}, idempotency_key="order-42")
        await client.signal(saga_id, "approval", {"approved": True})

Starting twice with the same idempotency key yields the same saga id, and the engine
that owns it starts it once.

What the client can check, it checks before sending, and raises InvalidPayload (or
UnstorableValue) naming the wrong field: a start's input when given the saga class, and
a signal's payload when given the declared ``Signal`` (``PlaceOrder.approval``) or the
saga class. What it cannot know (a signal named only by a string) the engine checks: a
bad one is dead-lettered (``invalid_signal``) and the saga is untouched. A signal or a
cancel the saga's history says the engine would refuse (the saga ended, is undoing its
steps, or is past its pivot) is refused before it is sent (InvalidTransition, PastPivot;
the client reads the store); one the broker took without acknowledging it raises
OutcomeUnknown. Use the admin API (or ``saga signal``) to get the engine's answer back
synchronously, once it is recorded.

An operator's actions: ``cancel`` and ``rerun`` go over Kafka; ``retry_step(saga_id,
step, command=..., reason=...)`` (a parked step, with an edited command if given) and
``skip_step(saga_id, step, result, reason=...)`` call an engine's admin API like
``update`` (the client's ``admin_url`` and an operator's ``admin_token``), since only the
engine knows the step's models: a command or result they refuse raises InvalidPayload
and nothing is recorded (docs/redrive-and-pivots.md).

``publish_event(source, event)`` publishes a domain event on an ``EventSource``'s topic,
as the service that owns the fact would: the sagas waiting for its key
(``ctx.wait_event``) get it once (docs/domain-events.md).

Batch operations (docs/batch-operations.md) are rows in Postgres that the engines run:
``start_batch(Shipment, "cancel", reason=..., where={"statuses": ["running"]})`` checks
and records one and returns its id; ``count_batch``, ``batch``, ``wait_batch`` and
``cancel_batch`` count, read, wait for and stop them.

``stream(saga_id, after=..., topics=...)`` follows a saga's progress items
(``ctx.emit``) as they are committed, each a ``ProgressItem``, through the admin API's
stream; it reconnects and resumes after a dropped connection (docs/progress.md).

``complete_callback(url, body)`` and ``fail_callback(url, error)`` answer a saga's
callback wait (``ctx.callback``, or an HTTP step completed by callback) by its URL or
token, through the admin API's callback route, for a trusted party of your own that
holds the URL (docs/callbacks.md); each returns a ``CallbackAnswer``.

An edge: it composes the store (to read results) and the Kafka transport. May import
``saga_engine.runner`` and every layer below it.
"""

from saga_engine.client._client import SagaClient
from saga_engine.runner._engine import CallbackAnswer
from saga_engine.store._progress import ProgressItem

__all__ = ["CallbackAnswer", "ProgressItem", "SagaClient"]
