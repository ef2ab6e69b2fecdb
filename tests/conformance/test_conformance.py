"""The conformance suite on the real Kafka and Postgres: the Python kit passes it, and a
participant that applies a command twice or drops a reply header fails it, each with a
precise message."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from pydantic import BaseModel, ConfigDict, SecretStr

from saga_engine.conformance import CASE_NAMES, Report, run_suite
from saga_engine.participant import Participant, Rejected, Transaction
from saga_engine.protocol import Envelope, MessageType, ReplyBody, decode, encode
from saga_engine.settings import KafkaSettings, ParticipantSettings, Settings
from tests.conftest import PgTarget
from tests.integration.kafka_helpers import ensure_topics
from tests.participant.helpers import delete_topics

pytestmark = pytest.mark.integration

NAME = "conformer"
EFFECTS_DDL = "CREATE TABLE conformance_effects (key text NOT NULL, command_id text NOT NULL)"


class ConformanceApply(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: str
    amount: int | None = None  # PROTOCOL.md section 16: any integer of section 12, ignored


class ConformanceRefuse(BaseModel):
    key: str


class ConformanceUndo(BaseModel):
    key: str


def conformance_participant(settings: Settings, *, empty_undo: bool = False) -> Participant:
    """PROTOCOL.md section 16's three command types, on the Python kit (``empty_undo``:
    a compensation that removed nothing answers ``{}``, as section 7.3 allows)."""
    participant = Participant(NAME, settings, backoff_base_s=0.01)

    @participant.handles(ConformanceApply)
    async def apply(cmd: ConformanceApply, tx: Transaction) -> dict[str, object]:
        await tx.execute(
            "INSERT INTO conformance_effects (key, command_id) VALUES ($1, $2)",
            cmd.key,
            tx.command_id,
        )
        n = await tx.fetchval("SELECT count(*) FROM conformance_effects WHERE key = $1", cmd.key)
        return {"key": cmd.key, "applied": n}

    @participant.handles(ConformanceRefuse)
    async def refuse(cmd: ConformanceRefuse, tx: Transaction) -> None:
        raise Rejected(f"{cmd.key} is refused")

    @participant.handles(ConformanceUndo)
    async def undo(cmd: ConformanceUndo, tx: Transaction) -> dict[str, object]:
        gone = await tx.fetch("DELETE FROM conformance_effects WHERE key = $1 RETURNING 1", cmd.key)
        if empty_undo and not gone:
            return {}
        return {"key": cmd.key, "undone": len(gone)}

    return participant


@pytest.fixture
async def stack(pg: PgTarget, kafka_bootstrap: str, unique_id: str) -> AsyncIterator[Settings]:
    prefix = f"c{unique_id}"
    settings = Settings(
        kafka=KafkaSettings(
            bootstrap_servers=kafka_bootstrap,
            topic_prefix=prefix,
            partitions=2,
            max_message_bytes=8192,
        ),
        participant=ParticipantSettings(dsn=SecretStr(pg.database_dsn), db_schema=pg.schema),
    )
    conn = await asyncpg.connect(pg.dsn)
    try:
        await conn.execute(EFFECTS_DDL)
    finally:
        await conn.close()
    topics = [f"{prefix}.cmd.{NAME}", f"{prefix}.inbox", f"{prefix}.dlq"]
    await ensure_topics(settings.kafka, topics, partitions=2)
    try:
        yield settings
    finally:
        await delete_topics(kafka_bootstrap, prefix)


async def _suite(settings: Settings) -> Report:
    return await run_suite(
        settings.kafka.bootstrap_servers,
        NAME,
        prefix=settings.kafka.topic_prefix,
        max_message_bytes=settings.kafka.max_message_bytes,
        timeout_s=20,
    )


async def test_the_python_kit_passes_every_case(stack: Settings) -> None:
    participant = conformance_participant(stack)
    await participant.start()
    try:
        # Twice on one database: each run's effects are its own.
        reports = [await _suite(stack), await _suite(stack)]
    finally:
        await participant.stop()
    for report in reports:
        failed = {r.name: r.detail for r in report.results if not r.passed}
        assert not failed, failed
        assert report.passed
        assert [r.name for r in report.results] == list(CASE_NAMES)


async def test_a_compensation_of_nothing_may_answer_an_empty_payload(stack: Settings) -> None:
    participant = conformance_participant(stack, empty_undo=True)
    await participant.start()
    try:
        report = await _suite(stack)
    finally:
        await participant.stop()
    failed = {r.name: r.detail for r in report.results if not r.passed}
    assert not failed, failed


async def _broken(settings: Settings, *, dedupe: bool, drop: str, stop: asyncio.Event) -> None:
    """A participant without the kit: answers every copy by applying it again
    (``dedupe`` off), and leaves the ``drop`` header out of its replies."""
    kafka = settings.kafka
    consumer = AIOKafkaConsumer(
        f"{kafka.topic_prefix}.cmd.{NAME}",
        bootstrap_servers=kafka.bootstrap_servers,
        group_id=f"{kafka.topic_prefix}.participant.{NAME}",
        auto_offset_reset="earliest",
    )
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all")
    await consumer.start()
    await producer.start()
    applied: dict[str, int] = {}
    answered: dict[str, ReplyBody] = {}
    try:
        while not stop.is_set():
            for records in (await consumer.getmany(timeout_ms=100)).values():
                for r in records:
                    try:
                        command = decode(r.key, r.value, list(r.headers), max_bytes=8192)
                    except Exception:  # the broken participant ignores what it cannot read
                        continue
                    if dedupe and command.command_id in answered:
                        body = answered[command.command_id]
                    else:
                        key = command.body.get("key", "") if isinstance(command.body, dict) else ""
                        applied[key] = applied.get(key, 0) + 1
                        body = ReplyBody(
                            outcome="success", payload={"key": key, "applied": applied[key]}
                        )
                        answered[command.command_id] = body
                    reply = Envelope(
                        message_type=MessageType.REPLY,
                        source=f"/participants/{NAME}",
                        saga_id=command.saga_id,
                        command_id=command.command_id,
                        correlation_id=command.correlation_id,
                        causation_id=command.id,
                        traceparent=command.traceparent,
                        body=body.model_dump(mode="json"),
                    )
                    k, v, headers = encode(reply)
                    headers = [(h, x) for h, x in headers if h != drop]
                    await producer.send_and_wait(
                        f"{kafka.topic_prefix}.inbox", v, key=k, headers=headers
                    )
    finally:
        await consumer.stop()
        await producer.stop()


@pytest.mark.parametrize(
    ("dedupe", "drop", "expected"),
    [
        (
            False,
            "",
            {"three copies applied once, answered alike": "'applied' in the replies is [1, 2, 3]"},
        ),
        (
            True,
            "ce_correlationid",
            {
                "reply headers, each answering its copy": "ce_correlationid = None",
                # It applies a command id of 201 characters, and always replies on the inbox.
                "dead letter: long-command-id": "it was answered",
                "a reply to a topic that does not exist yet": "was never created",
            },
        ),
    ],
)
async def test_a_broken_participant_fails_with_a_precise_message(
    stack: Settings, dedupe: bool, drop: str, expected: dict[str, str]
) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(_broken(stack, dedupe=dedupe, drop=drop, stop=stop))
    try:
        report = await run_suite(
            stack.kafka.bootstrap_servers,
            NAME,
            prefix=stack.kafka.topic_prefix,
            max_message_bytes=8192,
            timeout_s=5,
        )
    finally:
        stop.set()
        await task
    assert not report.passed
    details = {r.name: r.detail for r in report.results if r.name in expected and not r.passed}
    for case, says in expected.items():
        assert says in details.get(case, "(passed)"), (case, details.get(case))


async def test_saga_conformance_prints_json_and_exits_0_when_every_case_passes(
    stack: Settings,
) -> None:
    participant = conformance_participant(stack)
    await participant.start()
    kafka = stack.kafka
    env = {
        **os.environ,
        "SAGA_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
        "SAGA_KAFKA__TOPIC_PREFIX": kafka.topic_prefix,
        "SAGA_KAFKA__MAX_MESSAGE_BYTES": str(kafka.max_message_bytes),
    }
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "saga_engine",
            "conformance",
            "--participant",
            NAME,
            "--timeout",
            "20",
            "--json",
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout=120)
    finally:
        await participant.stop()
    assert proc.returncode == 0, stderr.decode()[-2000:]
    report = json.loads(stdout)
    assert report["passed"] is True
    assert report["command_topic"] == f"{kafka.topic_prefix}.cmd.{NAME}"
    assert {c["section"] for c in report["cases"]} >= {"7.4", "7.5 check 1 before 3"}


async def test_saga_conformance_says_which_topic_is_missing(stack: Settings) -> None:
    env = {
        **os.environ,
        "SAGA_KAFKA__BOOTSTRAP_SERVERS": stack.kafka.bootstrap_servers,
        "SAGA_KAFKA__TOPIC_PREFIX": stack.kafka.topic_prefix,
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "saga_engine",
        "conformance",
        "--participant",
        "nobody",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 1
    assert f"{stack.kafka.topic_prefix}.cmd.nobody do not exist" in stderr.decode()
