"""The Kafka record's encode and decode (``transport/_wire``), as the engine and the
participant kit run them per record: a command made by the engine (``CommandRecords``,
its partition chosen by ``key_partition``) and decoded by a participant, then the reply
made by the participant (``encode_fields`` with the fields the kit gives it, the timing
headers added, its partition chosen) and decoded by the engine. Each record's key is
new to the partitioner, as every reply's is to a participant (the hash caches cleared).
Unit: a record (a command or a reply, each encoded once and decoded once).
"""

from __future__ import annotations

from typing import Any

from bench.ir.shape import definitions, started
from saga_engine.kernel._partitioning import _bytes_hash, key_hash, key_partition
from saga_engine.kernel._settings import Settings
from saga_engine.transport._command_records import CommandRecords
from saga_engine.transport._timings import timing_headers, wire_time
from saga_engine.transport._topics import Topics
from saga_engine.transport._wire import Envelope, MessageType, decode, encode_fields

#: The partitions of a topic (the producer's view), and the size limit decode checks.
PARTITIONS = list(range(12))
MAX_BYTES = 1_000_000
#: When the participant read the command, ran its handler and committed: fixed instants.
_TIMINGS = {
    "received_time": wire_time(1_765_000_000.1),
    "handler_start_time": wire_time(1_765_000_000.2),
    "handler_end_time": wire_time(1_765_000_000.3),
    "commit_time": wire_time(1_765_000_000.4),
    "handler_cpu_ms": "0.412",
}


def reply_fields(command: Envelope) -> dict[str, Any]:
    """The fields the kit's ``reply_record`` gives ``encode_fields`` for ``command``."""
    return {
        "message_type": MessageType.REPLY,
        "source": "/participants/bench",
        "subject": command.subject,
        "saga_id": command.saga_id,
        "saga_type": command.saga_type,
        "command_id": command.command_id,
        "step": command.step,
        "correlation_id": command.correlation_id or command.saga_id,
        "causation_id": command.id,
        "compensation": command.compensation,
        "traceparent": command.traceparent,
        "tracestate": command.tracestate,
        "sent_time": command.sent_time,
    }


def run(n: int) -> int:
    """``n`` records: ``n // 2`` commands and as many replies (one more command if odd)."""
    records = CommandRecords(Topics.of(Settings().kafka), "/saga-engine/bench")
    _, decision = started(definitions()[0], 0)
    command = decision.commands[0]
    reply_body = {"outcome": "success", "payload": {"n": 1}, "error": None}
    timings = timing_headers(_TIMINGS)
    done = 0
    while done < n:
        # The engine's command, and the participant reading it.
        _, key, value, headers = records.record(command)
        _bytes_hash.cache_clear()
        key_hash.cache_clear()
        key_partition(key, PARTITIONS, PARTITIONS)
        decoded = decode(key, value, headers, max_bytes=MAX_BYTES)
        done += 1
        if done == n:
            break
        # The participant's reply, and the engine reading it.
        key, value, headers = encode_fields(reply_fields(decoded), reply_body)
        headers += timings
        _bytes_hash.cache_clear()
        key_hash.cache_clear()
        key_partition(key, PARTITIONS, PARTITIONS)
        reply = decode(key, value, headers, max_bytes=MAX_BYTES)
        if reply.message_type is not MessageType.REPLY or reply.command_id != command.command_id:
            raise RuntimeError(f"the reply read back is not the command's: {reply}")
        done += 1
    return done
