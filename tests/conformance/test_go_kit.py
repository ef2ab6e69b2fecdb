"""The Go participant kit (kits/go) in the suite: its own ``go test`` with the
integration tests on the real servers, and its conformance participant passing
``saga conformance``. Go modules come from the Go module proxy on first use."""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from saga_engine.conformance import CASE_NAMES, run_suite
from saga_engine.settings import KafkaSettings
from tests.conftest import PgTarget
from tests.go_kit import KIT, build_binary, running
from tests.integration.kafka_helpers import ensure_topics
from tests.participant.helpers import delete_topics
from tests.waiting import scaled

pytestmark = pytest.mark.integration

NAME = "conformance-go"


# The clock covers the tests only (func_only: the build above is outside it); their
# integration tests take about a minute on a busy two-core machine, and go test's own
# -timeout below is the inner bound.
@pytest.mark.timeout(420, func_only=True)
def test_go_test_runs_the_kit_s_unit_and_integration_tests(
    go_built: str, pg: PgTarget, kafka_bootstrap: str
) -> None:
    env = {**os.environ, "SAGA_TEST_KAFKA": kafka_bootstrap, "SAGA_TEST_PG_DSN": pg.database_dsn}
    done = subprocess.run(
        [go_built, "test", "-count=1", "-timeout", f"{scaled(360):.0f}s", "-v", "./..."],
        cwd=KIT,
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(400),
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    passed = set(re.findall(r"--- PASS: (TestIntegration\w+)", done.stdout))
    skipped = re.findall(r"--- SKIP: (\w+)", done.stdout)
    assert len(passed) >= 6, done.stdout[-3000:]
    assert skipped == []


@pytest.fixture
async def go_participant(
    go_built: str, pg: PgTarget, kafka_bootstrap: str, unique_id: str, tmp_path: Path
) -> AsyncIterator[KafkaSettings]:
    binary = await build_binary(
        go_built, "./cmd/conformance-participant", tmp_path / "conformance-participant"
    )
    kafka = KafkaSettings(
        bootstrap_servers=kafka_bootstrap,
        topic_prefix=f"g{unique_id}",
        partitions=2,
        max_message_bytes=8192,
    )
    await ensure_topics(
        kafka, [f"{kafka.topic_prefix}.{t}" for t in ("inbox", "dlq", f"cmd.{NAME}")], partitions=2
    )
    env = {
        **os.environ,
        "SAGA_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
        "SAGA_KAFKA__TOPIC_PREFIX": kafka.topic_prefix,
        "SAGA_KAFKA__PARTITIONS": "2",
        "SAGA_KAFKA__MAX_MESSAGE_BYTES": str(kafka.max_message_bytes),
        "SAGA_PG__DSN": pg.database_dsn,
        "SAGA_PARTICIPANT__NAME": NAME,
        "SAGA_PARTICIPANT__SCHEMA": f"go_{uuid.uuid4().hex[:10]}",
        "SAGA_PARTICIPANT__INSTANCE_ID": f"{NAME}-{unique_id}",
    }
    try:
        async with running(binary, env):
            yield kafka
    finally:
        await delete_topics(kafka_bootstrap, kafka.topic_prefix)


# Two runs of the suite, each of up to a few of its 30 s case deadlines; the builds in the
# fixtures are outside the clock (bounded on their own).
@pytest.mark.timeout(300, func_only=True)
async def test_the_go_kit_passes_every_conformance_case(go_participant: KafkaSettings) -> None:
    kafka = go_participant
    for _ in range(2):  # twice on one database: each run's effects are its own
        report = await run_suite(
            kafka.bootstrap_servers,
            NAME,
            prefix=kafka.topic_prefix,
            max_message_bytes=kafka.max_message_bytes,
            timeout_s=30,
        )
        failed = {r.name: r.detail for r in report.results if not r.passed}
        assert not failed, failed
        assert [r.name for r in report.results] == list(CASE_NAMES)
