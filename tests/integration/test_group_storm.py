"""Instances started at the same instant settle into one consumer-group generation (issue 22).

Two or three instances of a participant, or of an engine, start together (one gather:
as a deployment with several replicas starts them) on a fresh group and topics. Each
round must settle within 3 generations, and every instance must then do work: commands
processed by every participant instance, sagas started by every engine. 20 rounds for
each size; the rounds run a few at a time, each with a group and topics of its own, each
still starting its members at one instant.

Before the fix (aiokafka sent one JoinGroup per assignor offered, see
``_kafka.make_group_consumer``) a round stormed through generations every ~100 ms and never
started, in about one round out of five.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest
from aiokafka import AIOKafkaProducer
from pydantic import BaseModel, SecretStr

from saga_engine import Saga, SagaContext, Settings
from saga_engine.client import SagaClient
from saga_engine.participant import Participant, Transaction
from saga_engine.protocol import Topics, encode, partition_for
from saga_engine.settings import (
    AdminSettings,
    KafkaSettings,
    ParticipantSettings,
    PostgresSettings,
)
from saga_engine.worker import SagaWorker
from tests.conftest import PgTarget
from tests.participant.helpers import command
from tests.waiting import eventually, scaled

pytestmark = pytest.mark.integration

ROUNDS = 20
#: Rounds run at once (each its own group and topics): keeps the test near a minute on
#: two shared cores, while each round still starts all its members at one instant.
AT_ONCE = 5
PARTITIONS = 6
MAX_GENERATIONS = 3
#: How long a round's members may take to start and settle: generous, because on a busy
#: two-core machine fifteen group members joining in one process take tens of seconds.
SETTLE_S = 60.0
#: A round whose members had not all started (got a first assignment) within SETTLE_S.
NEVER = 1_000_000

T = TypeVar("T")


class Seat(BaseModel):
    n: int


class Nothing(BaseModel):
    pass


class Instant(Saga[Nothing, Nothing]):
    """Completes at once: an engine that starts it has consumed its inbox."""

    name = "instant"

    async def run(self, ctx: SagaContext, input: Nothing) -> Nothing:
        return Nothing()


def _generation(instance: Any) -> int:
    watch = instance._watch
    assert watch is not None, "the instance did not start its group watch"
    watch.sample()  # now, not at its last tick
    return int(watch.generation)


async def _rounds(run_one: Callable[[], Awaitable[T]]) -> list[T]:
    results: list[T] = []
    for _ in range(ROUNDS // AT_ONCE):
        results += await asyncio.gather(*(run_one() for _ in range(AT_ONCE)))
    return results


async def _started(starts: list[Awaitable[None]]) -> bool:
    """Runs the starts at one instant; False if they did not all return in time (a
    start returns once its member has its first assignment)."""
    try:
        async with asyncio.timeout(scaled(SETTLE_S)):
            await asyncio.gather(*starts)
    except TimeoutError:
        return False
    return True


async def _stop_all(instances: Sequence[Any]) -> None:
    await asyncio.gather(*(i.stop() for i in instances), return_exceptions=True)


# --------------------------------------------------------------------------- participants


def _seats(settings: Settings) -> tuple[Participant, list[int]]:
    participant = Participant("seats", settings, stop_timeout_s=2.0)
    handled: list[int] = []

    @participant.handles(Seat)
    async def seat(cmd: Seat, tx: Transaction) -> None:
        handled.append(cmd.n)

    return participant, handled


async def _participant_round(pg: PgTarget, bootstrap: str, n: int, locks: Path) -> int:
    prefix = f"storm{uuid.uuid4().hex[:10]}"
    settings = Settings(
        kafka=KafkaSettings(
            bootstrap_servers=bootstrap,
            topic_prefix=prefix,
            partitions=PARTITIONS,
            instance_lock_dir=str(locks),
        ),
        participant=ParticipantSettings(dsn=SecretStr(pg.database_dsn), db_schema=pg.schema),
    )
    instances = [_seats(settings) for _ in range(n)]
    try:
        if not await _started([p.start() for p, _ in instances]):
            return NEVER
        # One command per partition: each instance owns some, so each must handle some.
        topic = Topics.of(settings.kafka).commands("seats")
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        try:
            for partition in range(PARTITIONS):
                key, value, headers = encode(command("Seat", {"n": partition}))
                await producer.send_and_wait(
                    topic, value, key=key, headers=headers, partition=partition
                )
        finally:
            await producer.stop()

        def each_handled() -> bool:
            done = sorted(x for _, handled in instances for x in handled)
            return done == list(range(PARTITIONS)) and all(h for _, h in instances)

        await eventually(each_handled, timeout=SETTLE_S)
        return max(_generation(p) for p, _ in instances)
    finally:
        await _stop_all([p for p, _ in instances])


@pytest.mark.timeout(600)  # four batches of rounds, each bounded by SETTLE_S on a busy machine
@pytest.mark.parametrize("n", [2, 3])
async def test_participant_instances_started_together_settle(
    pg: PgTarget, kafka_bootstrap: str, tmp_path: Path, n: int
) -> None:
    started = time.monotonic()
    generations = await _rounds(lambda: _participant_round(pg, kafka_bootstrap, n, tmp_path))
    assert max(generations) <= MAX_GENERATIONS, generations
    print(f"{n} participants: generations {generations} in {time.monotonic() - started:.1f}s")


# --------------------------------------------------------------------------- engines


async def _engine_round(pg: PgTarget, bootstrap: str, n: int, locks: Path) -> int:
    tag = uuid.uuid4().hex[:10]
    settings = Settings(
        pg=PostgresSettings(dsn=pg.database_dsn, db_schema=pg.schema),
        kafka=KafkaSettings(
            bootstrap_servers=bootstrap,
            topic_prefix=f"storm{tag}",
            group_id=f"engines-{tag}",
            partitions=PARTITIONS,
            instance_lock_dir=str(locks),
        ),
        admin=AdminSettings(enabled=False, port=0),
    )
    workers = [SagaWorker(settings, [Instant]) for _ in range(n)]
    client = SagaClient(settings)
    try:
        if not await _started([w.start() for w in workers]):
            return NEVER
        # A saga per partition: each engine owns some partitions, so each starts some.
        keys: dict[int, str] = {}
        while len(keys) < PARTITIONS:
            key = uuid.uuid4().hex
            keys.setdefault(partition_for(key, PARTITIONS), key)
        await client.start_client()
        for key in keys.values():
            await client.start(Instant, Nothing(), saga_id=key)

        def each_started() -> bool:
            return all(
                w.engine is not None and w.parts.stats.counts["sagas_started"] > 0 for w in workers
            )

        await eventually(each_started, timeout=SETTLE_S)
        return max(_generation(w) for w in workers)
    finally:
        with contextlib.suppress(Exception):
            await client.close()
        await _stop_all(workers)


@pytest.mark.timeout(600)  # four batches of rounds, each bounded by SETTLE_S on a busy machine
@pytest.mark.parametrize("n", [2, 3])
async def test_engines_started_together_settle(
    pg: PgTarget, kafka_bootstrap: str, tmp_path: Path, n: int
) -> None:
    started = time.monotonic()
    generations = await _rounds(lambda: _engine_round(pg, kafka_bootstrap, n, tmp_path))
    assert max(generations) <= MAX_GENERATIONS, generations
    print(f"{n} engines: generations {generations} in {time.monotonic() - started:.1f}s")
