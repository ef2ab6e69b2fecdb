"""Updates and queries a saga class declares: request-response calls into a running saga.

Below the definition and the runtime: a saga class marks methods with :func:`update` and
:func:`query`; the runtime finds them here (:func:`updates_of`, :func:`queries_of`).

- An **update** is validated before anything is recorded (its input model, then its
  validator, which sees the saga's replayed state and may refuse), recorded as an input
  (``update_received``), run on the saga's state in order with the saga's other inputs,
  and its result recorded (``update_completed``): a replay runs it again, so its effect on
  the saga's state replays too.
- A **query** reads the saga's replayed state and writes nothing.

Handlers are plain methods (``def``, not ``async def``): they run between two inputs, on
the saga object the saga's ``run`` works on, and cannot await steps or timers.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Generic, TypeVar, overload

from pydantic import BaseModel

from saga_engine.core.authoring._signal import NAME
from saga_engine.kernel._errors import (
    DefinitionError,
    InvalidPayload,
    QueryFailed,
    SerializationError,
    UpdateRefused,
)
from saga_engine.kernel._serde import check_storable, dumps, validate_payload

F = TypeVar("F", bound=Callable[..., Any])
#: A validator returns None (accepted) or a reason (refused), or raises UpdateRefused.
V = TypeVar("V", bound=Callable[..., Any])


class _Handler(Generic[F]):
    """A method marked as an update or a query: its name, input model and function."""

    kind = "handler"

    def __init__(self, fn: F, model: type[BaseModel] | None, name: str | None) -> None:
        if inspect.iscoroutinefunction(fn):
            raise DefinitionError(
                f"{fn.__qualname__}: an {self.kind} handler is a plain `def` (it runs between "
                "two inputs on the saga's state and cannot await steps or timers)"
            )
        if model is not None and not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise DefinitionError(
                f"{fn.__qualname__}: @{self.kind} takes the input's pydantic model class, "
                f"not {model!r}"
            )
        self.fn = fn
        self.model = model
        self.name = name or fn.__name__
        #: The saga class that declares it (set when the class is created).
        self.owner: type | None = None
        if not NAME.match(self.name):
            raise DefinitionError(
                f"{fn.__qualname__}: an {self.kind}'s name must be letters, digits, '.', '_' "
                "or '-' starting with a letter or digit"
            )

    def __set_name__(self, owner: type, attribute: str) -> None:
        self.owner = owner

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        # On an instance: the plain bound method (a test may call it directly).
        return self if obj is None else self.fn.__get__(obj, owner)

    def parse(self, payload: Any, *loc: str | int) -> BaseModel | None:
        """The input as the handler takes it; InvalidPayload naming each wrong field."""
        what = f"{self.kind} {self.name!r}"
        check_storable(payload, what, *loc)
        if self.model is None:
            if payload:
                raise InvalidPayload(
                    what,
                    [{"loc": list(loc), "msg": f"{what} takes no input", "type": "extra"}],
                )
            return None
        return validate_payload(self.model, payload, what, *loc)

    def call(self, saga: Any, value: BaseModel | None) -> Any:
        return self.fn(saga) if self.model is None else self.fn(saga, value)


class UpdateHandler(_Handler[F]):
    """An ``@update`` method (see :func:`update`)."""

    kind = "update"

    def __init__(self, fn: F, model: type[BaseModel] | None, name: str | None) -> None:
        super().__init__(fn, model, name)
        self.check: Callable[..., Any] | None = None

    def validator(self, fn: V) -> V:
        """Marks the method that accepts or refuses this update from the saga's state:
        it returns a reason to refuse (or raises ``UpdateRefused``), None to accept."""
        self.check = fn
        return fn

    def refusal(self, saga: Any, value: BaseModel | None) -> str | None:
        """Why the saga's state refuses this update now, or None."""
        if self.check is None:
            return None
        try:
            reason = self.check(saga) if self.model is None else self.check(saga, value)
        except UpdateRefused as refused:
            return refused.reason
        return None if reason is None else str(reason)


class QueryHandler(_Handler[F]):
    """A ``@query`` method (see :func:`query`)."""

    kind = "query"


@overload
def update(
    model: type[BaseModel] | None = None, /, *, name: str | None = None
) -> Callable[[F], UpdateHandler[F]]: ...
@overload
def update(model: F, /) -> UpdateHandler[F]: ...
def update(model: Any = None, /, *, name: str | None = None) -> Any:
    """Marks a saga method as an update: ``@update(AddItem)`` (its input model) or
    ``@update`` (no input). It returns the update's result (a pydantic model, or any JSON
    value) and may change the saga object's attributes, which its ``run`` reads::

        class Order(Saga[OrderIn, OrderOut]):
            @update(AddItem)
            def add_item(self, item: AddItem) -> Added:
                self.items.append(item.sku)
                return Added(count=len(self.items))

            @add_item.validator
            def _check_add(self, item: AddItem) -> str | None:
                return "the order is closed" if self.closed else None
    """
    if callable(model) and not isinstance(model, type):
        return UpdateHandler(model, None, name)
    return lambda fn: UpdateHandler(fn, model, name)


@overload
def query(
    model: type[BaseModel] | None = None, /, *, name: str | None = None
) -> Callable[[F], QueryHandler[F]]: ...
@overload
def query(model: F, /) -> QueryHandler[F]: ...
def query(model: Any = None, /, *, name: str | None = None) -> Any:
    """Marks a saga method as a read-only query: ``@query`` (no arguments) or
    ``@query(Args)`` (its arguments' model). Answered from the saga's replayed state;
    nothing is written. It must not change the saga object."""
    if callable(model) and not isinstance(model, type):
        return QueryHandler(model, None, name)
    return lambda fn: QueryHandler(fn, model, name)


def _collect(cls: type, kind: type[_Handler[Any]]) -> Mapping[str, Any]:
    found: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        for value in vars(klass).values():
            if isinstance(value, kind):
                found[value.name] = value
    return MappingProxyType(found)


def updates_of(cls: type) -> Mapping[str, UpdateHandler[Any]]:
    """The updates a saga class declares, by name."""
    cached = cls.__dict__.get("__saga_updates__")
    if cached is None:
        cached = _collect(cls, UpdateHandler)
        type.__setattr__(cls, "__saga_updates__", cached)
    return cached


def queries_of(cls: type) -> Mapping[str, QueryHandler[Any]]:
    """The queries a saga class declares, by name."""
    cached = cls.__dict__.get("__saga_queries__")
    if cached is None:
        cached = _collect(cls, QueryHandler)
        type.__setattr__(cls, "__saga_queries__", cached)
    return cached


def declared(cls: type, kind: str, name: str) -> _Handler[Any]:
    """The update or query ``name`` of ``cls``; InvalidPayload (the field ``name``) if the
    class declares none."""
    table: Mapping[str, _Handler[Any]] = updates_of(cls) if kind == "update" else queries_of(cls)
    handler = table.get(name)
    if handler is None:
        known = ", ".join(sorted(table)) or "none"
        raise InvalidPayload(
            f"{kind} {name!r}",
            [
                {
                    "loc": ["name"],
                    "type": f"unknown_{kind}",
                    "msg": f"saga {getattr(cls, 'name', cls.__name__)!r} declares no {kind} "
                    f"{name!r} (it declares: {known})",
                }
            ],
        )
    return handler


def name_of(handler: Any) -> str:
    """The name of an update or query given as its name or as the method
    (``Order.add_item``)."""
    return handler.name if isinstance(handler, _Handler) else str(handler)


def as_json(value: Any, what: str) -> Any:
    """A handler's return value as stored and returned: a model's JSON, or the value."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json", by_alias=True)
    try:
        dumps(value)
    except SerializationError as exc:
        raise SerializationError(f"{what} returned a value JSON cannot carry: {exc}") from None
    check_storable(value, what)
    return value


def run_query(saga: Any, cls: type, name: str, args: Any) -> Any:
    """Asks the saga object ``saga`` the query ``name``: its answer as JSON."""
    handler = declared(cls, "query", name)
    value = handler.parse(args, "args")
    if saga is None:
        raise QueryFailed(f"query {name!r}: the saga's code has not run yet")
    try:
        return as_json(handler.call(saga, value), f"query {name!r}")
    except SerializationError:
        raise
    except Exception as exc:
        raise QueryFailed(f"query {name!r} raised {type(exc).__name__}: {exc}") from exc
