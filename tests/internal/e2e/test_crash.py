"""Crash tests: SIGKILL real engine and participant processes at deterministic points.

Each scenario starts real processes (an engine, three ledger participants) on the real
Kafka and Postgres, kills one at a chosen crash point, restarts it, and then checks,
in the participants' own tables, that every saga ended and no effect was applied twice.
"""

from __future__ import annotations

import random
import signal
from collections import Counter

import asyncpg
import pytest

from saga_engine import SagaStatus, saga_id_for
from saga_engine.client import SagaClient
from saga_engine.kernel._partitioning import partition_for
from tests.internal.e2e.app import PARTICIPANTS, Transfer, TransferRequest
from tests.internal.e2e.harness import Cluster

pytestmark = pytest.mark.integration

SEEDS = [11, 23]


async def _start_sagas(
    cluster: Cluster, seed: int, count: int = 6
) -> tuple[list[str], dict[str, str]]:
    rng = random.Random(seed)
    ids: list[str] = []
    failing: dict[str, str] = {}
    async with SagaClient(cluster.settings) as client:
        for i in range(count):
            # Every other saga is refused at a random later step, so it compensates.
            fail_at = rng.choice(PARTICIPANTS[1:]) if i % 2 else None
            saga_id = await client.start(
                Transfer,
                TransferRequest(amount=10 + i, fail_at=fail_at),
                idempotency_key=f"{seed}-{i}",
            )
            ids.append(saga_id)
            if fail_at:
                failing[saga_id] = fail_at
    return ids, failing


def _expected(ids: list[str], failing: dict[str, str]) -> dict[str, SagaStatus]:
    def outcome(saga_id: str) -> SagaStatus:
        if saga_id not in failing:
            return SagaStatus.COMPLETED
        # Refused at the first step, a saga has nothing to compensate: it fails.
        if failing[saga_id] == PARTICIPANTS[0]:
            return SagaStatus.FAILED
        return SagaStatus.COMPENSATED

    return {i: outcome(i) for i in ids}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    "point",
    [
        "before_send",  # the command-issued event is committed; the command is not produced
        "after_send",  # the command is produced
        "before_offset_commit",  # a reply's events are committed; the offset is not
        "before_send_compensation",  # in the middle of compensating
    ],
)
async def test_engine_killed_at_a_crash_point_recovers(
    participants_up: Cluster, point: str, seed: int
) -> None:
    cluster = participants_up
    hit = 1 + seed % 3
    cluster.start_engine("engine", crash_at=f"{point}:{hit}")
    ids, failing = await _start_sagas(cluster, seed)
    code = await cluster.wait_exit("engine")
    assert code == -signal.SIGKILL, cluster.log_tail("engine")
    assert f"crash point {point} reached" in cluster.log_tail("engine")

    cluster.start_engine("engine")
    statuses = await cluster.wait_settled(ids)
    assert statuses == _expected(ids, failing)
    await cluster.check_effects(statuses, failing)


@pytest.mark.parametrize("seed", SEEDS)
async def test_participant_killed_after_commit_before_reply_recovers(
    cluster: Cluster, seed: int
) -> None:
    # The first commit: commands are taken in batches, so how many commits six sagas
    # make depends on timing (at least one).
    for name in PARTICIPANTS:
        cluster.start_participant(name, crash_at="after_commit:1" if name == "beta" else None)
    cluster.start_engine("engine")
    ids, failing = await _start_sagas(cluster, seed)
    code = await cluster.wait_exit("participant-beta")
    assert code == -signal.SIGKILL
    cluster.start_participant("beta")
    statuses = await cluster.wait_settled(ids)
    assert statuses == _expected(ids, failing)
    await cluster.check_effects(statuses, failing)


# ---------------------------------------------------------------------- inside a batch
#
# The batch crash points are only passed by a batch of 2 or more commands (participant)
# or of 2 or more sagas with commands to send (engine). Each test below makes that batch
# form for sure: the messages are all waiting in the topic before the process that
# crashes starts, and every partition holds several of them, so its first fetch is a
# batch of several sagas whichever partitions it returns.

PER_PARTITION = 3


def _spread_keys(tag: str, partitions: int, per_partition: int = PER_PARTITION) -> list[str]:
    """Idempotency keys whose sagas put ``per_partition`` sagas on every partition (the
    inbox and the command topics are keyed by saga id)."""
    counts: Counter[int] = Counter()
    keys: list[str] = []
    i = 0
    while len(keys) < partitions * per_partition:
        key = f"{tag}-{i}"
        i += 1
        partition = partition_for(saga_id_for(Transfer.name, key), partitions)
        if counts[partition] < per_partition:
            counts[partition] += 1
            keys.append(key)
    return keys


async def _start_spread_sagas(
    cluster: Cluster, tag: str, *, alpha_refuses: bool = True
) -> tuple[list[str], dict[str, str]]:
    """A third complete, a third are refused by alpha (the first step: in the
    participant's batch, a refusal makes it run again with a savepoint per command) and a
    third by beta or gamma, so they compensate alpha's step. Without ``alpha_refuses``,
    the second third complete too."""
    later = PARTICIPANTS[1:]
    first = PARTICIPANTS[0] if alpha_refuses else None
    ids: list[str] = []
    failing: dict[str, str] = {}
    async with SagaClient(cluster.settings) as client:
        for i, key in enumerate(_spread_keys(tag, cluster.partitions)):
            fail_at = [None, first, later[i // 3 % len(later)]][i % 3]
            saga_id = await client.start(
                Transfer, TransferRequest(amount=10 + i, fail_at=fail_at), idempotency_key=key
            )
            ids.append(saga_id)
            if fail_at:
                failing[saga_id] = fail_at
    return ids, failing


async def _alpha_killed_in_its_first_batch(
    cluster: Cluster, tag: str, point: str, *, alpha_refuses: bool = True, batch: bool = False
) -> tuple[list[str], dict[str, str]]:
    """Sagas spread over every partition, their first commands all waiting in alpha's
    topic before alpha starts (its first fetch takes them as one batch), and alpha
    SIGKILLed at ``point`` in that batch; the other participants and the engine run."""
    for name in PARTICIPANTS[1:]:
        cluster.start_participant(name, batch_handlers=batch)
    cluster.start_engine("engine")
    ids, failing = await _start_spread_sagas(cluster, tag, alpha_refuses=alpha_refuses)
    await cluster.wait_commands("alpha", ids)
    cluster.start_participant("alpha", crash_at=f"{point}:1", batch_handlers=batch)
    code = await cluster.wait_exit("participant-alpha")
    log = cluster.log_tail("participant-alpha")
    assert code == -signal.SIGKILL, log
    assert f"crash point {point} reached" in log
    return ids, failing


async def test_participant_killed_after_a_batch_commit_before_its_replies_recovers(
    cluster: Cluster,
) -> None:
    # alpha (every saga's first step) stays down until the engine has sent it the first
    # command of every saga: its first fetch takes them as one batch. That wait is short
    # next to the step's 5 s timeout (and a re-sent command would be deduplicated).
    ids, failing = await _alpha_killed_in_its_first_batch(
        cluster, "participant-batch", "after_batch_commit"
    )
    # The batch's transaction committed its effects, but no reply went out: the engine
    # sent nothing to the next step.
    applied = await cluster.ledger("alpha")
    assert applied
    assert {r["kind"] for r in applied} == {"apply"}
    assert await cluster.commands_in_topic("beta") == []

    cluster.start_participant("alpha")
    statuses = await cluster.wait_settled(ids)
    assert statuses == _expected(ids, failing)
    await cluster.check_effects(statuses, failing)


async def test_participant_killed_between_its_optimistic_insert_and_commit_recovers(
    cluster: Cluster,
) -> None:
    # alpha's handlers keep every effect in their transaction: its first batch (the first
    # command of every saga, none refused) is claimed by the outcomes' insert alone. It
    # dies after that insert, before COMMIT: its writes and its outcome rows roll back.
    ids, failing = await _alpha_killed_in_its_first_batch(
        cluster, "optimistic", "after_optimistic_insert", alpha_refuses=False
    )
    assert await cluster.ledger("alpha") == []
    assert await _outcomes_stored(cluster, "alpha") == 0
    assert await cluster.commands_in_topic("beta") == []

    cluster.start_participant("alpha")
    statuses = await cluster.wait_settled(ids)
    assert statuses == _expected(ids, failing)
    # In alpha's own table: one apply per command, none lost, none twice.
    await cluster.check_effects(statuses, failing)
    assert await _outcomes_stored(cluster, "alpha") >= len(ids)


async def _outcomes_stored(cluster: Cluster, participant: str) -> int:
    conn = await asyncpg.connect(cluster.database_dsn)
    try:
        schema = cluster.participant_schema(participant)
        count = await conn.fetchval(f'SELECT count(*) FROM "{schema}".saga_processed_commands')
    finally:
        await conn.close()
    return int(count)


@pytest.mark.parametrize(
    "point",
    [
        "in_batch_handler",  # a batch handler returned, its transaction not committed
        # The same, past the optimistic insert of the outcomes (a batch handler's
        # refusals are returned, not raised: the first pass stays optimistic).
        "after_optimistic_insert",
        "after_batch_commit",  # the transaction committed, none of its replies sent
        "after_commit",  # the same point, as every transaction passes it
    ],
)
async def test_participant_with_batch_handlers_killed_in_a_batch_recovers(
    cluster: Cluster, point: str
) -> None:
    # As above, with every participant answering through batch handlers: alpha's first
    # fetch holds the first command of every saga, and one call of its Apply handler
    # answers them (refusing a third: those get no ledger row).
    ids, failing = await _alpha_killed_in_its_first_batch(
        cluster, f"batch-handlers-{point}", point, batch=True
    )
    applied = await cluster.ledger("alpha")
    if point in ("in_batch_handler", "after_optimistic_insert"):
        assert applied == []  # died inside the transaction: all of it rolled back
    else:
        assert applied
        assert {r["kind"] for r in applied} == {"apply"}
    assert await cluster.commands_in_topic("beta") == []

    cluster.start_participant("alpha", batch_handlers=True)
    statuses = await cluster.wait_settled(ids)
    assert statuses == _expected(ids, failing)
    await cluster.check_effects(statuses, failing)


async def test_two_of_everything_with_batch_handlers_started_at_once(cluster: Cluster) -> None:
    # Two engines and two instances of each participant, answering through batch
    # handlers, all started at the same moment: the groups settle while the first
    # commands arrive, and every effect is still applied once.
    for name in PARTICIPANTS:
        for instance in ("", "-2"):
            cluster.start_participant(name, batch_handlers=True, instance=instance)
    cluster.start_engine("engine")
    cluster.start_engine("engine-2")
    ids, failing = await _start_spread_sagas(cluster, "two-of-everything")
    statuses = await cluster.wait_settled(ids)
    assert statuses == _expected(ids, failing)
    await cluster.check_effects(statuses, failing)
    # None of the eight processes died on the way (a crash would have been recovered from
    # by its twin, hiding it).
    assert {name: p.poll() for name, p in cluster.procs.items()} == dict.fromkeys(cluster.procs)


async def test_engine_killed_after_a_batch_append_before_its_sends_recovers(
    participants_up: Cluster,
) -> None:
    cluster = participants_up
    # The starts wait in the inbox before the engine runs: its first fetch takes them as
    # one batch, and every saga of it has its first command to send.
    ids, failing = await _start_spread_sagas(cluster, "engine-batch")
    cluster.start_engine("engine", crash_at="after_batch_append:1")
    code = await cluster.wait_exit("engine")
    log = cluster.log_tail("engine")
    assert code == -signal.SIGKILL, log
    assert "crash point after_batch_append reached" in log
    # The batch's sagas are durable, their first step issued; none of their commands was
    # sent (the engine creates a command topic before its first send there).
    durable = await cluster.statuses(ids)
    assert len(durable) >= 2
    assert set(durable.values()) == {SagaStatus.RUNNING}
    assert await cluster.commands_in_topic("alpha") == []

    cluster.start_engine("engine")
    statuses = await cluster.wait_settled(ids)
    assert statuses == _expected(ids, failing)
    await cluster.check_effects(statuses, failing)
