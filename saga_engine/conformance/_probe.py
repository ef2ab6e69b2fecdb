"""The suite's Kafka side: :class:`Probe` sends records to a participant's command topic
and collects what comes back on the inbox and the dead-letter topic, from the moment it
started, for its own run only; :class:`ProbeReply` is one reply, with the checks of
PROTOCOL.md 7.3-7.4 on it."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
from typing import Any, Final

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from saga_engine.conformance._cases import CASE_HEADER, TRACEPARENT, Headers
from saga_engine.kernel._errors import SerializationError
from saga_engine.kernel._partitioning import partition_for
from saga_engine.kernel._serde import loads
from saga_engine.transport._topics import Topics
from saga_engine.transport._wire import Envelope

#: Section 10's note on check 10: what a producer MUST send as ``ce_time``.
RFC3339: Final = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")

#: Section 7.4a: ``ce_handlercpums``, a non-negative decimal number of milliseconds.
CPU_MS: Final = re.compile(r"^[0-9]+(\.[0-9]+)?$")
#: Section 7.4a's times, in the order a reply's must be (one host's clock).
TIMING_ORDER: Final = (
    "ce_receivedtime",
    "ce_handlerstarttime",
    "ce_handlerendtime",
    "ce_committime",
)

#: What every reply carries (section 7.4), beside the values matched to its command.
_FIXED = {
    "ce_specversion": "1.0",
    "content-type": "application/json",
    "ce_type": "saga.reply",
    "ce_schemaversion": "1",
}


@dataclass(frozen=True, slots=True)
class ProbeReply:
    key: bytes | None
    headers: dict[str, str]
    body: Any
    #: Where it arrived, of how many partitions (section 2: murmur2 of the key).
    partition: int = 0
    partitions: int = 1
    #: Header names in the order sent, and member names the value repeats (section 3).
    names: list[str] = field(default_factory=list)
    repeated_members: list[str] = field(default_factory=list)

    @property
    def outcome(self) -> str:
        return str(self.body.get("outcome")) if isinstance(self.body, dict) else "(no body)"

    @property
    def payload(self) -> dict[str, Any]:
        payload = self.body.get("payload") if isinstance(self.body, dict) else None
        return payload if isinstance(payload, dict) else {}

    def expect(self, outcome: str, *, or_empty: bool = False, **payload: int) -> list[str]:
        """What is wrong with this reply's outcome and payload (``or_empty``: an empty
        payload is right too, section 7.3's answer to a compensation of nothing)."""
        problems = (
            [] if self.outcome == outcome else [f"outcome {self.outcome!r}, want {outcome!r}"]
        )
        if or_empty and not self.payload and isinstance(self.body, dict):
            return problems
        for name, value in payload.items():
            if self.payload.get(name) != value:
                problems.append(f"payload {name} = {self.payload.get(name)!r}, want {value}")
        return problems

    def header_problems(self, command: Envelope) -> list[str]:
        """Section 7.4: what is wrong with this reply's key and headers."""
        h = self.headers
        want = {
            **_FIXED,
            "ce_sagaid": command.saga_id,
            "ce_commandid": command.command_id,
            "ce_correlationid": command.correlation_id,
        }
        problems = [f"{k} = {h.get(k)!r}, want {v!r}" for k, v in want.items() if h.get(k) != v]
        problems += [f"{k} is missing" for k in ("ce_id", "ce_source", "ce_time") if not h.get(k)]
        if self.key != command.saga_id.encode():
            problems.append(f"key {self.key!r}, want the saga id")
        want_partition = partition_for(command.saga_id, self.partitions)
        if self.partition != want_partition:
            problems.append(
                f"partition {self.partition}, want {want_partition} (murmur2 of the key)"
            )
        twice = sorted({n for n in self.names if self.names.count(n) > 1})
        if twice:
            problems.append(f"header(s) sent twice: {twice}")
        if self.repeated_members:
            problems.append(f"member(s) named twice in the value: {self.repeated_members}")
        if not RFC3339.match(h.get("ce_time", "")):
            problems.append(f"ce_time {h.get('ce_time')!r} is not RFC 3339")
        trace = h.get("traceparent", "").split("-")
        if len(trace) != 4 or trace[1] != TRACEPARENT.split("-")[1]:
            problems.append(f"traceparent {h.get('traceparent')!r} does not continue the trace")
        return problems

    def timing_problems(self, command: Envelope) -> list[str]:
        """Section 7.4a: what is wrong with the timing headers this reply sends (none
        sent is right too): each well-formed, ``ce_senttime`` the command's, the times
        in order."""
        h = self.headers
        problems = [
            f"{name} {h[name]!r} is not RFC 3339"
            for name in ("ce_senttime", *TIMING_ORDER)
            if name in h and not RFC3339.match(h[name])
        ]
        if "ce_handlercpums" in h and not CPU_MS.match(h["ce_handlercpums"]):
            problems.append(f"ce_handlercpums {h['ce_handlercpums']!r} is not a decimal number")
        if "ce_senttime" in h and h["ce_senttime"] != command.sent_time:
            problems.append(f"ce_senttime {h['ce_senttime']!r}, want the command's")
        if problems:
            return problems
        times = [(n, datetime.fromisoformat(h[n])) for n in TIMING_ORDER if n in h]
        for (a, at), (b, bt) in itertools.pairwise(times):
            if bt < at:
                problems.append(f"{b} is before {a}")
        return problems


class Probe:
    """Producers to the command topic; readers of the inbox and the dead-letter topic."""

    def __init__(
        self, bootstrap: str, prefix: str, participant: str, timeout_s: float, run: str
    ) -> None:
        topics = Topics(prefix)
        self.participant = participant
        self._run_tag = f"{run}/"
        self.command_topic = topics.commands(participant)
        self.inbox_topic = topics.inbox
        self._dlq_topic = topics.dlq
        self._bootstrap = bootstrap
        self._timeout_s = timeout_s
        self._producers: dict[str, AIOKafkaProducer] = {}
        self._reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
        self.replies: dict[str, list[ProbeReply]] = {}
        self._by_saga: set[str] = set()
        self.dead_letters: dict[str, list[dict[str, str]]] = {}
        self.partitions: dict[str, int] = {}

    async def __aenter__(self) -> Probe:
        await self._reader.start()
        existing = await self._reader.topics()
        wanted = (self.inbox_topic, self._dlq_topic, self.command_topic)
        absent = [t for t in wanted if t not in existing]
        if absent:
            await self._reader.stop()
            raise ValueError(f"topic(s) {', '.join(absent)} do not exist: create them first")
        producer = await self._producer("none")
        for topic in wanted:
            self.partitions[topic] = len(await producer.partitions_for(topic))
        parts = [TopicPartition(t, p) for t in wanted[:2] for p in range(self.partitions[t])]
        # Only what arrives from now on: positions resolved before anything is sent.
        self._reader.assign(parts)
        await self._reader.seek_to_end(*parts)
        for tp in parts:
            await self._reader.position(tp)
        return self

    async def __aexit__(
        self, *exc: type[BaseException] | BaseException | TracebackType | None
    ) -> None:
        for producer in self._producers.values():
            await producer.stop()
        await self._reader.stop()

    async def send(
        self, key: bytes | None, value: bytes | None, headers: Headers, *, compression: str = "none"
    ) -> None:
        producer = await self._producer(compression)
        await producer.send_and_wait(self.command_topic, value, key=key, headers=headers)

    async def _producer(self, compression: str) -> AIOKafkaProducer:
        producer = self._producers.get(compression)
        if producer is None:
            producer = AIOKafkaProducer(
                bootstrap_servers=self._bootstrap,
                acks="all",
                compression_type=None if compression == "none" else compression,
                max_request_size=16 * 1024 * 1024,
            )
            await producer.start()
            self._producers[compression] = producer
        return producer

    async def collect(
        self, command_ids: set[str], dead_cases: set[str], *, count: int = 1
    ) -> tuple[dict[str, list[ProbeReply]], list[str]]:
        """Reads until every command id has ``count`` replies and every case a dead
        letter, or the deadline; returns the replies to ``command_ids`` and what is
        missing."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout_s
        while True:
            missing = [c for c in command_ids if len(self.replies.get(c, [])) < count]
            missing += [f"dead letter {c}" for c in dead_cases if c not in self.dead_letters]
            if not missing or loop.time() > deadline:
                return {c: list(self.replies.get(c, [])) for c in command_ids}, sorted(missing)
            await self._poll(0.1)

    async def settle(self, seconds: float) -> None:
        """Reads for ``seconds`` more: what arrives late is judged too."""
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        while loop.time() < end:
            await self._poll(0.1)

    def dead_reasons(self, case: str) -> list[str]:
        return [h.get("dlq_reason", "") for h in self.dead_letters.get(case, [])]

    def answered(self, saga_id: str) -> bool:
        return saga_id in self._by_saga

    async def _poll(self, seconds: float) -> None:
        batches = await self._reader.getmany(timeout_ms=int(seconds * 1000))
        for tp, records in batches.items():
            for r in records:
                if tp.topic == self._dlq_topic:
                    self._dead_letter(r)
                else:
                    self._reply(r, self.partitions[tp.topic])

    def _dead_letter(self, record: Any) -> None:
        """Kept if it is of this run: an earlier run's are not this run's cases."""
        headers = {k: v.decode(errors="replace") for k, v in record.headers or []}
        tag = headers.get(CASE_HEADER, "")
        if tag.startswith(self._run_tag):
            self.dead_letters.setdefault(tag.removeprefix(self._run_tag), []).append(headers)

    def _reply(self, record: Any, partitions: int) -> ProbeReply:
        reply = as_reply(record, partitions)
        self.replies.setdefault(reply.headers.get("ce_commandid", ""), []).append(reply)
        self._by_saga.add(reply.headers.get("ce_sagaid", ""))
        return reply

    async def reply_on_new_topic(
        self, topic: str, command_id: str
    ) -> tuple[ProbeReply | None, str]:
        """Waits for ``topic`` to exist (the participant creates it, section 1) and for the
        reply to ``command_id`` on it, read from its start; then deletes the topic. The
        reply, or None and what was missing."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout_s
        reader = AIOKafkaConsumer(bootstrap_servers=self._bootstrap, group_id=None)
        await reader.start()
        try:
            while topic not in await reader.topics():
                if loop.time() > deadline:
                    return None, f"topic {topic} was never created"
                await asyncio.sleep(0.2)
            try:
                producer = await self._producer("none")
                partitions = sorted(await producer.partitions_for(topic))
                parts = [TopicPartition(topic, p) for p in partitions]
                reader.assign(parts)
                await reader.seek_to_beginning(*parts)
                while loop.time() <= deadline:
                    for records in (await reader.getmany(timeout_ms=100)).values():
                        for r in records:
                            reply = as_reply(r, len(parts))
                            if reply.headers.get("ce_commandid") == command_id:
                                return reply, ""
                return None, f"no reply on {topic}"
            finally:
                await self._delete(topic)
        finally:
            await reader.stop()

    async def _delete(self, topic: str) -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=self._bootstrap)
        await admin.start()
        try:
            await admin.delete_topics([topic])
        finally:
            await admin.close()


def as_reply(record: Any, partitions: int) -> ProbeReply:
    names = [k for k, _ in record.headers or []]
    headers = {k: v.decode(errors="replace") for k, v in record.headers or []}
    try:
        body = loads(record.value or b"")
    except SerializationError:
        body = None
    repeated = _repeated_members(record.value or b"")
    return ProbeReply(record.key, headers, body, record.partition, partitions, names, repeated)


def _repeated_members(value: bytes) -> list[str]:
    """Member names that an object of ``value`` holds twice (section 7.5's notes)."""
    repeated: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        names = [k for k, _ in items]
        repeated.extend(sorted({k for k in names if names.count(k) > 1}))
        return dict(items)

    try:
        json.loads(value, object_pairs_hook=pairs)
    except ValueError:
        return []
    return repeated
