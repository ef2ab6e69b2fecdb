"""Per-key concurrency (a semantic lock): at most ``limit`` sagas of one type run at once
for one value of a business key, the others wait FIFO (docs/concurrency-keys.md).

The core's part, without I/O: the declaration (``ConcurrencyLimit``) checked when the
class is defined, the key a start's input gives, and what the history says about the
key (``KeyHold``, folded from ``key_queued`` and ``key_acquired``). The slots
themselves live in the store (``store/_keyslots.py``); the runner asks for them
(``runner/_concurrency_keys.py``) and records the answer in the saga's history, which is what its
``run`` waits on.
"""

from __future__ import annotations

import enum
import types
import typing
from dataclasses import dataclass
from typing import Any

from saga_engine.kernel._errors import DefinitionError, InvalidPayload
from saga_engine.kernel._serde import JsonDict

#: The longest key value stored (a longer one is refused at the start).
MAX_KEY_LENGTH = 200
#: The most holders a key may allow at once.
MAX_LIMIT = 10_000


@dataclass(frozen=True, slots=True)
class ConcurrencyLimit:
    """At most ``limit`` sagas of this type run at once per value of the input field
    ``key``; a start beyond it is recorded and waits its turn, FIFO per key::

        class Transfer(Saga[TransferIn, TransferOut]):
            name = "transfer"
            concurrency = ConcurrencyLimit(key="account_id", limit=1)
    """

    key: str
    limit: int = 1


def check_concurrency(cls_name: str, value: Any, fields: dict[str, Any]) -> None:
    """Raises DefinitionError, saying how to fix it, unless ``value`` (a class's
    ``concurrency``) is None or a ConcurrencyLimit on a field of its input model."""
    if value is None:
        return
    if not isinstance(value, ConcurrencyLimit):
        raise DefinitionError(
            f"{cls_name}: `concurrency` must be a ConcurrencyLimit or None, got {value!r}; "
            'e.g. concurrency = ConcurrencyLimit(key="account_id", limit=1)'
        )
    if value.key not in fields:
        raise DefinitionError(
            f"{cls_name}: the concurrency key {value.key!r} is not a field of its input "
            f"model (its fields: {', '.join(fields) or 'none'})"
        )
    if not _scalar(fields[value.key].annotation):
        raise DefinitionError(
            f"{cls_name}: the concurrency key {value.key!r} must be a field holding a "
            f"string, a number or a boolean (or an enum, or None), not "
            f"{fields[value.key].annotation!r}"
        )
    limit = value.limit
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
        raise DefinitionError(
            f"{cls_name}: the concurrency limit must be an integer from 1 to {MAX_LIMIT}, "
            f"got {limit!r}"
        )


def _scalar(annotation: Any) -> bool:
    """A field type whose values make a key: str, int, float, bool, an enum, a Literal,
    or an optional or a union of those."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return True
    if origin in (typing.Union, types.UnionType):
        return all(a is type(None) or _scalar(a) for a in typing.get_args(annotation))
    return isinstance(annotation, type) and issubclass(annotation, str | int | float | enum.Enum)


def key_value(limit: ConcurrencyLimit, input: JsonDict) -> str | None:
    """The key a start's (validated) input gives, as a string; None when the field is
    empty (null): such a saga is not limited."""
    raw = input.get(limit.key)
    if raw is None:
        return None
    return str(raw).lower() if isinstance(raw, bool) else str(raw)


def check_key(limit: ConcurrencyLimit | None, input: JsonDict) -> None:
    """Refuses a start whose key is too long to store (InvalidPayload, nothing recorded)."""
    if limit is None:
        return
    key = key_value(limit, input)
    if key is not None and len(key) > MAX_KEY_LENGTH:
        raise InvalidPayload(
            "input",
            [
                {
                    "loc": [limit.key],
                    "type": "string_too_long",
                    "msg": f"a concurrency key holds at most {MAX_KEY_LENGTH} characters",
                }
            ],
        )


@dataclass(slots=True)
class KeyHold:
    """What a saga's history says about its concurrency key."""

    key: str
    held: bool = False
    #: While queued: the sagas holding the key when it queued, and its place then.
    behind: tuple[str, ...] = ()
    position: int = 0
