from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.conftest import PgTarget
from tests.internal.e2e.app import PARTICIPANTS
from tests.internal.e2e.harness import Cluster


@pytest.fixture
async def cluster(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str, tmp_path: Path
) -> AsyncIterator[Cluster]:
    c = Cluster(
        database_dsn=pg.database_dsn,
        schema=pg.schema,
        bootstrap=kafka_bootstrap,
        prefix=f"t{unique_id}",
        logs=tmp_path,
    )
    await c.prepare()
    try:
        yield c
    finally:
        c.stop_all()
        await c.drop_participant_schemas()


@pytest.fixture
def participants_up(cluster: Cluster) -> Cluster:
    for name in PARTICIPANTS:
        cluster.start_participant(name)
    return cluster
