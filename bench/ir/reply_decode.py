"""The engine's decode of one participant reply (``transport/_wire.decode``), with the
five timing headers a participant adds (PROTOCOL.md 7.4a; ``timed``: as the kits send
it, 20 headers) and without them (``untimed``: a reply as valid, 15 headers, its
``ce_senttime`` copied from the command as before). Their difference is what those
headers cost the engine per reply: the most that a protocol with fewer headers per
record (the timings packed into one) could save there. Unit: a reply decoded.
"""

from __future__ import annotations

from typing import Any

from bench.ir.shape import definitions, started
from bench.ir.wire import _COMMITTED, _HANDLER, _RECEIVED, MAX_BYTES, SOURCE
from saga_engine.kernel._settings import Settings
from saga_engine.participant._sql import reply_record
from saga_engine.transport._command_records import CommandRecords
from saga_engine.transport._timings import reply_timing_headers
from saga_engine.transport._topics import Topics
from saga_engine.transport._wire import MessageType, ReplyBody, decode


def reply(timed: bool) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """A participant's reply to a saga's first command: key, value and headers."""
    records = CommandRecords(Topics.of(Settings().kafka), "/saga-engine/bench")
    _, decision = started(definitions()[0], 0)
    _, key, value, headers = records.record(decision.commands[0])
    command = decode(key, value, headers, max_bytes=MAX_BYTES)
    out = reply_record(
        command,
        ReplyBody(outcome="success", payload={"n": 1}),
        source=SOURCE,
        topic="replies",
        codec=None,
    )
    timings = reply_timing_headers(_RECEIVED, _COMMITTED, _HANDLER) if timed else []
    return out.key, out.value, [*out.headers, *timings]


def _run(n: int, timed: bool) -> int:
    key, value, headers = reply(timed)
    last: Any = None
    for _ in range(n):
        last = decode(key, value, headers, max_bytes=MAX_BYTES)
    if n and last.message_type is not MessageType.REPLY:
        raise RuntimeError(f"not read as a reply: {last}")
    return n


def timed(n: int) -> int:
    return _run(n, timed=True)


def untimed(n: int) -> int:
    return _run(n, timed=False)
