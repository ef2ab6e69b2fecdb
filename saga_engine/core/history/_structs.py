"""The engine's own records as msgspec structs: the history events and what they carry.

One home for how they are built, copied, written and read (issue 42, lever 1). They are
built without validation: the engine builds them from values it already holds, checked
where they entered (a user's model, a reply's envelope, an operator's request). They are
validated when they are read back from storage (``from_data``, ``decoder``), where a bad
stored value raises ``InvalidRecord`` (msgspec's ValidationError, a ValueError).

What they carry of pydantic (``RetryPolicy``, a user-facing model; the start's links,
which the wire's ``StartBody`` validates too) goes through the hooks below: written as
the model writes itself (``model_dump(mode="json")``), read back through its validator.

Each record is written with the same keys the pydantic models wrote before (the test
``tests/internal/unit/test_event_shapes.py`` holds that shape): every field, except where a
record leaves a field out when it holds nothing. Such a record sets ``omit_defaults``, and
then each of its other defaults is ``written(...)``: msgspec leaves out a field holding its
default object, but never one whose default comes from a factory that is not a type.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, TypeAlias, TypeVar

import msgspec
from pydantic import BaseModel

from saga_engine.kernel._errors import SerializationError

T = TypeVar("T")
S = TypeVar("S", bound=msgspec.Struct)

#: What reading a stored record that does not fit its type raises.
InvalidRecord: Final = msgspec.ValidationError


class Record(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, gc=False):
    """A record the engine writes: immutable, keyword-built, strict when read back.

    Every subclass says ``frozen=True, kw_only=True`` again: mypy does not inherit the
    first, msgspec not the second (without it, a subclass's fields would go before the
    inherited ones, and be written in another order).

    Not tracked by the cyclic collector (``gc=False``): a record holds other records,
    models and values checked as JSON where they entered (orjson refuses a cycle and any
    object of the engine's), never anything that leads back to it, so it is never part of
    a cycle; the collector then never walks the resident sagas' histories, and each record
    is 16 bytes smaller (-24 k instructions per saga on the in-memory engine path)."""


def written(default: T) -> T:
    """A field's immutable default, written out even in a record that leaves out fields
    holding their defaults (``omit_defaults``)."""
    return msgspec.field(default_factory=lambda: default)


def written_empty(factory: Callable[[], T]) -> T:
    """``written`` for a new empty container (``dict``, ``list``) per record."""
    return msgspec.field(default_factory=lambda: factory())


#: The frozen models written and read lately, by identity and by their data: a step's
#: retry policy is one of a few, written with each command that carries a compensation and
#: read with each one replayed. Without these, pydantic's dump and validation of it cost
#: 110 k more instructions per saga on the in-memory engine path (4.73 M against 4.84 M,
#: ``python -m bench.instructions``) and 3.5 k more per replayed event (112 k against 115 k).
_WRITTEN: dict[int, tuple[BaseModel, Any]] = {}
_READ: dict[tuple[type, tuple[tuple[str, Any, type], ...]], BaseModel] = {}
_LATELY: Final = 256


def _enc_hook(value: Any) -> Any:
    if not isinstance(value, BaseModel):
        raise TypeError(f"{type(value).__name__} is not JSON serializable")
    if not value.model_config.get("frozen"):
        return value.model_dump(mode="json")
    seen = _WRITTEN.get(id(value))
    if seen is not None and seen[0] is value:
        return seen[1]  # msgspec only reads it (to_builtins copies it)
    data = value.model_dump(mode="json")
    if len(_WRITTEN) >= _LATELY:
        _WRITTEN.clear()
    _WRITTEN[id(value)] = (value, data)  # the model held, so its id is not reused
    return data


#: The frozen model of each type read last, with its data and the types of its values:
#: a history reads the same policy again and again, and this finds it without the key
#: ``_READ`` needs (built and hashed: 12 k instructions per policy read, where this
#: costs about 1 k; ``bench.instructions``, replay).
_LAST: dict[type, tuple[list[tuple[str, Any]], list[type], BaseModel]] = {}
_SCALARS: Final = frozenset((str, int, float, bool, type(None)))


def _dec_hook(kind: type, value: Any) -> Any:
    last = _LAST.get(kind)
    # The same keys in the same order, equal values of the same types (scalars: no list
    # or dict, whose items could be equal and of other types): the same JSON, read as
    # the same model.
    if (
        last is not None
        and type(value) is dict
        and last[0] == list(value.items())
        and last[1] == list(map(type, value.values()))
    ):
        return last[2]
    if not (isinstance(kind, type) and issubclass(kind, BaseModel)):
        raise NotImplementedError(f"cannot read a {kind!r}")  # as msgspec's InvalidRecord
    if not (kind.model_config.get("frozen") and type(value) is dict):
        return kind.model_validate(value)  # its ValidationError is a ValueError: re-raised
    try:
        # Types in the key: 1, 1.0 and True are equal, and a model may read them apart.
        key = (kind, tuple([(k, v, type(v)) for k, v in value.items()]))
        seen = _READ.get(key)
    except TypeError:  # a value that is not hashable (a list): not kept
        return kind.model_validate(value)
    if seen is None:
        seen = kind.model_validate(value)
        if len(_READ) >= _LATELY:
            _READ.clear()
        _READ[key] = seen
    types = list(map(type, value.values()))
    if _SCALARS.issuperset(types):
        _LAST[kind] = (list(value.items()), types, seen)
    return seen


_ENCODER: Final = msgspec.json.Encoder(enc_hook=_enc_hook)


def encode(record: Any) -> bytes:
    """A record (or a value holding records) as JSON bytes."""
    try:
        return _ENCODER.encode(record)
    except (TypeError, OverflowError) as exc:  # as kernel._serde.dumps says it
        raise SerializationError(f"cannot serialize to JSON: {exc}") from exc


def to_data(record: Any) -> Any:
    """A record as JSON values (dicts, lists, strings...): what ``encode`` writes."""
    try:
        return msgspec.to_builtins(record, enc_hook=_enc_hook)
    except (TypeError, OverflowError) as exc:
        raise SerializationError(f"cannot serialize to JSON: {exc}") from exc


def from_data(kind: type[T], data: Any) -> T:
    """A record of ``kind`` read from JSON values, validated (``InvalidRecord`` if not)."""
    return msgspec.convert(data, kind, dec_hook=_dec_hook)


def decoder(kind: type[T] | Any) -> msgspec.json.Decoder[T]:
    """A JSON decoder for ``kind`` (a record type or a union of them), built once."""
    return msgspec.json.Decoder(kind, dec_hook=_dec_hook)


#: A JSON array split into its items' texts, none of them decoded.
_ITEMS: Final = msgspec.json.Decoder(list[msgspec.Raw])

#: One item's text as ``json_items`` gives it (bytes-like: a decoder reads it as is).
RawJson: TypeAlias = msgspec.Raw


def json_items(raw: bytes) -> list[RawJson]:
    """The items of the JSON array ``raw``, each as its text (read later by a typed
    decoder, ``decoder``, in one pass from the text to its record). ``InvalidRecord``
    when ``raw`` is not an array; ``msgspec.DecodeError`` (a ValueError) when it is not JSON."""
    return _ITEMS.decode(raw)


def replace(record: S, **changes: Any) -> S:
    """A copy of ``record`` with ``changes`` (not validated, like any construction)."""
    return msgspec.structs.replace(record, **changes)


def field_values(record: msgspec.Struct) -> dict[str, Any]:
    """A record's fields by name, as they are (nothing converted; a tag is not a field)."""
    return msgspec.structs.asdict(record)
