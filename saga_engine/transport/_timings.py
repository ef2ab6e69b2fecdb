"""The timing headers (PROTOCOL.md 7.4a), written and read (pure: no I/O).

The engine stamps ``ce_senttime`` on each command as it leaves (``_command_records``:
after any hold by flow control, since flow control sends through it); a participant
echoes it on its reply and adds when it read the command, when its handler started and
ended, when its transaction committed and (the Python kit) the handler's CPU time. The
engine records what a reply says on its ``reply_received`` event (``ReplyTimings``),
for insights.

Every header is optional, and reading them never refuses a reply: a value that is not
well-formed (not an RFC 3339 time with its offset, not a finite number of milliseconds
at least 0) is left out, the others kept.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

from saga_engine.core.history._events import ReplyTimings
from saga_engine.transport._wire import TIMING_HEADERS, Envelope, Headers

#: The figures of ``ReplyTimings``, by the Envelope field that carries each time.
_TIME_FIELDS: Final = {
    "sent_time": "sent_at",
    "received_time": "received_at",
    "handler_start_time": "handler_started_at",
    "handler_end_time": "handler_ended_at",
    "commit_time": "committed_at",
}
#: A CPU time above this (ms: a day) is not a handler's: left out.
_MAX_CPU_MS: Final = 86_400_000.0
#: The most bytes the timing headers add to a reply (names and values; a time is 27
#: characters, a CPU time at most 16): a reply is measured with them.
TIMING_BYTES: Final = sum(len(h) for h in TIMING_HEADERS.values()) + 27 * 5 + 16


def wire_time(epoch_s: float) -> str:
    """An instant (seconds since the epoch) as the headers write times: RFC 3339 in UTC,
    always with microseconds (so a record's size does not depend on the instant)."""
    text = datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="microseconds")
    return text.replace("+00:00", "Z")


def cpu_ms_text(cpu_s: float) -> str:
    """A CPU time (seconds) as ``ce_handlercpums`` writes it: milliseconds, 3 decimals."""
    return f"{max(cpu_s, 0.0) * 1000:.3f}"


def _time(text: str) -> datetime | None:
    if not text or len(text) > 64:
        return None
    try:
        value = datetime.fromisoformat(text)
        if value.tzinfo is None:
            return None  # RFC 3339 has its offset: a local time means nothing here
        return value.astimezone(UTC)
    except (ValueError, OverflowError):
        return None


def _cpu(text: str) -> float | None:
    if not text or len(text) > 32:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and 0 <= value <= _MAX_CPU_MS else None


def echoed_time(text: str) -> str:
    """A command's ``ce_senttime`` as its reply copies it: as it came if well-formed,
    else left out (what a reply sends must be well-formed, PROTOCOL.md 7.4a)."""
    return text if _time(text) is not None else ""


def reply_timings(envelope: Envelope) -> ReplyTimings | None:
    """What a reply's timing headers say, the well-formed ones only; None if none is."""
    fields = envelope.__dict__
    found: dict[str, Any] = {}
    for field, name in _TIME_FIELDS.items():
        value = _time(fields[field])
        if value is not None:
            found[name] = value
    cpu = _cpu(fields["handler_cpu_ms"])
    if cpu is not None:
        found["handler_cpu_ms"] = cpu
    return ReplyTimings(**found) if found else None


def timing_headers(values: Mapping[str, str]) -> Headers:
    """The timing headers of ``values`` (Envelope field -> text), those not empty, in
    the protocol's order."""
    return [(h, values[f].encode()) for f, h in TIMING_HEADERS.items() if values.get(f)]
