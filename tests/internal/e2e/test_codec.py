"""Payload codecs end to end, on the real servers, in real processes: an engine
(``saga worker``) and a participant (the kit), both configured with ``SAGA_CODEC__*``.

- The canary: a saga whose input, commands, replies, signal and output carry a canary
  string completes, and then no Postgres row of any table of the test's schemas (the
  engine's and the participant's, each row cast to text) and no Kafka record of the
  test's topics (values and header values) holds the canary in clear; the admin API,
  in the engine process that holds the key, shows it decoded.
- Rotation under a crash: an engine is SIGKILLed while a saga written under key k1 is
  in flight, restarted with a rotated key set (k2 current, k1 kept), and finishes it;
  the history then holds payloads under both key ids.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import signal
from collections.abc import AsyncIterator
from typing import TypeVar

import asyncpg
import httpx
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from saga_engine import AesGcmCodec, CodecError, SagaStatus, Settings
from saga_engine.client import SagaClient
from saga_engine.core.history._decision import child_saga_id
from saga_engine.settings import CodecSettings
from tests.integration.kafka_helpers import read_to_end
from tests.internal.e2e.codec_app import (
    LEDGER_DDL,
    PARTICIPANT,
    Approval,
    Deposit,
    Trust,
    Trustee,
    Vault,
)
from tests.internal.e2e.harness import Cluster, participant_schema
from tests.waiting import eventually

pytestmark = pytest.mark.integration
T = TypeVar("T")

CANARY = "canary-9e3b-Jane-Doe-1970"
KEYS = {"k1": os.urandom(32), "k2": os.urandom(32)}


def codec_env(current: str, *key_ids: str) -> dict[str, str]:
    keys = {k: base64.b64encode(KEYS[k]).decode() for k in key_ids}
    return {
        "SAGA_CODEC__KEYS": json.dumps(keys),
        "SAGA_CODEC__CURRENT_KEY": current,
        "SAGA_CODEC__COMPRESSION": "zstd",
        # Low, so that some payloads are compressed and some are not.
        "SAGA_CODEC__COMPRESS_THRESHOLD": "64",
    }


def client_settings(cluster: Cluster, current: str, *key_ids: str) -> Settings:
    env = codec_env(current, *key_ids)
    codec = CodecSettings.model_validate(
        {
            "keys": json.loads(env["SAGA_CODEC__KEYS"]),
            "current_key": current,
            "compression": "zstd",
            "compress_threshold": 64,
        }
    )
    return cluster.settings.model_copy(update={"codec": codec})


@pytest.fixture
async def vault(cluster: Cluster) -> AsyncIterator[Cluster]:
    """The cluster with the vault participant's schema (its kit tables and its own)."""
    async with participant_schema(cluster, PARTICIPANT, LEDGER_DDL):
        yield cluster


def start_engine(cluster: Cluster, current: str, *key_ids: str) -> None:
    cluster._spawn(
        "engine",
        ["-m", "saga_engine", "worker", "tests.internal.e2e.codec_app", "--log-level", "INFO"],
        cluster.env(**codec_env(current, *key_ids)),
    )


def start_participant(cluster: Cluster, current: str, *key_ids: str) -> None:
    cluster._spawn(
        f"participant-{PARTICIPANT}",
        ["-m", "tests.internal.e2e.codec_app", "participant", PARTICIPANT],
        cluster.env(
            SAGA_PARTICIPANT__DB_SCHEMA=cluster.participant_schema(PARTICIPANT),
            **codec_env(current, *key_ids),
        ),
    )


# --------------------------------------------------------------------------- scans


async def postgres_rows(cluster: Cluster) -> dict[str, list[str]]:
    """Every row of every table and view in the test's schemas, as text, by table."""
    schemas = [cluster.schema, cluster.participant_schema(PARTICIPANT)]
    conn = await asyncpg.connect(cluster.database_dsn)
    try:
        tables = await conn.fetch(
            "SELECT table_schema, table_name FROM information_schema.tables "
            "WHERE table_schema = ANY($1::text[]) AND table_type IN ('BASE TABLE', 'VIEW')",
            schemas,
        )
        out: dict[str, list[str]] = {}
        for t in tables:
            name = f'"{t["table_schema"]}"."{t["table_name"]}"'
            rows = await conn.fetch(f"SELECT r::text AS r FROM {name} AS r")
            out[name] = [r["r"] for r in rows]
        return out
    finally:
        await conn.close()


async def kafka_records(cluster: Cluster) -> list[tuple[str, bytes, list[tuple[str, bytes]]]]:
    """Every record of the test's topics: (topic, value, headers)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=cluster.bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        async with asyncio.timeout(60):
            # All the cluster's metadata: the consumer's own knows subscribed topics only.
            metadata = await consumer._client.fetch_all_metadata()
            topics = [t for t in metadata.topics() if t.startswith(f"{cluster.prefix}.")]
            parts = [
                TopicPartition(t, p)
                for t in topics
                for p in sorted(metadata.partitions_for_topic(t) or ())
            ]
            assert parts, f"no topics of {cluster.prefix}"
            records = await read_to_end(consumer, parts)
            return [(r.topic, r.value or b"", list(r.headers or [])) for r in records]
    finally:
        await consumer.stop()


def admin_url(cluster: Cluster) -> str | None:
    found = re.findall(r"admin API on (http://\S+)", cluster.log_tail("engine", 400))
    return found[-1] if found else None


# --------------------------------------------------------------------------- tests


async def test_no_clear_canary_in_postgres_or_kafka_and_the_admin_decodes(
    vault: Cluster,
) -> None:
    cluster = vault
    start_participant(cluster, "k1", "k1")
    start_engine(cluster, "k1", "k1")
    async with SagaClient(client_settings(cluster, "k1", "k1")) as client:
        saga_id = await client.start(Vault, Deposit(secret=CANARY), idempotency_key="canary")
        # Keyed by the saga id like the start, so it arrives after it; the saga takes it
        # when it reaches its wait.
        await client.signal(saga_id, Vault.approval, Approval(note=f"approved {CANARY}"))
        # Another, refused at its second step with the secret in the refusal's details:
        # it compensates the first (a compensation command carrying the secret).
        refused = await client.start(
            Vault, Deposit(secret=CANARY, refuse_second=True), idempotency_key="refused"
        )
        # A parent whose vault is a child saga: the child's start, its answer (its output)
        # and the parent's undo of it all carry the secret across the inbox.
        trustee = await client.start(Trustee, Trust(secret=CANARY), idempotency_key="trustee")
        child = child_saga_id(trustee, "vault")

        async def child_exists() -> bool | None:
            return bool(await cluster.statuses([child])) or None

        await eventually(
            child_exists,
            timeout=60,
            interval=0.2,
            what="the trustee's child vault",
            context=cluster.logs_tail,
        )
        await client.signal(child, Vault.approval, Approval(note=f"child {CANARY}"))
        statuses = await cluster.wait_settled([saga_id, refused, trustee, child])
        assert statuses == {
            saga_id: SagaStatus.COMPLETED,
            refused: SagaStatus.COMPENSATED,
            trustee: SagaStatus.COMPENSATED,  # its seal refused: the child was undone
            child: SagaStatus.COMPENSATED,
        }
        output = await client.result(saga_id, timeout=10)
    # It worked on the real payloads: the participant saw the secret, the saga the reply.
    assert output == {
        "receipts": [f"receipt-1-for-{CANARY}", f"receipt-2-for-{CANARY}"],
        "note": f"approved {CANARY}",
    }

    rows = await postgres_rows(cluster)
    events = next(v for k, v in rows.items() if k.endswith('."saga_events"'))
    # start, 2 x (command, reply), signal, completed; and the refused one's
    assert len([r for r in events if saga_id in r]) == 7
    compensated = " ".join(r for r in events if refused in r)
    for kind in ("compensation_started", "compensation_issued", "saga_compensated"):
        assert kind in compensated
    # The kit's stored replies are scanned too (its outbox holds rows only when a publish
    # failed: tests/internal/participant covers that path with a codec).
    assert any(k.endswith('."saga_processed_commands"') and v for k, v in rows.items())
    leaks = {table: [r for r in found if CANARY in r] for table, found in rows.items()}
    assert {t: r for t, r in leaks.items() if r} == {}

    records = await kafka_records(cluster)
    kinds = {dict(h).get("ce_type", b"").decode() for _, _, h in records}
    assert {"saga.start", "saga.signal", "saga.command", "saga.reply", "saga.undo"} <= kinds
    for topic, value, headers in records:
        assert CANARY.encode() not in value, topic
        assert all(CANARY.encode() not in v for _, v in headers), topic
        if dict(headers).get("ce_type") != b"saga.reload":
            assert dict(headers).get("saga-codec") == b"zstd,aes-gcm", (topic, headers)

    # The engine holds the key: its admin API shows the payloads decoded.
    async def address() -> str | None:
        return admin_url(cluster)

    url = await eventually(
        address, timeout=60, interval=0.2, what="the admin API's address", context=cluster.logs_tail
    )
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        detail = (await http.get(f"/sagas/{saga_id}")).json()
        history = (await http.get(f"/sagas/{saga_id}/history")).text
    assert detail["input"]["secret"] == CANARY
    assert detail["output"]["note"] == f"approved {CANARY}"
    assert f"receipt-2-for-{CANARY}" in history


async def _key_ids_in_history(cluster: Cluster, saga_id: str) -> set[str]:
    conn = await asyncpg.connect(cluster.database_dsn)
    try:
        rows = await conn.fetch(
            f'SELECT data::text AS d FROM "{cluster.schema}".saga_events WHERE saga_id = $1',
            saga_id,
        )
    finally:
        await conn.close()
    found: set[str] = set()

    def walk(value: object) -> None:
        if isinstance(value, dict):
            if isinstance(value.get("$codec"), str):
                found.add(AesGcmCodec.key_id_of(base64.b64decode(value["data"])))
            for item in value.values():
                walk(item)

    for row in rows:
        walk(json.loads(row["d"]))
    return found


async def test_an_engine_killed_mid_saga_recovers_it_under_a_rotated_key_set(
    vault: Cluster,
) -> None:
    cluster = vault
    # The participant already holds both keys (keys are handed out before a rotation).
    start_participant(cluster, "k2", "k1", "k2")
    start_engine(cluster, "k1", "k1")
    async with SagaClient(client_settings(cluster, "k1", "k1")) as client:
        saga_id = await client.start(
            Vault, Deposit(secret=CANARY, pause_s=2.0), idempotency_key="rotation"
        )

    async def sleeping() -> bool | None:
        conn = await asyncpg.connect(cluster.database_dsn)
        try:
            kinds = await conn.fetch(
                f'SELECT kind FROM "{cluster.schema}".saga_events WHERE saga_id = $1', saga_id
            )
        except asyncpg.UndefinedTableError:
            return False
        finally:
            await conn.close()
        return "timer_started" in {r["kind"] for r in kinds}

    # In flight: its first step answered, its durable sleep begun.
    await eventually(
        sleeping, timeout=60, interval=0.2, what="the saga's sleep", context=cluster.logs_tail
    )
    assert await _key_ids_in_history(cluster, saga_id) == {"k1"}
    cluster.kill("engine")
    assert cluster.procs["engine"].returncode == -signal.SIGKILL

    # Rotated: k2 encrypts from now on, k1 still decrypts the history written under it.
    start_engine(cluster, "k2", "k1", "k2")
    async with SagaClient(client_settings(cluster, "k2", "k1", "k2")) as client:
        await client.signal(saga_id, Vault.approval, Approval(note="after the rotation"))
        statuses = await cluster.wait_settled([saga_id])
        assert statuses == {saga_id: SagaStatus.COMPLETED}, cluster.log_tail("engine")
        output = await client.result(saga_id, timeout=10)
    assert output == {
        "receipts": [f"receipt-1-for-{CANARY}", f"receipt-2-for-{CANARY}"],
        "note": "after the rotation",
    }
    assert await _key_ids_in_history(cluster, saga_id) == {"k1", "k2"}
    # A process that holds only the new key cannot read the saga's history, and says so.
    async with SagaClient(client_settings(cluster, "k2", "k2")) as reader:
        with pytest.raises(CodecError, match=r"unknown_key.*'k1'"):
            await reader.result(saga_id, timeout=5)
