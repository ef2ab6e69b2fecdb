"""``saga drill --scenario broker-restart`` on a broker of the test's own (the project's
devstack on free ports, so the session's broker is never restarted): the drill runs the
given restart command while sagas flow, and every invariant holds. Without a command the
scenario is refused, saying what to give (as shard-down is without shards)."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import PgTarget
from tests.internal.e2e.test_drill import APP, ROOT, _drill, _report

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _devstack(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "devstack.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def own_broker(pg: PgTarget) -> Iterator[tuple[str, str]]:
    """A Kafka broker of this test's (bootstrap, the command that restarts it)."""
    kafka, controller = _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAGA_", "SAGA_DEV_"))}
    # Postgres is the session's (named, so nothing is started for it); Kafka is new.
    env.update(
        SAGA_PG__DSN=pg.database_dsn,
        SAGA_DEV_PG_PORT=str(_free_port()),
        SAGA_DEV_KAFKA_PORT=str(kafka),
        SAGA_DEV_KAFKA_CONTROLLER_PORT=str(controller),
    )
    up = _devstack(env, "up")
    assert up.returncode == 0, up.stderr
    restart = " ".join(
        [
            "env",
            f"SAGA_DEV_PG_PORT={env['SAGA_DEV_PG_PORT']}",
            f"SAGA_DEV_KAFKA_PORT={kafka}",
            f"SAGA_DEV_KAFKA_CONTROLLER_PORT={controller}",
            sys.executable,
            str(ROOT / "scripts" / "devstack.py"),
            "restart-kafka",
        ]
    )
    try:
        yield f"127.0.0.1:{kafka}", restart
    finally:
        _devstack(env, "down")
        shutil.rmtree(ROOT / ".dev" / f"kafka-{kafka}", ignore_errors=True)
        for leftover in (ROOT / ".dev").glob(f"*-{env['SAGA_DEV_PG_PORT']}-{kafka}-{controller}*"):
            leftover.unlink()


@pytest.mark.timeout(240)
async def test_a_broker_restarted_under_load_loses_and_doubles_nothing(
    pg: PgTarget, own_broker: tuple[str, str], unique_id: str, tmp_path: Path
) -> None:
    bootstrap, restart = own_broker
    args = [
        "--sagas",
        APP,
        "--participants",
        APP,
        "--scenario",
        "broker-restart",
        "--broker-restart",
        restart,
        "--sagas-per-second",
        "3",
        "--duration",
        "16",
        "--fault-every",
        "8",
        "--drain-timeout",
        "90",
    ]
    result = await asyncio.to_thread(_drill, pg, bootstrap, f"t{unique_id}", tmp_path, *args)
    report = _report(result)
    assert result.returncode == 0, (report, result.stderr[-3000:])
    assert len(report["faults"]) == 2, report["faults"]
    assert all(f.startswith("broker restarted by ") for f in report["faults"]), report["faults"]
    assert {c["name"]: c["ok"] for c in report["checks"]} == {
        "no saga lost": True,
        "no effect applied twice": True,
        "compensations only for applied steps, in reverse order": True,
        "every history replays": True,
    }, report["checks"]
    assert report["sagas"] == 48
    # The faults start once the engines make progress, the load when the drill starts: on
    # a slow start-up every saga can settle before the first restart, and then no progress
    # follows a fault and its timing is rightly absent. A saga still open at the last
    # restart (it settled after it) is progress after every restart, which must be timed.
    timings = report["timings"]
    if timings["drain_after_last_fault_s"]:
        assert timings["first_progress_after_fault_s"] is not None, timings
    else:
        assert timings["drain_after_last_fault_s"] == 0.0, timings


@pytest.mark.parametrize(
    ("scenario", "refusal"),
    [
        ("broker-restart", "broker-restart needs --broker-restart CMD"),
        # On one database: the scenario stops a shard, and there is none.
        ("shard-down", "shard-down needs a sharded deployment of two shards or more"),
    ],
)
async def test_a_scenario_without_what_it_needs_is_refused(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str, tmp_path: Path, scenario: str, refusal: str
) -> None:
    args = ["--sagas", APP, "--participants", APP, "--scenario", scenario]
    result = await asyncio.to_thread(_drill, pg, kafka_bootstrap, f"t{unique_id}", tmp_path, *args)
    assert result.returncode != 0
    assert refusal in result.stdout + result.stderr
