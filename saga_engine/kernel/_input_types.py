"""What a text or an instant from outside may hold: the one set of types every request
field (the admin API's path, query and body, the CLI's arguments) and every record's text
field is checked with, so that nothing Postgres cannot store reaches it.

- :class:`StorableText` (``Text`` and its sized variants): a string with no NUL character
  and no unpaired surrogate (Postgres ``text`` and ``jsonb`` refuse both, with an error
  about encodings, not about the field). Its OpenAPI schema carries the no-NUL pattern,
  so clients see the rule.
- ``Instant``: an ISO-8601 date-time that has a UTC equivalent Python and Postgres can both
  hold (years 1 to 9999 in UTC: ``0001-01-01T00:00:00+14:00`` has none); one without an
  offset is taken as UTC, as the admin API always has. Validated to UTC.
- :func:`check_time_range`: a pair of instants (``*_after``, ``*_before``) in order.

Pure pydantic: pydantic names the field in its errors, and FastAPI puts it under the
request's ``loc`` (``["query", "source"]``, ``["body", "filter", "created_before"]``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

__all__ = [
    "NO_NUL",
    "Instant",
    "StorableText",
    "Text",
    "check_time_range",
    "storable_text",
    "text_problem",
    "utc_instant",
]

#: The no-NUL rule as a regex, shown to clients in the OpenAPI schema of every text field
#: (a lone surrogate cannot be written in a URL, and JSON clients rarely produce one).
NO_NUL = r"^[^\x00]*$"


def text_problem(text: str) -> str | None:
    """Why Postgres cannot store ``text``, or None when it can."""
    if "\x00" in text:
        return "contains a NUL character (\\u0000), which Postgres cannot store"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return "contains an unpaired surrogate, which is not valid Unicode"
    return None


def storable_text(value: str) -> str:
    """``value`` when Postgres can store it; else pydantic's error (type ``unstorable``)."""
    problem = text_problem(value)
    if problem is not None:
        raise PydanticCustomError("unstorable", problem)
    return value


@dataclass(frozen=True, slots=True)
class StorableText:
    """``Annotated[str, StorableText(...)]``: a string within these bounds that Postgres
    can store. The bounds are checked first (after stripping, with ``strip``), then the
    text rule."""

    min_length: int | None = None
    max_length: int | None = None
    strip: bool = False
    #: A further pattern the text must match (e.g. a name's characters).
    pattern: str | None = None

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        inner = core_schema.str_schema(
            min_length=self.min_length,
            max_length=self.max_length,
            strip_whitespace=self.strip or None,
            pattern=self.pattern,
        )
        return core_schema.no_info_after_validator_function(storable_text, inner)

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        out = handler(schema)
        out.setdefault("pattern", NO_NUL)
        return out


#: Any text Postgres can store.
Text = Annotated[str, StorableText()]

_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}")


def _iso_only(value: Any) -> Any:
    """Text must say ISO-8601: pydantic alone would also read "0.5" as a time."""
    if isinstance(value, str) and not _ISO_DATE.match(value):
        raise PydanticCustomError(
            "instant_format", "use an ISO-8601 date-time, e.g. 2030-01-01T00:00:00Z"
        )
    return value


def utc_instant(value: datetime) -> datetime:
    """``value`` in UTC (a naive one taken as UTC), or pydantic's error when it has no UTC
    time that Python and Postgres can hold (years 1 to 9999)."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise PydanticCustomError(
            "instant_out_of_range",
            "has no time in UTC between years 1 and 9999 (mind its offset)",
        ) from None


#: An ISO-8601 instant with a time in UTC, validated to UTC.
Instant = Annotated[datetime, BeforeValidator(_iso_only), AfterValidator(utc_instant)]


def check_time_range(after: datetime | None, before: datetime | None, what: str) -> str | None:
    """Why ``(after, before)`` is not a time range (``{what}_after`` must be earlier than
    ``{what}_before``), or None when it is one (or is open on a side)."""
    if after is None or before is None:
        return None
    if _aware(after) >= _aware(before):
        return f"{what}_after must be earlier than {what}_before"
    return None


def _aware(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value
