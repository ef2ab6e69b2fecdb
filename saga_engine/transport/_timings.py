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
    return wire_time_bytes(epoch_s).decode()


#: The whole second written last and its text ("YYYY-MM-DDTHH:MM:SS"), one tuple
#: replaced whole (a thread never reads one second's text for another): most instants
#: of a batch fall in the same second.
_SECOND: list[tuple[float, str]] = [(math.nan, "")]


def wire_time_bytes(epoch_s: float) -> bytes:
    """``wire_time``'s text as a header's value. The microseconds are rounded as
    ``datetime.fromtimestamp`` rounds them (half to even, a carry into the next second),
    so the text is the same as ``fromtimestamp(...).isoformat()``'s."""
    frac, whole = math.modf(epoch_s)
    micros = round(frac * 1e6)
    if micros >= 1_000_000:
        whole, micros = whole + 1.0, micros - 1_000_000
    elif micros < 0:
        whole, micros = whole - 1.0, micros + 1_000_000
    second = _SECOND[0]
    if second[0] != whole:
        second = (whole, datetime.fromtimestamp(whole, UTC).isoformat(timespec="seconds")[:19])
        _SECOND[0] = second
    return f"{second[1]}.{micros:06d}Z".encode()


#: The instants many replies share, written (seconds since the epoch -> header value):
#: when a batch was read and when its transaction committed. Cleared when it grows past
#: ``_SHARED_MAX``.
_SHARED: dict[float, bytes] = {}
_SHARED_MAX: Final = 64


def _shared_time(epoch_s: float) -> bytes:
    """``wire_time_bytes`` of an instant many replies share, written once."""
    text = _SHARED.get(epoch_s)
    if text is None:
        if len(_SHARED) >= _SHARED_MAX:
            _SHARED.clear()
        text = _SHARED[epoch_s] = wire_time_bytes(epoch_s)
    return text


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


_RECEIVED, _STARTED, _ENDED, _COMMITTED, _CPU = (
    TIMING_HEADERS[f]
    for f in (
        "received_time",
        "handler_start_time",
        "handler_end_time",
        "commit_time",
        "handler_cpu_ms",
    )
)


def reply_timing_headers(
    received: float, committed: float, handler: tuple[float, float, float] | None
) -> Headers:
    """The timing headers a participant adds to a reply once its transaction committed,
    in the protocol's order (``TIMING_HEADERS``): when the command was
    read and committed and, with ``handler`` (its start, end and CPU seconds), when its
    handler started and ended and its CPU time."""
    if handler is None:
        return [(_RECEIVED, _shared_time(received)), (_COMMITTED, _shared_time(committed))]
    started, ended, cpu_s = handler
    return [
        (_RECEIVED, _shared_time(received)),
        (_STARTED, wire_time_bytes(started)),
        (_ENDED, wire_time_bytes(ended)),
        (_COMMITTED, _shared_time(committed)),
        (_CPU, cpu_ms_text(cpu_s).encode()),
    ]
