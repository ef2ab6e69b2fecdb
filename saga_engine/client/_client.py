"""The code behind :mod:`saga_engine.client`, whose docstring says what it is for."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Collection, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar, overload

from aiokafka.errors import KafkaError
from pydantic import BaseModel, ValidationError

from saga_engine.core.authoring._definition import Saga, SagaDefinition, SagaRegistry, Signal
from saga_engine.core.authoring._domain_events import EventSource
from saga_engine.core.authoring._update import name_of
from saga_engine.core.history._codec import CodecChain, PayloadCodec
from saga_engine.core.history._events import RerunLink
from saga_engine.core.history._status import SagaStatus
from saga_engine.core.planning._batch_operations import BatchSpec, check_spec
from saga_engine.core.runtime._start import StartRequest
from saga_engine.kernel._errors import InvalidPayload, KafkaUnavailable
from saga_engine.kernel._serde import JsonDict, check_storable, dumps, model_payload
from saga_engine.kernel._settings import Settings
from saga_engine.runner._engine import CallbackAnswer
from saga_engine.store._batch_operation_store import BatchStore, count_matching
from saga_engine.store._progress import ProgressItem
from saga_engine.store._store import EventStore, SagaRecord
from saga_engine.telemetry._telemetry import carrier_of_context
from saga_engine.transport._kafka import SEND_TIMEOUT_S, ensure_topics, make_producer
from saga_engine.transport._topics import Topics
from saga_engine.transport._wire import (
    CancelBody,
    Envelope,
    MessageType,
    SignalBody,
    start_envelope,
)

__all__ = ["SagaClient"]

OutT = TypeVar("OutT", bound=BaseModel)


def _payload(value: BaseModel | dict[str, Any] | None) -> dict[str, Any]:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return dict(value or {})


class SagaClient:
    def __init__(
        self,
        settings: Settings,
        *,
        source: str = "/saga-client",
        producer: Any = None,
        store: EventStore | None = None,
        codec: PayloadCodec | CodecChain | None = None,
        admin_url: str | None = None,
        admin_token: str | None = None,
    ) -> None:
        """``producer``: an already started aiokafka producer to share (it stays the
        caller's to stop); without it the client starts its own. ``store``: the event
        store :meth:`result` reads (the caller's to close); without it the client
        connects to ``settings.pg`` the first time it needs one. ``codec``: seals what
        it sends and opens what it reads; by default the one ``settings.codec`` describes.
        ``admin_url`` and ``admin_token``: the engine's admin API that :meth:`update`,
        :meth:`retry_step` and :meth:`skip_step` call (by default where ``settings.admin``
        makes it listen, without a token; an operator's token names the principal)."""
        self.settings = settings
        self.codec = (
            CodecChain.of(codec) if codec is not None else CodecChain.from_settings(settings.codec)
        )
        self.topics = Topics.of(settings.kafka)
        self._source = source
        self._producer: Any = producer
        self._owns_producer = producer is None
        self._store: EventStore | None = store
        self._owns_store = store is None
        self._batches: BatchStore | None = None
        host = "127.0.0.1" if settings.admin.host in ("", "0.0.0.0", "::") else settings.admin.host
        self._admin_url = admin_url or f"http://{host}:{settings.admin.port}"
        self._admin_token = admin_token
        #: Event sources' topics created already (``publish_event``).
        self._source_topics: set[str] = set()

    async def start_client(self) -> None:
        await ensure_topics(self.settings.kafka, [self.topics.inbox, self.topics.dlq])
        if self._owns_producer:
            self._producer = make_producer(self.settings.kafka)
            await self._producer.start()

    async def close(self) -> None:
        if self._producer is not None and self._owns_producer:
            await self._producer.stop()
        self._producer = None
        if self._store is not None and self._owns_store:
            await self._store.close()
        self._store = None
        if self._batches is not None:
            await self._batches.close()
        self._batches = None

    async def __aenter__(self) -> SagaClient:
        await self.start_client()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _send(self, envelope: Envelope, refusal: str | None = None) -> None:
        """Publishes to the saga inbox (``_calls.publish``); first, for an action, raises
        what the saga's history says the engine would refuse (``_calls.refuse_early``)."""
        from saga_engine.client._calls import publish, refuse_early

        if refusal is not None:
            await refuse_early(self._result_store, envelope.saga_id, refusal)
        if self._producer is None:
            raise RuntimeError("SagaClient is not started: use `async with SagaClient(...)`")
        await publish(self._producer, self.topics.inbox, envelope, self.codec)

    async def start(
        self,
        saga: str | type[Saga[Any, Any]],
        input: BaseModel | dict[str, Any],
        *,
        idempotency_key: str | None = None,
        saga_id: str | None = None,
        deadline: timedelta | None = None,
        traceparent: str = "",
        priority: int = 0,
        fairness_key: str | None = None,
        rerun_of: RerunLink | None = None,
    ) -> str:
        """Asks the engines to start a saga; returns its id (derived from the key if given).

        The saga joins the trace of ``traceparent``, or else of the current span.
        ``priority`` (higher first) and ``fairness_key`` (a tenant: keys take turns)
        order its commands while a flow-control limit holds them back. ``rerun_of``
        links the saga to one it re-runs (what ``POST /sagas/{id}/rerun`` sends)."""
        trace = {"traceparent": traceparent} if traceparent else carrier_of_context()
        saga_type, payload = _checked_input(saga, input)
        if idempotency_key is not None:
            check_storable(idempotency_key, "the idempotency key")
        request = StartRequest(
            saga_type=saga_type,
            input=payload,
            saga_id=saga_id,
            idempotency_key=idempotency_key,
            deadline=deadline,
            trace_context=trace,
            priority=priority,
            fairness_key=fairness_key,
            rerun_of=rerun_of,
        ).with_saga_id()
        await self._send(start_envelope(request, source=self._source))
        assert request.saga_id is not None
        return request.saga_id

    async def rerun(
        self,
        saga_id: str,
        saga: type[Saga[Any, Any]],
        *,
        reason: str,
        input: BaseModel | dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        principal: str = "system",
    ) -> str:
        """Starts a new saga of ``saga_id``'s type (``saga``: its class) with its input or
        ``input``, linked to it (``rerun_of``, with ``principal`` and ``reason``), as
        ``POST /sagas/{id}/rerun`` does; returns the new saga's id. Without a key, the
        same original and input start one saga. It reads the original's start in Postgres
        (the settings' ``pg``); InvalidTransition if ``saga`` is not its type."""
        from saga_engine.core.history._events import SagaStarted
        from saga_engine.core.runtime._start import rerun_key
        from saga_engine.kernel._errors import InvalidTransition

        store = await self._result_store()
        started = (await store.first_event(saga_id)).event
        definition = SagaDefinition.of(saga)
        if not isinstance(started, SagaStarted) or started.saga_type != definition.name:
            kind = started.saga_type if isinstance(started, SagaStarted) else "?"
            raise InvalidTransition(
                f"saga {saga_id} is a {kind!r} saga, not a {definition.name!r} one"
            )
        _, payload = _checked_input(saga, started.input if input is None else input)
        check_storable({"reason": reason, "principal": principal}, "the rerun")
        key = idempotency_key or rerun_key(
            saga_id, model_payload(definition.validate_input(payload))
        )
        link = RerunLink(saga_id=saga_id, principal=principal, reason=reason)
        return await self.start(saga, payload, idempotency_key=key, rerun_of=link)

    async def signal(
        self,
        saga_id: str,
        signal: Signal[Any] | str,
        payload: BaseModel | dict[str, Any] | None = None,
        *,
        saga: type[Saga[Any, Any]] | None = None,
        signal_id: str | None = None,
        principal: str = "system",
        reason: str = "",
    ) -> str:
        """Sends a signal; the same ``signal_id`` twice is delivered once. ``principal``
        and ``reason`` are recorded with it in the saga's history. Returns its id once the
        inbox holds it; refused at once and OutcomeUnknown as for :meth:`cancel`.

        ``signal`` is the saga's declared ``Signal`` (``PlaceOrder.approval``): the payload
        is checked against its model before it is sent. A name works too; with ``saga=``
        it is checked against that saga's declarations, without it only by the engine.
        """
        data = _payload(payload)
        if isinstance(signal, str) and saga is not None:
            signal = SagaDefinition.of(saga).signal(signal)
        if isinstance(signal, Signal):
            name = signal.name
            signal.validate(data, "payload")  # the storable check included
        else:
            name = signal
            check_storable(data, f"signal {name!r}", "payload")
        check_storable({"name": name, "reason": reason, "principal": principal}, f"signal {name!r}")
        sid = signal_id or str(uuid.uuid4())
        body = SignalBody(
            name=name,
            signal_id=sid,
            payload=data,
            principal=principal,
            reason=reason,
        )
        await self._send(
            Envelope(
                message_type=MessageType.SIGNAL,
                source=self._source,
                subject=name,
                saga_id=saga_id,
                correlation_id=saga_id,
                # Optional fields only when set: an engine older than them still reads it.
                body=body.model_dump(mode="json", exclude_defaults=True),
            ),
            refusal="signal",
        )
        return sid

    async def publish_event(
        self, source: EventSource[Any], event: BaseModel, *, event_id: str | None = None
    ) -> str:
        """Publishes a domain event on ``source``'s topic, as the service that owns the
        fact would: the sagas that wait for its key (``ctx.wait_event``) get it once.
        ``event_id`` (a new uuid by default) goes in the ``ce_id`` header: the same id
        twice is kept once. Returns it."""
        if not isinstance(event, source.model):
            raise TypeError(f"{source.name} events are {source.model.__name__}, not {event!r}")
        if self._producer is None:
            raise RuntimeError("SagaClient is not started: use `async with SagaClient(...)`")
        key = source.key_of(event)
        payload = event.model_dump(mode="json")
        check_storable(payload, f"event {source.name}")
        eid = event_id or str(uuid.uuid4())
        if source.topic not in self._source_topics:
            await ensure_topics(self.settings.kafka, [source.topic])
            self._source_topics.add(source.topic)
        try:
            async with asyncio.timeout(SEND_TIMEOUT_S):
                await self._producer.send_and_wait(
                    source.topic,
                    dumps(payload),
                    key=key.encode(),  # a key's facts in order
                    headers=[("ce_id", eid.encode())],
                )
        except (TimeoutError, KafkaError) as exc:
            raise KafkaUnavailable(f"could not publish to {source.topic}: {exc!r}") from exc
        return eid

    async def cancel(self, saga_id: str, reason: str, *, principal: str = "system") -> None:
        """Asks the saga's engine to cancel it; returns once the inbox holds it. Refused
        at once when the saga's history says the engine would (``_calls.refuse_early``:
        InvalidTransition, PastPivot); OutcomeUnknown if the broker took it unacknowledged."""
        body = CancelBody(reason=reason, principal=principal)
        await self._send(
            Envelope(
                message_type=MessageType.CANCEL,
                source=self._source,
                saga_id=saga_id,
                correlation_id=saga_id,
                body=body.model_dump(mode="json"),
            ),
            refusal="cancel",
        )

    # ------------------------------------------------------------------ operator actions

    async def retry_step(
        self,
        saga_id: str,
        step: str,
        *,
        command: BaseModel | dict[str, Any] | None = None,
        reason: str,
    ) -> SagaStatus:
        """Retries a step through the engine's admin API, as ``saga retry`` does; a parked
        one with an edited ``command`` if given (InvalidPayload if its model refuses it,
        nothing recorded). The saga's status after it; SagaNotFound, InvalidTransition."""
        return await self._step_action(saga_id, "retry", step, reason, command=command)

    async def skip_step(
        self,
        saga_id: str,
        step: str,
        result: BaseModel | dict[str, Any] | None,
        *,
        reason: str,
    ) -> SagaStatus:
        """Skips a step through the engine's admin API, as ``saga skip`` does: it goes on
        with ``result`` (checked against its ``returns=`` model), or a stuck compensation
        is done by hand (``result`` None). Returns and raises like :meth:`retry_step`."""
        return await self._step_action(saga_id, "skip", step, reason, result=result)

    async def _step_action(
        self, saga_id: str, action: str, step: str, reason: str, **given: Any
    ) -> SagaStatus:
        from saga_engine.client._calls import post_action

        body: dict[str, Any] = {"step": step, "reason": reason}
        body.update({name: _payload(v) for name, v in given.items() if v is not None})
        return await post_action(
            self._admin_url, self._admin_token, saga_id, action, body, f"{action} of {step!r}"
        )

    # ------------------------------------------------------------------ callbacks

    async def complete_callback(
        self, url: str, body: BaseModel | dict[str, Any] | None = None
    ) -> CallbackAnswer:
        """Completes a saga's callback wait (``ctx.callback``, or an HTTP step completed
        by callback) with ``body``, as its third party's ``POST`` to the URL would, for a
        party that has the URL (``cb.url``) or its token: the call goes to this client's
        admin API (``POST /callbacks/{token}``; no operator token, the URL's is the
        credential). Returns what it completed; the same body again gets the same answer.
        Raises, with nothing recorded: CallbackTokenInvalid (a URL this deployment did not
        sign), CallbackGone (expired, the wait over), CallbackConflict (answered already
        with another body), InvalidPayload (the wait's model refuses it, naming each field),
        TransientError (the engine cannot record it now: call again)."""
        from saga_engine.client._calls import callback_token, post_callback

        token = callback_token(url)
        return await post_callback(self._admin_url, token, _payload(body), failed=False)

    async def fail_callback(
        self, url: str, error: str, details: dict[str, Any] | None = None
    ) -> CallbackAnswer:
        """Fails a saga's callback wait (``await cb`` raises ``CallbackFailed`` with
        ``error`` and ``details``; an HTTP step completed by callback fails with
        ``StepFailed``), as a ``POST`` to its ``/fail`` URL would. ``url``: the wait's URL,
        its fail URL or its token. Returns and raises as :meth:`complete_callback`."""
        from saga_engine.client._calls import callback_token, post_callback

        if not isinstance(error, str) or not error.strip():
            raise InvalidPayload(
                "the callback's failure",
                [{"loc": ["error"], "msg": "a failure needs its reason", "type": "missing"}],
            )
        body = {**(details or {}), "error": error}
        return await post_callback(self._admin_url, callback_token(url), body, failed=True)

    # ------------------------------------------------------------------ updates, queries

    async def update(
        self,
        saga_id: str,
        update: Any,
        input: BaseModel | dict[str, Any] | None = None,
        *,
        saga: type[Saga[Any, Any]] | None = None,
        update_id: str | None = None,
        reason: str = "",
        timeout: float = 30.0,  # noqa: ASYNC109
    ) -> Any:
        """Calls the saga's update (the method, ``Order.add_item``, or its name with
        ``saga=``) through the engine's admin API and returns its result. The input is
        checked against the update's model first. The same ``update_id`` twice is applied
        once and answered the same. Raises UpdateRefused (the saga's state refuses it:
        nothing recorded), InvalidPayload, SagaNotFound, InvalidTransition (it ended), or
        UpdateFailed (recorded; its handler raised)."""
        from saga_engine.client._calls import checked_update, post_update, saga_class

        name = name_of(update)
        data = _payload(input)
        checked_update(saga_class(update, saga, "update"), name, data)
        body: dict[str, Any] = {
            "input": data,
            "reason": reason,
            "update_id": update_id or str(uuid.uuid4()),
        }
        return await post_update(self._admin_url, self._admin_token, saga_id, name, body, timeout)

    async def query(
        self,
        saga_id: str,
        query: Any,
        args: BaseModel | dict[str, Any] | None = None,
        *,
        saga: type[Saga[Any, Any]] | None = None,
    ) -> Any:
        """Asks the saga's query (the method, ``Order.summary``, or its name with
        ``saga=``): the saga's history is read from the store and replayed here, and the
        replayed state answers. Nothing is written; no engine is involved."""
        from saga_engine.client._calls import replayed_query, saga_class

        store = await self._result_store()
        cls = saga_class(query, saga, "query")
        return await replayed_query(store, cls, saga_id, name_of(query), _payload(args))

    def stream(
        self,
        saga_id: str,
        *,
        after: int = 0,
        topics: Collection[str] | None = None,
        reconnect_delay: float = 0.5,
        max_reconnects: int = 20,
    ) -> AsyncIterator[ProgressItem]:
        """The saga's progress items (``ctx.emit``) numbered above ``after``, as they are
        committed, until the saga ends::

            async for item in client.stream(saga_id, topics=["status"]):
                print(item.number, item.topic, item.payload)

        Read from the engine's admin API (``GET /sagas/{id}/stream``; a reader's token is
        enough). A dropped connection is reconnected after the last item yielded, so each
        item comes once, in order; ``max_reconnects`` failures in a row raise
        TransientError. SagaNotFound for an unknown saga. See docs/progress.md."""
        from saga_engine.client._stream import stream_items

        return stream_items(
            self._admin_url,
            self._admin_token,
            saga_id,
            after=after,
            topics=topics,
            reconnect_delay=reconnect_delay,
            max_reconnects=max_reconnects,
        )

    # ------------------------------------------------------------------ results

    @overload
    async def result(
        self,
        saga_id: str,
        *,
        timeout: float | timedelta | None = None,  # noqa: ASYNC109
        saga: None = None,
    ) -> JsonDict: ...

    @overload
    async def result(
        self,
        saga_id: str,
        *,
        timeout: float | timedelta | None = None,  # noqa: ASYNC109
        saga: type[Saga[Any, OutT]],
    ) -> OutT: ...

    async def result(
        self,
        saga_id: str,
        *,
        # A timeout argument, not asyncio.timeout around the call: the wait polls the
        # store, and the timeout is part of its answer (ResultTimeout with the status).
        timeout: float | timedelta | None = None,  # noqa: ASYNC109
        saga: type[Saga[Any, Any]] | None = None,
    ) -> Any:
        """Waits for the saga to end and returns its output: the output model's instance
        when ``saga`` (its class) is given, else its JSON.

        Raises :class:`SagaUnsuccessful` when it ended failed, compensated or cancelled
        (``status`` and the recorded ``error`` on it), and :class:`ResultTimeout` when
        ``timeout`` (seconds or a timedelta; None waits for ever) passes first, including
        while a start sent a moment ago has not reached its engine yet.

        It reads the saga's record in Postgres (the settings' ``pg``), polling with
        back-off from 20 ms to 1 s: any process with the database's address can wait,
        not only the engine that owns the saga.
        """
        from saga_engine.core.history._events import SagaCompleted
        from saga_engine.kernel._errors import ResultTimeout, SagaNotFound, SagaUnsuccessful
        from saga_engine.kernel._retry import POLL

        store = await self._result_store()
        limit = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        loop = asyncio.get_running_loop()
        deadline = None if limit is None else loop.time() + limit
        backoff = POLL.backoff()
        while True:
            try:
                record: SagaRecord | None = await store.get(saga_id)
            except SagaNotFound:
                record = None  # its start may still be on its way
            if record is not None and record.status.is_terminal:
                break
            delay = backoff.next_delay()
            if deadline is not None:
                left = deadline - loop.time()
                if left <= 0:
                    status = record.status.value if record is not None else None
                    raise ResultTimeout(saga_id, limit or 0.0, status)
                delay = min(delay, left)
            await asyncio.sleep(delay)
        if record.status != SagaStatus.COMPLETED:
            raise SagaUnsuccessful(saga_id, record.status.value, record.error)
        loaded = await store.load_run(saga_id)
        ended = loaded.events[-1].event
        output = ended.output if isinstance(ended, SagaCompleted) else {}
        if saga is None:
            return output
        return SagaDefinition.of(saga).output_type.model_validate(output)

    async def concurrency_slots(
        self, saga: str | type[Saga[Any, Any]], key: str | None = None
    ) -> list[JsonDict]:
        """Per-key concurrency (``Saga.concurrency``) of a saga type, read from Postgres
        like ``result``: per key, the sagas holding a slot, then those queued for one in
        FIFO order, each as ``{"saga_id", "key", "held", "position", "limit",
        "queued_at", "acquired_at"}`` (``position``: 1 is next; 0 when held)."""
        from saga_engine.store._keyslots import KeySlotStore, with_positions

        name = saga if isinstance(saga, str) else SagaDefinition.of(saga).name
        store = await self._result_store()
        if not isinstance(store, KeySlotStore):
            return []
        return [
            {
                "saga_id": slot.saga_id,
                "key": slot.key,
                "held": slot.held,
                "position": position,
                "limit": slot.limit,
                "queued_at": slot.queued_at,
                "acquired_at": slot.acquired_at,
            }
            for slot, position in with_positions(await store.key_slots(name, key))
        ]

    async def _result_store(self) -> EventStore:
        if self._store is None:
            from saga_engine.store._connect import connect_event_store

            # A small pool: a client waits on results, it does not drive sagas.
            pg = self.settings.pg.model_copy(update={"pool_min_size": 1, "pool_max_size": 2})
            self._store = await connect_event_store(self.settings, pg=pg, codec=self.codec)
        return self._store

    # ------------------------------------------------------------------ batch operations

    async def start_batch(
        self,
        saga: type[Saga[Any, Any]],
        action: str,
        *,
        reason: str,
        where: Mapping[str, Any] | None = None,
        signal: str | None = None,
        payload: BaseModel | dict[str, Any] | None = None,
        principal: str = "system",
    ) -> str:
        """Starts a batch operation on the sagas of type ``saga`` that ``where`` matches
        (the saga list's filters: ``statuses``, ``attributes``, ``q``, ``created_after``...)
        and returns its id; the engines run it (docs/batch-operations.md). ``action``:
        cancel, signal (``signal`` and ``payload``, checked against the declared signal),
        retry, resume or rerun (a new saga, linked to each, as :meth:`rerun` starts). Bad
        input raises InvalidPayload and records nothing."""
        spec = _batch_spec(saga, action, reason, where, signal, payload)
        check_spec(spec, SagaRegistry([saga]))
        total, _ = await count_matching(await self._result_store(), spec.filter)
        store = await self._batch_store()
        row = await store.create(str(uuid.uuid4()), spec, principal, total, datetime.now(UTC))
        return row.operation_id

    async def count_batch(
        self, saga: type[Saga[Any, Any]], where: Mapping[str, Any] | None = None
    ) -> int:
        """How many sagas a batch operation on ``saga`` with ``where`` would act on now."""
        spec = _batch_spec(saga, "cancel", "count", where, None, None)
        check_spec(spec, SagaRegistry([saga]))
        total, _ = await count_matching(await self._result_store(), spec.filter)
        return total

    async def batch(self, operation_id: str) -> JsonDict:
        """The operation and its progress, as ``GET /batch-operations/{id}`` shows it."""
        return (await (await self._batch_store()).get(operation_id)).as_json()

    async def cancel_batch(self, operation_id: str) -> JsonDict:
        """Stops the operation at its next saga (InvalidTransition once it has ended)."""
        store = await self._batch_store()
        return (await store.cancel(operation_id, datetime.now(UTC))).as_json()

    async def wait_batch(
        self,
        operation_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> JsonDict:
        """Waits until the operation has ended (completed or cancelled) and returns it;
        TimeoutError (the builtin) if ``timeout`` seconds pass first."""
        from saga_engine.kernel._retry import POLL

        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        backoff = POLL.backoff()
        while True:
            row = await self.batch(operation_id)
            if row["state"] != "running":
                return row
            delay = backoff.next_delay()
            if deadline is not None:
                if loop.time() >= deadline:
                    raise TimeoutError(f"batch operation {operation_id} still runs: {row}")
                delay = min(delay, deadline - loop.time())
            await asyncio.sleep(delay)

    async def _batch_store(self) -> BatchStore:
        if self._batches is None:
            from saga_engine.store._pgbatch_operations import PostgresBatchStore

            self._batches = await PostgresBatchStore.connect(self.settings.pg.control())
        return self._batches


def _batch_spec(
    saga: type[Saga[Any, Any]],
    action: str,
    reason: str,
    where: Mapping[str, Any] | None,
    signal: str | None,
    payload: BaseModel | dict[str, Any] | None,
) -> BatchSpec:
    """The operation's spec for ``saga``'s type; InvalidPayload naming a wrong field."""
    try:
        return BatchSpec.model_validate(
            {
                "filter": {**(where or {}), "saga_type": SagaDefinition.of(saga).name},
                "action": action,
                "reason": reason,
                "signal": signal,
                "payload": _payload(payload),
            }
        )
    except ValidationError as exc:
        raise InvalidPayload(
            "batch operation",
            [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()],
        ) from None


def _checked_input(
    saga: str | type[Saga[Any, Any]], input: BaseModel | dict[str, Any]
) -> tuple[str, JsonDict]:
    """The saga type and the input as it is sent, checked as far as this process can: a
    class's input model validates it, a type name's input must be storable."""
    # The fields the caller set (the engine fills in the defaults once): a retry that
    # rebuilds the model with a fresh default_factory value is the same request.
    payload = (
        input.model_dump(mode="json", by_alias=True, exclude_unset=True)
        if isinstance(input, BaseModel)
        else dict(input)
    )
    if isinstance(saga, str):
        check_storable(payload, f"input of saga {saga!r}")
        return saga, payload
    definition = SagaDefinition.of(saga)
    definition.validate_input(payload)
    return definition.name, payload
