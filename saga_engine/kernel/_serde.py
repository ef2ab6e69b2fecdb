"""JSON in and out, with orjson. One place decides how values become bytes, and which
values can be stored at all (Postgres refuses some that JSON and Python accept)."""

from __future__ import annotations

import hashlib
import json
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from saga_engine.kernel._errors import InvalidPayload, SerializationError, UnstorableValue
from saga_engine.kernel._input_types import text_problem

JsonDict = dict[str, Any]
M = TypeVar("M", bound=BaseModel)


def dumps(value: Any) -> bytes:
    try:
        return orjson.dumps(value, option=orjson.OPT_UTC_Z)
    except TypeError as exc:
        raise SerializationError(f"cannot serialize to JSON: {exc}") from exc


def loads(data: bytes | str) -> Any:
    """JSON text as Python values. Raises SerializationError for text that is not JSON,
    and UnstorableValue (its subclass) for JSON nested deeper than MAX_DEPTH that no
    parser here can read: the same refusal :func:`unstorable` gives a value nested a
    little less deep, so every edge answers both alike."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if "depth" in exc.msg or "recursion" in exc.msg.lower():
            raise too_deep() from None
        error = exc
    try:
        # The one kind of standard JSON orjson refuses is an escaped lone surrogate
        # ("\ud800"): read it, so the storable check can say which field holds it,
        # instead of calling the whole message malformed. NaN and Infinity are not
        # JSON and stay refused.
        return json.loads(data, parse_constant=_not_json)
    except RecursionError:
        # Deeper than Python's stack (orjson would have said so first; this is the
        # guard for a message of its that changed): never let it escape as a crash.
        raise too_deep() from None
    except ValueError:
        raise SerializationError(f"malformed JSON: {error}") from None


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def canonical_hash(value: Any) -> str:
    """A stable digest of a JSON value: key order does not matter, types do."""
    try:
        raw = orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_UTC_Z)
    except TypeError as exc:
        raise SerializationError(f"cannot hash a non-JSON value: {exc}") from exc
    return hashlib.sha256(raw).hexdigest()[:32]


def storable_hash(value: Any) -> str | None:
    """``canonical_hash(value)`` when Postgres can store ``value`` (``unstorable`` finds
    nothing), else None (``check_storable`` then says where): both from one encoding, for
    a value that is checked and hashed (a step's command)."""
    try:
        raw = orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_UTC_Z)
    except TypeError:  # (orjson.JSONEncodeError is one)
        return None
    if not _stores(raw, value):
        return None
    return hashlib.sha256(raw).hexdigest()[:32]


def model_payload(model: BaseModel) -> JsonDict:
    """A pydantic model as a JSON-safe dict: ``model.model_dump(mode="json")``."""
    if type(model).model_dump is not _MODEL_DUMP:
        return model.model_dump(mode="json")  # the model writes itself its own way
    # Its serializer called directly, as model_dump calls it, without model_dump's
    # fifteen keyword arguments: a saga dumps a model per command and compensation
    # (923,154 -> 894,701 instructions per saga in the decision core, ``bench.instructions``).
    data: JsonDict = model.__pydantic_serializer__.to_python(model, mode="json")
    return data


_MODEL_DUMP = BaseModel.model_dump


def type_name(model: BaseModel | type[BaseModel]) -> str:
    cls = model if isinstance(model, type) else type(model)
    return cls.__name__


# --------------------------------------------------------------------------- storable

#: Containers nested deeper than this cannot be written: orjson's own limit (and far
#: below what Postgres's jsonb refuses), named here rather than as "recursion limit".
#: The one nesting limit of every edge (docs/operations.md, proto/PROTOCOL.md section 12).
MAX_DEPTH = 254
_TOO_DEEP = f"is nested more than {MAX_DEPTH} levels deep"
#: orjson writes integers in [-2**63, 2**64 - 1]; anything wider cannot be stored.
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1
_INF = float("inf")
_MAX_PROBLEMS = 20


def escaped(text: str) -> str:
    """``text`` with what Postgres refuses written out as escapes (for error messages)."""
    if "\x00" not in text and text.isascii():
        return text
    out = []
    for ch in text:
        if ch == "\x00":
            out.append("\\u0000")
        elif "\ud800" <= ch <= "\udfff":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out)


def unstorable(value: Any, loc: tuple[str | int, ...] = ()) -> list[dict[str, Any]]:
    """Where ``value`` holds something Postgres cannot store as JSON (jsonb), as a list
    of ``{"loc", "msg", "type": "unstorable"}``; empty when it can all be stored.

    Refused: NUL characters and unpaired surrogates in strings or keys, keys that are not
    strings, integers beyond 64 bits, NaN and infinities (JSON has neither; orjson would
    quietly write null), and nesting deeper than MAX_DEPTH.

    This runs on every input and command, so the common case is one orjson pass (a few
    microseconds): orjson itself refuses surrogates, wide integers, other keys and deep
    nesting, writes a NUL as a visible escape, and writes NaN as null. Only when one of
    those shows does the slow walk run, to say where.
    """
    try:
        raw = orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError):
        pass
    else:
        if _stores(raw, value):
            return []
    problems: list[dict[str, Any]] = []
    _walk(value, loc, 0, problems)
    return problems


def _stores(raw: bytes, value: Any) -> bool:
    """Whether ``value``, which orjson wrote as ``raw``, is storable as it is: orjson
    refused the rest already, but writes a NUL as an escape and NaN as null."""
    return b"\\u0000" not in raw and not (b"null" in raw and _has_nonfinite(value))


def _has_nonfinite(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is float:
            if item != item or item == _INF or item == -_INF:
                return True
        elif kind is dict:
            stack.extend(item.values())
        elif kind is list or kind is tuple:
            stack.extend(item)
    return False


def _problem(out: list[dict[str, Any]], loc: tuple[str | int, ...], msg: str) -> None:
    out.append({"loc": list(loc), "msg": msg, "type": "unstorable"})


def _walk(value: Any, loc: tuple[str | int, ...], depth: int, out: list[dict[str, Any]]) -> None:
    if len(out) >= _MAX_PROBLEMS:
        return
    if isinstance(value, str):
        text = text_problem(value)
        if text is not None:
            _problem(out, loc, text)
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int):
        if not _INT_MIN <= value <= _INT_MAX:
            _problem(out, loc, "is an integer beyond 64 bits, which JSON here cannot carry")
    elif isinstance(value, float):
        if value != value or value in (_INF, -_INF):
            _problem(out, loc, "is not a finite number (JSON has no NaN or Infinity)")
    elif isinstance(value, dict | list | tuple):
        if depth >= MAX_DEPTH:
            _problem(out, loc, _TOO_DEEP)
            return
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    _problem(out, loc, f"has a key that is not a string ({key!r})")
                    continue
                where = (*loc, escaped(key))
                text = text_problem(key)
                if text is not None:
                    _problem(out, where, f"key {text}")
                _walk(item, where, depth + 1, out)
        else:
            for index, item in enumerate(value):
                _walk(item, (*loc, index), depth + 1, out)


def storable_copy(value: Any, depth: int = 0) -> Any:
    """``value`` with everything Postgres cannot store written out as text (NUL as the
    six characters ``\\u0000``, huge integers and NaN as strings): kept for the record
    when a value must be recorded but cannot be stored as it came."""
    if isinstance(value, str):
        return escaped(value) if text_problem(value) else value
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value if _INT_MIN <= value <= _INT_MAX else str(value)
    if isinstance(value, float):
        return value if value == value and value not in (_INF, -_INF) else str(value)
    if depth >= MAX_DEPTH:
        return "(nested too deep)"
    if isinstance(value, dict):
        return {
            escaped(str(k)) if not isinstance(k, str) or text_problem(k) else k: storable_copy(
                v, depth + 1
            )
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [storable_copy(v, depth + 1) for v in value]
    return value


def too_deep(what: str = "the JSON value", *loc: str | int) -> UnstorableValue:
    """The refusal of a JSON text nested too deep to be read at all (past orjson's 1,024
    levels): where inside it is not known, so it names the whole value."""
    return UnstorableValue(what, [{"loc": list(loc), "msg": _TOO_DEEP, "type": "unstorable"}])


def check_storable(value: Any, what: str, *loc: str | int) -> None:
    """Raises UnstorableValue naming every place in ``value`` Postgres cannot store."""
    problems = unstorable(value, loc)
    if problems:
        raise UnstorableValue(what, problems)


def validation_problems(exc: ValidationError, *loc: str | int) -> list[dict[str, Any]]:
    """A pydantic ValidationError as ``{"loc", "msg", "type"}`` entries under ``loc``,
    without the offending input (it may be large, secret or unstorable itself)."""
    return [
        {
            "loc": [*loc, *(escaped(p) if isinstance(p, str) else p for p in e["loc"])],
            "msg": e["msg"],
            "type": e["type"],
        }
        for e in exc.errors(include_url=False, include_input=False, include_context=False)
    ]


def without_input(exc: ValidationError) -> str:
    """A ValidationError as one line, without the values it refused: they may be secret
    (an encrypted payload's, once decoded) and this text travels in clear (a dead
    letter's ``dlq_detail``)."""
    return "; ".join(
        f"{'.'.join(str(p) for p in problem['loc']) or '(body)'}: {problem['msg']}"
        for problem in validation_problems(exc)
    )


def validate_payload(model: type[M], payload: Any, what: str, *loc: str | int) -> M:
    """``payload`` as ``model``, or InvalidPayload naming each field that is wrong."""
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise InvalidPayload(
            f"{what} does not match {model.__name__}", validation_problems(exc, *loc)
        ) from None
