"""The Kafka record's encode and decode (``transport/_wire``), as the engine and the
participant kit run them per record: a command made by the engine (``CommandRecords``,
its partition chosen by ``key_partition``) and decoded by a participant, then the reply
made by the participant (the kit's ``reply_record``, the timing headers added, its
partition chosen) and decoded by the engine. Each record's key is
new to the partitioner, as every reply's is to a participant (the hash caches cleared).
Unit: a record (a command or a reply, each encoded once and decoded once).
"""

from __future__ import annotations

from bench.ir.shape import definitions, started
from saga_engine.kernel._partitioning import _bytes_hash, key_hash, key_partition
from saga_engine.kernel._settings import Settings
from saga_engine.participant._sql import reply_record
from saga_engine.transport._command_records import CommandRecords
from saga_engine.transport._timings import reply_timing_headers
from saga_engine.transport._topics import Topics
from saga_engine.transport._wire import MessageType, ReplyBody, decode

#: The partitions of a topic (the producer's view), and the size limit decode checks.
PARTITIONS = list(range(12))
MAX_BYTES = 1_000_000
SOURCE = "/participants/bench"
#: When the participant read the command, committed, and ran its handler (its start,
#: end and CPU seconds): fixed instants.
_RECEIVED, _COMMITTED = 1_765_000_000.1, 1_765_000_000.4
_HANDLER = (1_765_000_000.2, 1_765_000_000.3, 0.000412)


def run(n: int) -> int:
    """``n`` records: ``n // 2`` commands and as many replies (one more command if odd)."""
    records = CommandRecords(Topics.of(Settings().kafka), "/saga-engine/bench")
    _, decision = started(definitions()[0], 0)
    command = decision.commands[0]
    reply_body = ReplyBody(outcome="success", payload={"n": 1})
    timings = reply_timing_headers(_RECEIVED, _COMMITTED, _HANDLER)
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
        out = reply_record(decoded, reply_body, source=SOURCE, topic="replies", codec=None)
        key, value, headers = out.key, out.value, out.headers + timings
        _bytes_hash.cache_clear()
        key_hash.cache_clear()
        key_partition(key, PARTITIONS, PARTITIONS)
        reply = decode(key, value, headers, max_bytes=MAX_BYTES)
        if reply.message_type is not MessageType.REPLY or reply.command_id != command.command_id:
            raise RuntimeError(f"the reply read back is not the command's: {reply}")
        done += 1
    return done
