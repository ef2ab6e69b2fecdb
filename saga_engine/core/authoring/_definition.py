"""Saga definitions: the user's class, checked when it is defined and when it is registered."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from types import MappingProxyType
from typing import Any, ClassVar, Generic, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel

from saga_engine.core.authoring._context import SagaContext
from saga_engine.core.authoring._signal import NAME
from saga_engine.core.authoring._signal import (
    Signal as Signal,  # (its old home: still importable here)
)
from saga_engine.core.history._concurrency_keys import ConcurrencyLimit, check_concurrency
from saga_engine.kernel._errors import (
    DefinitionError,
    InvalidPayload,
    UnknownSagaType,
    UnknownSagaVersion,
)
from saga_engine.kernel._serde import (
    JsonDict,
    canonical_hash,
    check_storable,
    dumps,
    validate_payload,
)

InT = TypeVar("InT", bound=BaseModel)
OutT = TypeVar("OutT", bound=BaseModel)
M = TypeVar("M", bound=BaseModel)


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
    #: How long a run should take, start to end: the insights report the share of runs
    #: that ended within it and list those that did not. None: no SLA.
    sla: ClassVar[timedelta | None] = None

    input_type: ClassVar[type[BaseModel]]
    output_type: ClassVar[type[BaseModel]]
    #: The signals it accepts, by name: every ``Signal`` attribute (set when validated).
    signals: ClassVar[Mapping[str, Signal[Any]]] = MappingProxyType({})
    #: Input fields stored as search attributes (business keys, e.g. ``("order_id",)``):
    #: indexed, so ``GET /sagas?order_id=o-42``, ``saga list --where order_id=o-42`` and
    #: the web page's filter find the saga. Each must be a field of the input model
    #: holding a string, a number or a boolean; its value is stored as a string.
    search_attributes: ClassVar[tuple[str, ...]] = ()
    #: Which version of the saga type this class is. Several versions of one ``name``
    #: may be registered side by side: a saga runs the version its start chose (see the
    #: rollout, docs/operations.md) for its whole life, replay included.
    version: ClassVar[int] = 1
    #: At most N running sagas of this type per value of an input field (a semantic
    #: lock, e.g. ``ConcurrencyLimit(key="account_id", limit=1)``); the others wait,
    #: FIFO per key (docs/concurrency-keys.md). None: not limited.
    concurrency: ClassVar[ConcurrencyLimit | None] = None
    #: Named predicates on a start's input (the JSON the start carried) that a rollout
    #: can select at run time, e.g. ``{"beta_tenants": lambda i: i["tenant"] in BETA}``.
    rollout_predicates: ClassVar[Mapping[str, Callable[[JsonDict], bool]]] = MappingProxyType({})
    _saga_definition: ClassVar[SagaDefinition | None] = None

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
            origin = typing.get_origin(base)
            if isinstance(origin, type) and issubclass(origin, Saga):
                args = typing.get_args(base)
                # Saga[In, Out], or a generic subclass's (GraphSaga[In, Out]): not its own
                # parameters (GraphSaga's base is Saga[InT, OutT]).
                if len(args) == 2 and not any(isinstance(a, TypeVar) for a in args):
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


def _check_duration(cls: type[Saga[Any, Any]], attribute: str) -> None:
    """``deadline`` and ``sla``: a positive timedelta or None."""
    value = getattr(cls, attribute, None)
    if value is not None and (not isinstance(value, timedelta) or value <= timedelta(0)):
        raise DefinitionError(
            f"{cls.__name__}: `{attribute}` must be a positive timedelta or None, e.g. "
            f"`{attribute} = timedelta(minutes=5)`"
        )


def _validate(cls: type[Saga[Any, Any]]) -> None:
    name = cls.__dict__.get("name", getattr(cls, "name", None))
    if not isinstance(name, str) or not NAME.match(name):
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
    for attribute in ("deadline", "sla"):
        _check_duration(cls, attribute)
    declared = cls.__dict__.get("signals")
    if declared is not None and not isinstance(declared, MappingProxyType):
        raise DefinitionError(
            f"{cls.__name__}: declare signals as attributes, e.g. `approval = Signal(Approval)`, "
            "not as a `signals` mapping"
        )
    cls.signals = MappingProxyType(_collect_signals(cls))
    _check_search_attributes(cls)
    check_concurrency(cls.__name__, cls.concurrency, cls.input_type.model_fields)
    version = cls.version
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= 10_000:
        raise DefinitionError(
            f"{cls.__name__}: `version` must be an integer from 1 to 10000, got {version!r}"
        )
    predicates = cls.rollout_predicates
    if not isinstance(predicates, Mapping) or not all(
        isinstance(k, str) and callable(v) for k, v in predicates.items()
    ):
        raise DefinitionError(
            f"{cls.__name__}: `rollout_predicates` must map names to callables taking the "
            'start input (a dict), e.g. {"beta_tenants": lambda i: i["tenant"] in BETA}'
        )


#: The admin API's list's own query parameters: a search attribute may not take one of
#: these names (any other parameter of the list names a search attribute).
LIST_PARAMETERS = frozenset(
    {
        "status",
        "type",
        "q",
        "limit",
        "cursor",
        "created_after",
        "created_before",
        "updated_after",
        "updated_before",
        "sort",
        "roots",
    }
)


def _check_search_attributes(cls: type[Saga[Any, Any]]) -> None:
    names = cls.search_attributes
    if isinstance(names, str) or not isinstance(names, tuple | list):
        raise DefinitionError(
            f"{cls.__name__}: `search_attributes` must be a tuple of input field names, e.g. "
            f'("order_id",), got {names!r}'
        )
    fields = cls.input_type.model_fields
    for name in names:
        if name not in fields:
            raise DefinitionError(
                f"{cls.__name__}: search attribute {name!r} is not a field of "
                f"{cls.input_type.__name__} (its fields: {', '.join(fields) or 'none'})"
            )
        if name in LIST_PARAMETERS:
            raise DefinitionError(
                f"{cls.__name__}: search attribute {name!r} is also a filter of the admin "
                f"API's list; rename the field (reserved: {', '.join(sorted(LIST_PARAMETERS))})"
            )
    cls.search_attributes = tuple(names)


def _collect_signals(cls: type[Saga[Any, Any]]) -> dict[str, Signal[Any]]:
    found: dict[str, Signal[Any]] = {}
    for klass in reversed(cls.__mro__):
        for attribute, value in vars(klass).items():
            if not isinstance(value, Signal):
                continue
            _check_model(cls.__name__, f"signal {value.name!r} payload", value.model)
            seen = found.get(value.name)
            if seen is not None and seen.model is not value.model and klass is cls:
                raise DefinitionError(
                    f"{cls.__name__}: two signals are named {value.name!r} "
                    f"({seen.model.__name__} and {value.model.__name__}, the second as "
                    f"`{attribute}`); signal names must be unique within a saga"
                )
            found[value.name] = value
    return found


@runtime_checkable
class DeclaredGraph(Protocol):
    """The graph a saga declares (a ``GraphSaga``'s checked ``graph``,
    ``core/authoring/_graph.Graph``): its nodes in a topological order, and its JSON.
    A protocol here because ``_graph`` builds on this module; the read models narrow it
    to ``Graph`` (``core/views/_graph_view.declared_graph``)."""

    @property
    def nodes(self) -> tuple[Any, ...]: ...

    def as_dict(self) -> JsonDict: ...


@dataclass(frozen=True, slots=True)
class SagaDefinition:
    """A validated saga class, as the engine sees it."""

    name: str
    cls: type[Saga[Any, Any]]
    input_type: type[BaseModel]
    output_type: type[BaseModel]
    deadline: timedelta | None
    #: The declared signals by name (``Signal`` attributes of the class).
    signals: Mapping[str, Signal[Any]] = field(default_factory=dict)
    #: Input fields stored as search attributes (``Saga.search_attributes``).
    search_attributes: tuple[str, ...] = ()
    #: ``Saga.version``: which version of the type this class is.
    version: int = 1
    #: ``Saga.concurrency``: at most N running per key, or None.
    concurrency: ConcurrencyLimit | None = None
    #: A graph saga's declared graph (``GraphSaga.graph``); None for a saga written as code.
    graph: DeclaredGraph | None = None

    def search_values(self, input: JsonDict) -> dict[str, str] | None:
        """The saga's search attributes from its recorded input: each declared field's
        value as a string (a list or object as its JSON); None when it declares none."""
        if not self.search_attributes:
            return None
        out: dict[str, str] = {}
        for name in self.search_attributes:
            field_info = self.input_type.model_fields[name]
            value = input.get(field_info.alias or name, input.get(name))
            if value is None:
                continue
            out[name] = value if isinstance(value, str) else dumps(value).decode()
        return out

    def validate_input(self, payload: JsonDict) -> BaseModel:
        """The start input as the input model; InvalidPayload (or UnstorableValue)
        naming each wrong field, before anything is recorded."""
        what = f"input of saga {self.name!r}"
        check_storable(payload, what)
        return validate_payload(self.input_type, payload, what)

    @staticmethod
    def fingerprint(value: BaseModel) -> str:
        """What identifies a start request: the fields it gave (a value equal to the
        field's default counts as not given), as the model reads them. So ``"10"`` and
        ``10`` for an int field are one request, and a default_factory (a fresh uuid or
        time) does not make a retry look like another request."""
        given = value.model_dump(
            mode="json", by_alias=True, exclude_unset=True, exclude_defaults=True
        )
        return canonical_hash(given)

    def same_request(self, recorded: JsonDict, request_hash: str | None, payload: JsonDict) -> bool:
        """Whether ``payload`` asks for the saga recorded with ``recorded`` (its
        ``saga_started`` input and request hash): a repeat, not another request."""
        try:
            value = self.input_type.model_validate(payload)
        except ValueError:  # pydantic's ValidationError
            return False
        if request_hash is not None:
            return self.fingerprint(value) == request_hash
        # A history from before request hashes: compare the inputs as the model reads them.
        if canonical_hash(recorded) == canonical_hash(payload):
            return True
        try:
            before = self.input_type.model_validate(recorded)
        except ValueError:
            return False
        return before.model_dump(mode="json") == value.model_dump(mode="json")

    def signal(self, name: str) -> Signal[Any]:
        """The declared signal ``name``; InvalidPayload naming the field ``name`` if this
        saga declares no such signal."""
        declared = self.signals.get(name)
        if declared is None:
            known = ", ".join(sorted(self.signals)) or "none"
            raise InvalidPayload(
                f"signal {name!r}",
                [
                    {
                        "loc": ["name"],
                        "msg": f"saga {self.name!r} declares no signal {name!r} (it declares: "
                        f"{known})",
                        "type": "unknown_signal",
                    }
                ],
            )
        return declared

    @classmethod
    def of(cls, saga_cls: type[Saga[Any, Any]]) -> SagaDefinition:
        if not (isinstance(saga_cls, type) and issubclass(saga_cls, Saga)):
            raise DefinitionError(f"{saga_cls!r} is not a Saga subclass")
        if "name" not in saga_cls.__dict__:
            raise DefinitionError(
                f"{saga_cls.__name__} has no `name` of its own; add e.g. "
                f'name = "{saga_cls.__name__.lower()}"'
            )
        # Validated once per class: building its models' JSON schemas again on every
        # start (a client's, an engine's) would cost more than the start itself.
        known = saga_cls.__dict__.get("_saga_definition")
        if isinstance(known, SagaDefinition):
            return known
        _validate(saga_cls)
        definition = cls(
            name=saga_cls.name,
            cls=saga_cls,
            input_type=saga_cls.input_type,
            output_type=saga_cls.output_type,
            deadline=saga_cls.deadline,
            signals=dict(saga_cls.signals),
            search_attributes=tuple(saga_cls.search_attributes),
            version=saga_cls.version,
            concurrency=saga_cls.concurrency,
            graph=_declared_graph(saga_cls),
        )
        saga_cls._saga_definition = definition
        return definition


def _declared_graph(saga_cls: type[Saga[Any, Any]]) -> DeclaredGraph | None:
    graph = getattr(saga_cls, "graph", None)
    return graph if isinstance(graph, DeclaredGraph) else None


class SagaRegistry:
    """The sagas one engine knows, by name and version. A name may have several versions
    (``Saga.version``); two classes with one name and one version are rejected. ``get``
    without a version is the highest one registered."""

    def __init__(self, sagas: Iterable[type[Saga[Any, Any]]] = ()) -> None:
        #: The highest version of each name (what ``get(name)`` and iteration give).
        self._by_name: dict[str, SagaDefinition] = {}
        self._versions: dict[str, dict[int, SagaDefinition]] = {}
        #: A saga registered here declares a concurrency limit (``Saga.concurrency``):
        #: without one, no saga owes anything for a key.
        self.limited = False
        for saga in sagas:
            self.register(saga)

    def register(self, saga_cls: type[Saga[Any, Any]]) -> SagaDefinition:
        definition = SagaDefinition.of(saga_cls)
        versions = self._versions.setdefault(definition.name, {})
        existing = versions.get(definition.version)
        if existing is not None and existing.cls is not saga_cls:
            raise DefinitionError(
                f"two sagas are named {definition.name!r} at version {definition.version}: "
                f"{existing.cls.__qualname__} and {saga_cls.__qualname__}; rename one of them, or "
                "give the new class another `version`"
            )
        versions[definition.version] = definition
        self._by_name[definition.name] = versions[max(versions)]
        self.limited = self.limited or definition.concurrency is not None
        return definition

    def get(self, name: str, version: int | None = None) -> SagaDefinition:
        """The definition of ``name`` at ``version`` (the highest registered if None).
        UnknownSagaType, or UnknownSagaVersion when the name is known but not the version
        (a saga started by a newer engine)."""
        if version is None:
            try:
                return self._by_name[name]
            except KeyError:
                raise UnknownSagaType(name, list(self._by_name)) from None
        versions = self._versions.get(name)
        if versions is None:
            raise UnknownSagaType(name, list(self._by_name))
        try:
            return versions[version]
        except KeyError:
            raise UnknownSagaVersion(name, version, list(versions)) from None

    def for_history(self, saga_type: str, history: typing.Sequence[Any]) -> SagaDefinition:
        """The class that drives a saga with this history: the version its start
        recorded (``saga_started.saga_version``), never the newest one deployed."""
        version = getattr(history[0], "saga_version", None) if history else None
        return self.get(saga_type, version)

    def versions(self, name: str) -> Mapping[int, SagaDefinition]:
        """Every registered version of ``name`` (empty if none)."""
        return self._versions.get(name, {})

    def resolve(self, saga: str | type[Saga[Any, Any]]) -> SagaDefinition:
        if isinstance(saga, str):
            return self.get(saga)
        # A registered class was validated when it was registered: no need to build its
        # schemas again on every start.
        name = saga.__dict__.get("name") if isinstance(saga, type) else None
        versions = self._versions.get(name) if isinstance(name, str) else None
        known = versions.get(getattr(saga, "version", 1)) if versions else None
        if known is not None and known.cls is saga:
            return known
        definition = SagaDefinition.of(saga)
        registered = self.get(definition.name)
        same = self._versions[definition.name].get(definition.version)
        if same is None or same.cls is not saga:
            raise UnknownSagaType(definition.name, list(self._by_name))
        return registered if registered.cls is saga else same

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def __iter__(self) -> Iterator[SagaDefinition]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)
