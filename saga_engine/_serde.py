"""JSON in and out, with orjson. One place decides how values become bytes."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
from pydantic import BaseModel

from saga_engine._errors import SerializationError

JsonDict = dict[str, Any]


def dumps(value: Any) -> bytes:
    try:
        return orjson.dumps(value, option=orjson.OPT_UTC_Z)
    except TypeError as exc:
        raise SerializationError(f"cannot serialize to JSON: {exc}") from exc


def loads(data: bytes | str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise SerializationError(f"malformed JSON: {exc}") from exc


def canonical_hash(value: Any) -> str:
    """A stable digest of a JSON value: key order does not matter, types do."""
    try:
        raw = orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_UTC_Z)
    except TypeError as exc:
        raise SerializationError(f"cannot hash a non-JSON value: {exc}") from exc
    return hashlib.sha256(raw).hexdigest()[:32]


def model_payload(model: BaseModel) -> JsonDict:
    """A pydantic model as a JSON-safe dict."""
    return model.model_dump(mode="json")


def type_name(model: BaseModel | type[BaseModel]) -> str:
    cls = model if isinstance(model, type) else type(model)
    return cls.__name__
