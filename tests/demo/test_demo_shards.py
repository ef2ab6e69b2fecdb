"""The demo past one database (``make demo-shards``): the engine's store on two shards on
two Postgres clusters, a range moved while the scenario runs, every expectation held."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services_demo.demo_kit import Demo, Target
from services_demo.run import DemoShard, DemoStack
from services_demo.scenario import run_scenarios
from services_demo.shard_move import ShardMove
from tests.conftest import PgTarget
from tests.demo.conftest import APPROVAL_TIMEOUT_S, stack_config
from tests.demo.test_demo import EXPECTED, SAGAS

pytestmark = pytest.mark.integration


@pytest.fixture
async def sharded_stack(
    pg: PgTarget,
    pg_shard_databases: tuple[str, ...],
    kafka_bootstrap: str,
    unique_id: str,
    tmp_path: Path,
) -> AsyncIterator[DemoStack]:
    config = stack_config(pg, kafka_bootstrap, unique_id, tmp_path)
    # Shard a on the first cluster (beside the control database), b on the second.
    config = dataclasses.replace(
        config,
        shards=(
            DemoShard("a", "0-1", pg.database_dsn),
            DemoShard("b", "2-3", pg_shard_databases[0]),
        ),
    )
    stack = DemoStack(config)
    try:
        await stack.start()
        yield stack
    finally:
        stack.stop()
        await stack.drop_data()


async def test_the_demo_on_two_shards_moves_a_range_and_every_expectation_holds(
    sharded_stack: DemoStack,
) -> None:
    async with Demo(Target.of_stack(sharded_stack), approval_timeout_s=APPROVAL_TIMEOUT_S) as demo:
        move = ShardMove(demo, sharded_stack)
        placed = {p.label: p for p in await run_scenarios(demo, move)}
        assert set(placed) == set(EXPECTED)
        for label, (order_status, saga_status, _) in EXPECTED.items():
            assert (placed[label].order["status"], placed[label].saga_status) == (
                order_status,
                saga_status,
            ), label
        found = await demo.on_saga_dbs("SELECT saga_id, saga_type, status FROM {schema}.sagas")
    assert set(found) == {"a", "b"}
    # The same sagas as on one database (tests/demo/test_demo.py), spread over both shards;
    # the moved partition's only in its target.
    rows = [row for shard in found.values() for row in shard]
    assert Counter((r["saga_type"], r["status"]) for r in rows) == SAGAS
    moved = {r["saga_id"] for r in rows if move.partition_of(r["saga_id"]) == move.partition}
    assert placed["approval timed out"].saga_id in moved
    assert moved <= {r["saga_id"] for r in found[move.target]}
    assert not moved & {r["saga_id"] for r in found[move.source]}
