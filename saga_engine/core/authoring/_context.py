"""``SagaContext``: the only door from a saga's code to the outside world.

Every method records what it does in the saga's history (or, on replay, is answered
from it). This class is the documented API; it asks a :class:`SagaDriver` (the runtime
that drives the saga, see ``_runtime``) for the rest. It sits below the definition (a
saga's ``run`` takes it) and the runtime (which implements the driver), so it knows
neither: a step is handed down as one :class:`StepRequest`, and a child saga is anything
shaped like a saga class (:class:`ChildSaga`).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar, Generic, Literal, NoReturn, Protocol, TypeVar, overload

import msgspec
from pydantic import BaseModel, ConfigDict, Field

from saga_engine.core.authoring._domain_events import EventSource, source_name
from saga_engine.core.authoring._signal import Signal
from saga_engine.core.authoring._update import name_of
from saga_engine.core.history._cost import Cost
from saga_engine.core.history._events import CallbackAwaited, CallbackReceived
from saga_engine.core.history._policy import RetryPolicy
from saga_engine.kernel._errors import CallbackFailed, CallbackTimeout, StepFailed
from saga_engine.kernel._serde import JsonDict

M = TypeVar("M", bound=BaseModel)
O = TypeVar("O", bound=BaseModel)  # noqa: E741
T = TypeVar("T")
O_co = TypeVar("O_co", covariant=True)

Duration = timedelta | float | int

#: How long ``http_step(..., completion="callback")`` waits for its service's call.
DEFAULT_CALLBACK_TIMEOUT = timedelta(days=1)

#: Steps addressed to "http:<endpoint>" are HTTP calls made by the engine itself.
HTTP_PREFIX = "http:"


class HttpRequest(BaseModel):
    """An HTTP call made by the engine for an HTTP step (or its compensation)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: str = "POST"
    path: str = Field(pattern=r"^/")
    body: JsonDict | None = None
    #: ``ctx.http_step(..., completion="callback")``: the URL the service POSTs its
    #: result to later, sent as the ``Saga-Callback-Url`` header (left out of the stored
    #: command when None, so the commands of HTTP steps recorded before it replay).
    callback_url: str | None = Field(default=None, exclude_if=lambda v: v is None)


#: A child is asked again (its start re-sent, same command id) this often by default: an
#: ended child answers a repeated start with its end. It covers the one window where an
#: end can be lost (its engine died after recording the end, before sending it).
DEFAULT_CHILD_POLL = timedelta(minutes=5)


class StepRequest(msgspec.Struct, frozen=True):
    """One step as its saga's code asked for it (``ctx.step``, ``ctx.http_step``, or a
    child's start): built once by the context, carried unchanged to the decision core."""

    name: str
    #: The participant (``http:<endpoint>`` for an HTTP step, the engine for a child).
    to: str
    command: BaseModel
    compensate: BaseModel | None = None
    retry: RetryPolicy | None = None
    #: Each attempt's timeout; None: an attempt waits for its reply as long as it takes.
    timeout: timedelta | None = None
    compensate_retry: RetryPolicy | None = None
    #: The reply's model: a success reply that does not match it is held for an operator.
    returns: type[BaseModel] | None = None
    #: A pivot step (Richardson): once it succeeded the saga only goes forward.
    pivot: bool = False
    #: Sent again this often while unanswered, under the same id, recording nothing (a
    #: child's start: ``ctx.child(poll=)``); None: sent again only when the saga is loaded.
    poll: timedelta | None = None
    #: The steps it depends on, as a graph saga declared them (``saga_engine.graph``):
    #: it is undone before them. None (a step of ``run``): the order the steps ran in
    #: says what depends on what.
    after: frozenset[str] | None = None
    #: What its command costs its participant while in flight (flow control's budgets):
    #: a ``Cost``, the name of a cost class (``LimitsSettings.cost_classes``), or None.
    cost: Cost | str | None = None


@dataclass(frozen=True, slots=True)
class Winner(Generic[T]):
    """What ``ctx.first`` returns: the keyword of the awaitable that finished first, and
    what it returned. Match on it::

        match await ctx.first(paid=..., cancelled=..., expired=ctx.sleep(...)):
            case Winner("paid", Payment() as payment): ...
            case Winner("cancelled"): ...
            case Winner("expired"): ...
    """

    name: str
    value: T


class Callback(Generic[T]):
    """A signed URL a third party calls, with no token, to complete one wait of this
    saga (``ctx.callback``): ``POST`` the body to :attr:`url`, or to :attr:`fail_url` to
    report a failure. ``await cb`` (or ``await cb.wait()``, which ``ctx.first`` races)
    returns the body as the model reads it; raises ``CallbackTimeout`` when its timeout
    passed first and ``CallbackFailed`` after a call of :attr:`fail_url`."""

    __slots__ = ("_driver", "_event", "_model", "context")

    def __init__(
        self, context: SagaContext, event: CallbackAwaited, model: type[BaseModel] | None
    ) -> None:
        #: The context that made it (``ctx.first`` races only its own saga's waits).
        self.context = context
        self._driver = context._driver
        self._event = event
        self._model = model

    @property
    def name(self) -> str:
        return self._event.name

    @property
    def wait_id(self) -> str:
        """The wait's id in the history (``callback:<name>:<n>``)."""
        return self._event.wait_id

    @property
    def expires_at(self) -> datetime:
        return self._event.expires_at

    @property
    def url(self) -> str:
        """The URL to POST the result to: signed, bound to this saga and this wait, single
        use, valid until :attr:`expires_at`. The same on every replay."""
        return self._driver.callback_url(self._event)

    @property
    def fail_url(self) -> str:
        """The URL to POST a failure to (``{"error": "..."}``): ``await`` raises
        ``CallbackFailed``."""
        return f"{self.url}/fail"

    async def wait(self) -> T:
        """The body the third party posted, as the model reads it (a dict without one)."""
        return self._read(await self._driver.op_wait_callback(self._event))

    def _read(self, received: CallbackReceived) -> T:
        """An answer's body as the model reads it (a dict without one)."""
        if self._model is None:
            return dict(received.payload)  # type: ignore[return-value]
        parsed: T = self._driver.parse(
            self._model, received.payload, f"callback {self._event.name!r}"
        )  # type: ignore[assignment]
        return parsed

    def __await__(self) -> Generator[Any, None, T]:
        return self.wait().__await__()

    def __repr__(self) -> str:
        return f"Callback({self._event.name!r}, wait_id={self._event.wait_id!r})"


async def _called_back(
    step: str, cb: Callback[T], answered: Coroutine[Any, Any, CallbackReceived]
) -> T:
    """The result an HTTP step's service posted to its callback URL (``answered``: the
    step, then its wait); its failure, or no call before the timeout, fails the step."""
    try:
        return cb._read(await answered)
    except CallbackFailed as exc:
        raise StepFailed(
            step, f"the service reported a failure: {exc.error}", details=exc.details
        ) from exc
    except CallbackTimeout as exc:
        raise StepFailed(step, str(exc)) from exc


class ChildSaga(Protocol[O_co]):
    """What ``ctx.child`` needs of a saga class: its name, models, and a ``run`` whose
    result is the child's output (so ``await ctx.child(Shipment, ...)`` is typed)."""

    name: ClassVar[str]
    input_type: ClassVar[type[BaseModel]]
    output_type: ClassVar[type[BaseModel]]

    def run(self, ctx: Any, input: Any, /) -> Coroutine[Any, Any, O_co]: ...


class SagaDriver(Protocol):
    """What a :class:`SagaContext` asks of the runtime driving its saga. Each operation
    runs in the saga's code, on its deterministic loop."""

    @property
    def saga_id(self) -> str: ...

    @property
    def now(self) -> datetime: ...

    @property
    def replaying(self) -> bool: ...

    def op_step(self, request: StepRequest) -> Coroutine[Any, Any, JsonDict]: ...

    def op_child(
        self,
        saga: type[ChildSaga[Any]],
        input: BaseModel | JsonDict,
        *,
        key: str | None,
        poll: timedelta | None,
        retry: RetryPolicy | None,
        pivot: bool = False,
    ) -> Coroutine[Any, Any, JsonDict]: ...

    def op_sleep(self, delay: timedelta) -> Coroutine[Any, Any, None]: ...

    def op_wait_signal(
        self, name: str, timeout: timedelta | None
    ) -> Coroutine[Any, Any, JsonDict]: ...

    def op_wait_event(
        self, source: str, key: Any, timeout: timedelta | None
    ) -> Coroutine[Any, Any, JsonDict]: ...

    def op_callback(
        self, name: str, model: type[BaseModel] | None, timeout: timedelta
    ) -> CallbackAwaited: ...

    def callback_url(self, event: CallbackAwaited) -> str: ...

    def op_wait_callback(self, event: CallbackAwaited) -> Coroutine[Any, Any, CallbackReceived]: ...

    def op_callback_step(
        self, request: StepRequest, event: CallbackAwaited
    ) -> Coroutine[Any, Any, CallbackReceived]: ...

    def op_side_effect(self, fn: Callable[[], T]) -> Coroutine[Any, Any, T]: ...

    def op_emit(self, topic: str, payload: Any) -> Coroutine[Any, Any, int]: ...

    def op_wait_update(self, name: str) -> Coroutine[Any, Any, Any]: ...

    def op_first(self, racers: Mapping[str, object]) -> Coroutine[Any, Any, Winner[Any]]: ...

    def op_timeout(self, delta: timedelta) -> AbstractAsyncContextManager[None]: ...

    def op_continue_as_new(
        self, state: BaseModel | JsonDict, carry: bool
    ) -> Coroutine[Any, Any, NoReturn]: ...

    def op_should_continue_as_new(self) -> bool: ...

    def op_patched(self, patch_id: str) -> bool: ...

    def op_skip_node(self, node: str) -> None: ...

    def parse(self, model: type[M], payload: JsonDict, what: str, step: str | None = None) -> M: ...

    def declared_signal(
        self, signal: Signal[Any] | str, model: type[BaseModel] | None
    ) -> Signal[Any]: ...

    def deterministic_uuid(self) -> uuid.UUID: ...

    def deterministic_random(self) -> float: ...


def as_timedelta(value: Duration | None, what: str) -> timedelta | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        result = value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        result = timedelta(seconds=value)
    else:
        raise TypeError(f"{what} must be a timedelta or a number of seconds, got {value!r}")
    if result <= timedelta(0):
        raise ValueError(f"{what} must be positive, got {result}")
    return result


class SagaContext:
    """Passed to ``Saga.run``. Use it for steps, timers, signals and anything random."""

    __slots__ = ("_driver",)

    def __init__(self, driver: SagaDriver) -> None:
        self._driver = driver

    def detach(self) -> None:
        """The saga's runtime closed: the context no longer holds it (no cycle)."""
        if hasattr(self, "_driver"):
            del self._driver

    @property
    def saga_id(self) -> str:
        return self._driver.saga_id

    @overload
    async def step(
        self,
        name: str,
        *,
        to: str,
        command: BaseModel,
        returns: type[M],
        compensate: BaseModel | None = None,
        retry: RetryPolicy | None = None,
        timeout: Duration | None = None,
        compensate_retry: RetryPolicy | None = None,
        pivot: bool = False,
        cost: Cost | str | None = None,
    ) -> M: ...

    @overload
    async def step(
        self,
        name: str,
        *,
        to: str,
        command: BaseModel,
        returns: None = None,
        compensate: BaseModel | None = None,
        retry: RetryPolicy | None = None,
        timeout: Duration | None = None,
        compensate_retry: RetryPolicy | None = None,
        pivot: bool = False,
        cost: Cost | str | None = None,
    ) -> JsonDict: ...

    async def step(
        self,
        name: str,
        *,
        to: str,
        command: BaseModel,
        returns: type[M] | None = None,
        compensate: BaseModel | None = None,
        retry: RetryPolicy | None = None,
        timeout: Duration | None = None,
        compensate_retry: RetryPolicy | None = None,
        pivot: bool = False,
        cost: Cost | str | None = None,
    ) -> M | JsonDict:
        """Sends ``command`` to participant ``to`` and waits for its reply.

        - ``name`` identifies the step within this saga run; it must be unique
          (use ``f"charge-{i}"`` in loops).
        - ``compensate`` is sent to the same participant, in reverse order with the
          other compensations, if the saga fails or is cancelled after this step was
          applied (or when its outcome is unknown because every attempt timed out).
        - ``retry`` governs re-sends after a per-attempt ``timeout`` (same command id,
          so the participant deduplicates) and after a retryable error reply.
        - ``returns`` parses the reply payload into a model; without it you get a dict.
          A success reply that does not match it is not accepted: it is kept in the
          history, the step waits, and the saga parks as ``step_stuck`` until an
          operator retries the step (after a fix) or skips it with a valid result. The
          engine never compensates because of a malformed reply.
        - ``pivot=True`` marks the saga's pivot (go/no-go) step: once it has succeeded
          the saga only goes forward. A cancel or forced compensation is refused ("past
          its pivot"), the deadline no longer applies, and a later step that cannot
          succeed parks the saga as step_stuck (whatever its retry policy says) instead
          of raising into the run. See docs/redrive-and-pivots.md.
        - ``cost`` is what the command holds of its participant's budget while in
          flight (``Cost(cpu=4)``, or a class named in ``LimitsSettings.cost_classes``):
          flow control sends it only while the costs in flight fit every budget of its
          gates (docs/operations.md, "Costs and budgets"). A cost above a whole budget
          fails the step before anything is sent. Its compensation costs nothing.

        Raises ``StepFailed`` when the participant refuses, and ``StepTimedOut`` when
        every attempt timed out (unless the step parks: ``RetryPolicy.on_exhausted``).
        """
        step = StepRequest(
            name,
            to,
            command,
            compensate=compensate,
            retry=retry,
            timeout=as_timedelta(timeout, "timeout"),
            compensate_retry=compensate_retry,
            returns=returns,
            pivot=pivot,
            cost=cost,
        )
        payload = await self._driver.op_step(step)
        if returns is None:
            return payload
        return self._driver.parse(returns, payload, f"the reply of step {name!r}", step=name)

    async def child(
        self,
        saga: type[ChildSaga[O]],
        input: BaseModel | JsonDict,
        *,
        id: str | None = None,
        poll: Duration | None = DEFAULT_CHILD_POLL,
        retry: RetryPolicy | None = None,
        pivot: bool = False,
    ) -> O:
        """Starts ``saga`` as a child of this saga and waits for its output.

        - The child's id derives from this saga's id and ``id`` (default: the child
          saga's name; give one per call when starting the same type twice), so a
          replay or a re-send never starts a second child. It may run on any engine.
        - The child's end answers the step: its output when it completed; when it
          failed, was compensated or cancelled, ``StepFailed`` is raised here, as for a
          refused step (the child undid itself, so nothing is owed).
        - When this saga compensates or is cancelled later, the child is undone, in this
          saga's last-in-first-out order, as one step: a completed child compensates its
          applied steps (it ends ``compensated``), a running one is cancelled.
        - ``poll``: while waiting, the child is asked again this often (its start is
          re-sent under the same command id; an ended child answers with its end). A
          poll records nothing: a parent waits for its child for as long as it runs
          without its history growing. The child also re-sends its end itself whenever
          it is loaded and after a send the broker refused, so the poll is a backstop
          (made while this saga is in memory; a saga loaded again sends what it owes).
          ``None``: asked again only when this saga is loaded. ``retry``: how often a
          start the engine answers "retryable" is sent anew (default 10,000 times).
        - ``pivot=True``: the child is this saga's pivot, as for ``ctx.step``; once it
          has completed this saga only goes forward. A child past its own pivot refuses
          its parent's undo (see docs/redrive-and-pivots.md): mark such a child as its
          parent's pivot, so that the parent goes forward too.
        """
        payload = await self._driver.op_child(
            saga, input, key=id, poll=as_timedelta(poll, "poll"), retry=retry, pivot=pivot
        )
        output: O = self._driver.parse(
            saga.output_type, payload, f"the output of child saga {saga.name!r}"
        )  # type: ignore[assignment]
        return output

    @overload
    async def http_step(
        self,
        name: str,
        *,
        endpoint: str,
        path: str,
        returns: type[M],
        method: str = "POST",
        json: JsonDict | None = None,
        compensate: HttpRequest | None = None,
        retry: RetryPolicy | None = None,
        timeout: Duration | None = None,
        pivot: bool = False,
        cost: Cost | str | None = None,
        completion: Literal["response", "callback"] = "response",
        callback_timeout: Duration = DEFAULT_CALLBACK_TIMEOUT,
    ) -> M: ...

    @overload
    async def http_step(
        self,
        name: str,
        *,
        endpoint: str,
        path: str,
        returns: None = None,
        method: str = "POST",
        json: JsonDict | None = None,
        compensate: HttpRequest | None = None,
        retry: RetryPolicy | None = None,
        timeout: Duration | None = None,
        pivot: bool = False,
        cost: Cost | str | None = None,
        completion: Literal["response", "callback"] = "response",
        callback_timeout: Duration = DEFAULT_CALLBACK_TIMEOUT,
    ) -> JsonDict: ...

    async def http_step(
        self,
        name: str,
        *,
        endpoint: str,
        path: str,
        returns: type[M] | None = None,
        method: str = "POST",
        json: JsonDict | None = None,
        compensate: HttpRequest | None = None,
        retry: RetryPolicy | None = None,
        timeout: Duration | None = None,
        pivot: bool = False,
        cost: Cost | str | None = None,
        completion: Literal["response", "callback"] = "response",
        callback_timeout: Duration = DEFAULT_CALLBACK_TIMEOUT,
    ) -> M | JsonDict:
        """A step that calls an HTTP service instead of sending a Kafka command.

        The engine calls ``{base URL of endpoint}{path}`` (base URLs come from settings,
        ``SAGA_HTTP__ENDPOINTS``) with an ``Idempotency-Key`` header equal to the step's
        command id — the same on every re-send — so the service can deduplicate. 2xx
        is success (the JSON body is the result); another 4xx fails the step
        (``StepFailed``); connection errors, 408, 429 and 5xx are retried with the same
        key until the attempt's ``timeout`` (default 30 s), then re-sent per ``retry``.
        It is recorded in the history like any step. ``pivot=True`` marks it as the
        saga's pivot, and ``cost`` its cost, as for ``ctx.step``.

        ``completion="callback"``: the service accepts the request now (a 2xx, typically
        202) and POSTs the result later to the URL sent in the ``Saga-Callback-Url``
        header (its failure to that URL + ``/fail``); the step returns that result,
        read by ``returns``. A failure posted, or no call within ``callback_timeout``
        (default a day), fails the step (``StepFailed``); the request was accepted, so
        its ``compensate`` is owed like any applied step's (docs/callbacks.md).
        """
        request = HttpRequest(method=method.upper(), path=path, body=json)
        cb: Callback[Any] | None = None
        if completion == "callback":
            # The wait first: it is recorded before the request that carries its URL.
            cb = self.callback(name, model=returns, timeout=callback_timeout)
            request = request.model_copy(update={"callback_url": cb.url})
        elif completion != "response":
            raise ValueError(f"completion must be 'response' or 'callback', not {completion!r}")
        step = StepRequest(
            name,
            f"{HTTP_PREFIX}{endpoint}",
            request,
            compensate=compensate,
            retry=retry,
            timeout=as_timedelta(timeout, "timeout") or timedelta(seconds=30),
            returns=None if cb is not None else returns,
            pivot=pivot,
            cost=cost,
        )
        if cb is not None:
            return await _called_back(name, cb, self._driver.op_callback_step(step, cb._event))
        payload = await self._driver.op_step(step)
        if returns is None:
            return payload
        return self._driver.parse(returns, payload, f"the response of step {name!r}", step=name)

    async def graph_step(self, request: StepRequest) -> Any:
        """A graph saga's node as a step, built by the graph (``saga_engine.graph``) with
        the steps it depends on in ``request.after``; its reply parsed by
        ``request.returns`` if it has one. Code written in ``run`` uses :meth:`step`."""
        payload = await self._driver.op_step(request)
        if request.returns is None:
            return payload
        what = f"the reply of step {request.name!r}"
        return self._driver.parse(request.returns, payload, what, step=request.name)

    def graph_skip(self, node: str) -> None:
        """Records that a graph saga's node did not run (its ``when`` was false)."""
        self._driver.op_skip_node(node)

    async def sleep(self, duration: Duration) -> None:
        """A durable timer: survives crashes and restarts."""
        delta = as_timedelta(duration, "sleep duration")
        assert delta is not None
        await self._driver.op_sleep(delta)

    @overload
    async def wait_signal(self, signal: Signal[M], *, timeout: Duration | None = None) -> M: ...

    @overload
    async def wait_signal(
        self, signal: str, model: type[M], *, timeout: Duration | None = None
    ) -> M: ...

    @overload
    async def wait_signal(
        self, signal: str, model: None = None, *, timeout: Duration | None = None
    ) -> JsonDict: ...

    async def wait_signal(
        self,
        signal: Signal[M] | str,
        model: type[M] | None = None,
        *,
        timeout: Duration | None = None,
    ) -> M | JsonDict:
        """Waits for a signal the saga declares (or takes one that already arrived).

        Pass the declared ``Signal`` (``self.approval``) to get its model back; a name
        with its model works too, and a name alone gives the payload as a dict. A signal
        the class does not declare raises DefinitionError: the engine refuses undeclared
        signals, so it could never arrive.

        Raises ``SignalTimeout`` when ``timeout`` passes first.
        """
        declared = self._driver.declared_signal(signal, model)
        payload = await self._driver.op_wait_signal(
            declared.name, as_timedelta(timeout, "signal timeout")
        )
        if model is None and isinstance(signal, str):
            return payload
        parsed: M = self._driver.parse(declared.model, payload, f"signal {declared.name!r}")
        return parsed

    async def wait_event(
        self,
        event: type[M] | EventSource[M],
        *,
        key: str | int | uuid.UUID,
        timeout: Duration | None = None,
    ) -> M:
        """Waits for another service's domain event: the first fact of ``event`` (an
        ``EventSource``, or its model) whose correlation key is ``key``. A fact that
        arrived before the wait is matched too, if its source still keeps it (its
        ``retention``). Recorded in history once; a fact answers a saga once.

        Raises ``EventTimeout`` when ``timeout`` passes first.
        """
        model = event.model if isinstance(event, EventSource) else event
        name = source_name(event)
        payload = await self._driver.op_wait_event(
            name, key, as_timedelta(timeout, "event timeout")
        )
        parsed: M = self._driver.parse(model, payload, f"event {name}")
        return parsed

    @overload
    def callback(self, name: str, *, model: type[M], timeout: Duration) -> Callback[M]: ...

    @overload
    def callback(
        self, name: str, *, model: None = None, timeout: Duration
    ) -> Callback[JsonDict]: ...

    def callback(
        self, name: str, *, model: type[BaseModel] | None = None, timeout: Duration
    ) -> Callback[Any]:
        """A URL a third party calls, with no token, to complete a wait (docs/callbacks.md)::

            cb = ctx.callback("kyc-verdict", model=Verdict, timeout=timedelta(days=2))
            await ctx.step("kyc", to="kyc", command=Check(callback_url=cb.url))
            verdict = await cb

        The wait is recorded here, before the code can read ``cb.url``, so the URL leaves
        the engine only once it can be answered. The URL is signed (``callbacks.keys``),
        bound to this saga and this wait, single use, and valid until ``timeout``
        passes (a durable timer: ``await cb`` raises ``CallbackTimeout``). A body its
        ``model`` refuses gets a 422 naming the field and changes nothing; the first
        valid body wins, the same body again gets the same answer, another one a 409.
        A call of ``cb.fail_url`` makes ``await cb`` raise ``CallbackFailed``.
        """
        delta = as_timedelta(timeout, "callback timeout")
        assert delta is not None
        event = self._driver.op_callback(name, model, delta)
        return Callback(self, event, model)

    async def wait_update(self, update: Any) -> Any:
        """Waits for the next call of one of this saga's ``@update`` methods (the method,
        ``Cart.checkout``, or its name) that its handler accepted and ran without raising,
        and returns the update's input (its model, or None for an update without one).
        Its handler has run by then: what it changed on the saga is there. Updates made
        before the wait are not kept (their effect is on the saga's state: look there
        first). Bound it with ``ctx.first`` or ``ctx.timeout``."""
        return await self._driver.op_wait_update(name_of(update))

    async def first(self, **racers: Awaitable[object]) -> Winner[object]:
        """Waits for the first of several ctx operations to finish, gives up the others,
        and returns which one won and its value (a :class:`Winner`)::

            won = await ctx.first(
                paid=ctx.wait_event(PaymentCaptured, key=order.id),
                cancelled=ctx.wait_signal(self.cancel),
                expired=ctx.sleep(timedelta(minutes=15)),
            )

        - Each racer is a ctx operation as you call it (``ctx.step``, ``ctx.http_step``,
          ``ctx.child``, ``ctx.sleep``, ``ctx.wait_signal``, ``ctx.wait_event``,
          ``ctx.wait_update``, or another ``ctx.first``); anything else is a definition
          error. To race several steps,
          race a child saga that runs them, or bound them with :meth:`timeout`.
        - The winner is the racer whose input comes first in the saga's history (a reply,
          a timer, a signal, a domain event), so a replay picks the same one. They are
          started in the order given, and one that can finish at once (a signal already
          buffered) wins before the later ones are even started.
        - The losers are given up before this returns: their waits end, and a step whose
          command was sent is compensated at once (it may have been applied), under its
          compensation's retry policy; a child saga is undone. A step never sent owes
          nothing. A loser's late reply is dropped.
        - A winner that raised (``StepFailed``, ``SignalTimeout``...) raises here, after
          the losers are given up.
        - ``value`` is typed ``object``: the racers' types differ, so match on its class
          (``case Winner("paid", Captured() as captured):``) or on the name alone.
        """
        return await self._driver.op_first(racers)

    def timeout(self, delta: Duration) -> AbstractAsyncContextManager[None]:
        """A durable deadline on a block of saga code::

            async with ctx.timeout(timedelta(minutes=15)):
                await ctx.step("reserve", ...)
                await ctx.wait_signal(self.confirmed)

        Its timer is recorded when the block begins. When it fires first, whatever the
        block waits on is given up, as a loser of :meth:`first` (a step whose command was
        sent is compensated at once), and ``SagaTimeout`` is raised where the block stood;
        catch it around the ``async with`` to take another path. A block that finishes
        first drops the timer. Nested scopes each raise for their own timer only: an
        inner scope's ``SagaTimeout`` passes through the outer one as any exception, and
        the outer one's firing gives up the inner block too.
        """
        delta_ = as_timedelta(delta, "ctx.timeout duration")
        assert delta_ is not None
        return self._driver.op_timeout(delta_)

    async def side_effect(self, fn: Callable[[], T]) -> T:
        """Runs a local, non-deterministic computation once and records its result.

        On replay the recorded value is returned and ``fn`` is not called. The value
        must be JSON-serializable (or a pydantic model, returned as a dict on replay).
        """
        return await self._driver.op_side_effect(fn)

    async def emit(self, topic: str, payload: BaseModel | Any) -> int:
        """Records a progress item on ``topic`` (e.g. ``"status"``) and returns its
        number: the saga's items are numbered from 1, with no gap, across topics::

            await ctx.emit("status", Status(stage="reserving"))

        The item is durable and visible once the decision that made it is committed
        (``GET /sagas/{id}/stream``, ``SagaClient.stream``); replay never records it
        again. ``payload`` is a pydantic model or a JSON value that can be stored, at
        most ``kafka.max_message_bytes`` as JSON (else the error is raised here and
        nothing is recorded). See docs/progress.md.
        """
        return await self._driver.op_emit(topic, payload)

    async def continue_as_new(
        self, state: BaseModel | JsonDict, *, carry_compensations: bool = True
    ) -> NoReturn:
        """Ends this run and starts the saga's next run, same saga id, with ``state`` as
        its input (checked by the saga's input model). Never returns: ``run`` starts
        again from the top with ``state``, and the history is read from here on (a saga
        that loops for years keeps its memory and replay time to one run)::

            if ctx.should_continue_as_new():
                await ctx.continue_as_new(Billing(period=period + 1))

        Signals, queries, updates, children's links, the idempotency key and the
        concurrency slot stay with the saga id. The compensations owed so far are carried
        into the next run and undone, if it unwinds, in the order one long run would
        have; ``carry_compensations=False`` drops them (an explicit commit point, like a
        pivot). Refused while steps, children, timers, waits, updates or other tasks are
        in flight: that parks the saga (``definition_error``) naming them. See
        docs/continue-as-new.md.
        """
        await self._driver.op_continue_as_new(state, carry_compensations)

    def should_continue_as_new(self) -> bool:
        """True once this run's history has ``engine.continue_as_new_after`` events (10,000
        by default): time to ``continue_as_new``."""
        return self._driver.op_should_continue_as_new()

    def now(self) -> datetime:
        """The saga's deterministic time: when the event being handled happened."""
        return self._driver.now

    def uuid(self) -> uuid.UUID:
        """A UUID that is the same on every replay."""
        return self._driver.deterministic_uuid()

    def random(self) -> float:
        """A float in [0, 1) that is the same on every replay."""
        return self._driver.deterministic_random()

    def patched(self, patch_id: str) -> bool:
        """Versioning: True for runs that reach this point with the new code.

        Histories recorded before the patch replay with False, so old sagas keep
        their old behaviour and new ones take the new path.
        """
        return self._driver.op_patched(patch_id)

    def is_replaying(self) -> bool:
        """True while the code is being re-run against recorded history (e.g. skip logs)."""
        return self._driver.replaying

    def __repr__(self) -> str:
        return f"SagaContext(saga_id={self.saga_id!r})"


#: The ctx operations ``ctx.first`` may race: the code of each, as a call's coroutine
#: carries it (``coroutine.cr_code``).
RACEABLE: dict[Any, str] = {
    method.__code__: f"ctx.{name}"
    for name, method in (
        ("step", SagaContext.step),
        ("http_step", SagaContext.http_step),
        ("child", SagaContext.child),
        ("sleep", SagaContext.sleep),
        ("wait_signal", SagaContext.wait_signal),
        ("wait_event", SagaContext.wait_event),
        ("wait_update", SagaContext.wait_update),
        ("first", SagaContext.first),
    )
}
RACEABLE[Callback.wait.__code__] = "a callback's wait()"
