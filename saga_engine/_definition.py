"""Saga definitions: the user's class, checked when it is defined and when it is registered."""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel

from saga_engine._errors import DefinitionError, UnknownSagaType

if TYPE_CHECKING:
    from saga_engine._context import SagaContext

InT = TypeVar("InT", bound=BaseModel)
OutT = TypeVar("OutT", bound=BaseModel)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


class Saga(Generic[InT, OutT]):
    """Base class of every saga.

    Subclass it with the input and output models, give it a ``name`` and write an
    ``async def run(self, ctx, input)``::

        class PlaceOrder(Saga[OrderRequest, OrderResult]):
            name = "place-order"

            async def run(self, ctx: SagaContext, order: OrderRequest) -> OrderResult:
                ...

    Everything that touches the outside world goes through ``ctx``; the engine
    records it, so the saga can be replayed after a crash.
    """

    #: The stable name sagas of this type are stored and started under.
    name: ClassVar[str]
    #: An overall deadline; when it passes, the saga compensates. None means no deadline.
    deadline: ClassVar[timedelta | None] = None

    input_type: ClassVar[type[BaseModel]]
    output_type: ClassVar[type[BaseModel]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Intermediate base classes without a name are checked when registered.
        if "name" in cls.__dict__:
            _validate(cls)

    async def run(self, ctx: SagaContext, input: InT) -> OutT:
        raise NotImplementedError


def _model_args(cls: type[Saga[Any, Any]]) -> tuple[Any, Any] | None:
    for klass in cls.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            if typing.get_origin(base) is Saga:
                args = typing.get_args(base)
                if len(args) == 2:
                    return args[0], args[1]
    return None


def _check_model(cls_name: str, role: str, model: Any) -> type[BaseModel]:
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise DefinitionError(
            f"{cls_name}: the {role} type must be a pydantic model (a BaseModel subclass), "
            f"got {model!r}; wrap the value in a model, e.g. `class {cls_name}{role.title()}"
            "(BaseModel): ...`"
        )
    try:
        model.model_json_schema()
    except Exception as exc:
        raise DefinitionError(
            f"{cls_name}: the {role} model {model.__name__} is not JSON-serializable ({exc}); "
            "use JSON-friendly field types (str, int, float, bool, lists, dicts, nested models)"
        ) from exc
    return model


def _validate(cls: type[Saga[Any, Any]]) -> None:
    name = cls.__dict__.get("name", getattr(cls, "name", None))
    if not isinstance(name, str) or not _NAME.match(name):
        raise DefinitionError(
            f"{cls.__name__}: `name` must be a string of letters, digits, '.', '_' or '-' "
            f'(at most 100 characters), got {name!r}; e.g. name = "place-order"'
        )
    run = cls.__dict__.get("run", getattr(cls, "run", None))
    if run is None or run is Saga.run:
        raise DefinitionError(
            f"{cls.__name__}: define `async def run(self, ctx: SagaContext, input) -> Output`"
        )
    if not inspect.iscoroutinefunction(run):
        raise DefinitionError(
            f"{cls.__name__}.run must be a coroutine function: write `async def run(self, ctx, "
            "input)` — a plain `def run` cannot await steps, timers or signals"
        )
    params = list(inspect.signature(run).parameters)
    if len(params) != 3:
        raise DefinitionError(
            f"{cls.__name__}.run must take exactly (self, ctx, input), it takes ({', '.join(params)})"
        )
    args = _model_args(cls)
    if args is None:
        raise DefinitionError(
            f"{cls.__name__} must declare its input and output models: "
            f"`class {cls.__name__}(Saga[MyInput, MyOutput])`"
        )
    cls.input_type = _check_model(cls.__name__, "input", args[0])
    cls.output_type = _check_model(cls.__name__, "output", args[1])
    deadline = cls.__dict__.get("deadline", getattr(cls, "deadline", None))
    if deadline is not None and (not isinstance(deadline, timedelta) or deadline <= timedelta(0)):
        raise DefinitionError(f"{cls.__name__}: `deadline` must be a positive timedelta or None")


@dataclass(frozen=True, slots=True)
class SagaDefinition:
    """A validated saga class, as the engine sees it."""

    name: str
    cls: type[Saga[Any, Any]]
    input_type: type[BaseModel]
    output_type: type[BaseModel]
    deadline: timedelta | None

    @classmethod
    def of(cls, saga_cls: type[Saga[Any, Any]]) -> SagaDefinition:
        if not (isinstance(saga_cls, type) and issubclass(saga_cls, Saga)):
            raise DefinitionError(f"{saga_cls!r} is not a Saga subclass")
        if "name" not in saga_cls.__dict__:
            raise DefinitionError(
                f"{saga_cls.__name__} has no `name` of its own; add e.g. "
                f'name = "{saga_cls.__name__.lower()}"'
            )
        _validate(saga_cls)
        return cls(
            name=saga_cls.name,
            cls=saga_cls,
            input_type=saga_cls.input_type,
            output_type=saga_cls.output_type,
            deadline=saga_cls.deadline,
        )


class SagaRegistry:
    """The sagas one engine knows, by name. Duplicate names are rejected."""

    def __init__(self, sagas: Iterable[type[Saga[Any, Any]]] = ()) -> None:
        self._by_name: dict[str, SagaDefinition] = {}
        for saga in sagas:
            self.register(saga)

    def register(self, saga_cls: type[Saga[Any, Any]]) -> SagaDefinition:
        definition = SagaDefinition.of(saga_cls)
        existing = self._by_name.get(definition.name)
        if existing is not None and existing.cls is not saga_cls:
            raise DefinitionError(
                f"two sagas are named {definition.name!r}: {existing.cls.__qualname__} and "
                f"{saga_cls.__qualname__}; saga names must be unique, rename one of them"
            )
        self._by_name[definition.name] = definition
        return definition

    def get(self, name: str) -> SagaDefinition:
        try:
            return self._by_name[name]
        except KeyError:
            raise UnknownSagaType(name, list(self._by_name)) from None

    def resolve(self, saga: str | type[Saga[Any, Any]]) -> SagaDefinition:
        if isinstance(saga, str):
            return self.get(saga)
        definition = SagaDefinition.of(saga)
        registered = self.get(definition.name)
        if registered.cls is not saga:
            raise UnknownSagaType(definition.name, list(self._by_name))
        return registered

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def __iter__(self) -> Iterator[SagaDefinition]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)
