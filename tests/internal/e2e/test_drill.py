"""``saga drill`` on a real stack: a short drill of a healthy application passes every
check, and one with a participant that applies a command twice fails, naming it."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from saga_engine.cli._drill_checks import _compensations
from tests.conftest import PgTarget
from tests.doc_blocks import code_blocks

ROOT = Path(__file__).resolve().parents[3]
APP = "tests.internal.e2e.drill_app"
OPERATIONS = ROOT / "docs" / "operations.md"


def _doc_command(sagas: str = APP, scenario: str = "engine-kill") -> list[str]:
    """The ``saga drill`` command of docs/operations.md's "Drills" that drills ``sagas``
    (with ``scenario``, when the section has several for them), as its arguments."""
    found = [
        b
        for b in code_blocks(OPERATIONS, "bash", under="## Drills")
        if b.first_line.startswith(f"saga drill --sagas {sagas} ")
    ]
    if len(found) > 1:
        found = [b for b in found if f" --scenario {scenario} " in b.first_line]
    (block,) = found
    return shlex.split(block.code)[2:]


def _drill(
    pg: PgTarget,
    bootstrap: str,
    namespace: str,
    tmp: Path,
    *args: str,
    broken: bool = False,
    env_extra: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
    env.update(
        PYTHONPATH=str(ROOT),
        SAGA_PG__DSN=pg.database_dsn,
        SAGA_KAFKA__BOOTSTRAP_SERVERS=bootstrap,
        SAGA_KAFKA__PARTITIONS="4",
        **(env_extra or {}),
    )
    if broken:
        env["DRILL_APP_BROKEN"] = "1"
    command = [
        sys.executable,
        "-m",
        "saga_engine",
        "drill",
        "--namespace",
        namespace,
        "--json",
        *args,
    ]
    return subprocess.run(
        command, cwd=tmp, env=env, capture_output=True, text=True, timeout=170, check=False
    )


def _report(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    try:
        report: dict[str, Any] = json.loads(result.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"no JSON report (exit {result.returncode}):\n{result.stdout}\n{result.stderr}")
    return report


@pytest.mark.timeout(240)  # the drill's own bound (170 s) and the test's set-up around it
async def test_the_documented_engine_kill_drill_of_a_healthy_app_passes(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str, tmp_path: Path
) -> None:
    args = _doc_command()
    assert args[:4] == ["--sagas", APP, "--participants", APP]
    result = await asyncio.to_thread(_drill, pg, kafka_bootstrap, f"t{unique_id}", tmp_path, *args)
    report = _report(result)
    assert result.returncode == 0, report
    assert report["ok"] is True
    assert report["sagas"] == 60
    assert [f for f in report["faults"] if f.startswith("SIGKILL engine-")], report["faults"]
    assert {c["name"]: c["ok"] for c in report["checks"]} == {
        "no saga lost": True,
        "no effect applied twice": True,
        "compensations only for applied steps, in reverse order": True,
        "every history replays": True,
    }
    twice = next(c for c in report["checks"] if c["name"] == "no effect applied twice")
    # Three steps of each completed saga, two and their two compensations of each
    # compensated one; the refused step applied nothing and has no ledger row.
    assert twice["detail"] == f"{45 * 3 + 15 * 4} commands applied once each", twice
    lost = next(c for c in report["checks"] if c["name"] == "no saga lost")
    assert "15 compensated" in lost["detail"], lost
    assert "45 completed" in lost["detail"], lost
    # Measured from the kill to an engine's log line taking partitions it did not hold:
    # after the kill, and within a few session timeouts (6 s).
    assert 0 < report["timings"]["takeover_s"] < 30, report["timings"]
    assert report["timings"]["drain_after_last_fault_s"] is not None


async def test_a_mixed_drill_cuts_postgres_freezes_and_kills_and_nothing_breaks(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str, tmp_path: Path
) -> None:
    result = await asyncio.to_thread(
        _drill,
        pg,
        kafka_bootstrap,
        f"t{unique_id}",
        tmp_path,
        "--sagas",
        APP,
        "--participants",
        APP,
        "--scenario",
        "mix",
        "--duration",
        "17",
        "--sagas-per-second",
        "3",
        "--fault-every",
        "4",
    )
    report = _report(result)
    assert result.returncode == 0, report
    kinds = [f.split()[0] for f in report["faults"]]
    assert kinds == ["SIGKILL", "SIGKILL", "Postgres", "SIGSTOP"], report["faults"]
    assert all(c["ok"] for c in report["checks"]), report["checks"]


async def test_a_participant_that_applies_a_command_twice_fails_the_drill(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str, tmp_path: Path
) -> None:
    result = await asyncio.to_thread(
        _drill,
        pg,
        kafka_bootstrap,
        f"t{unique_id}",
        tmp_path,
        "--sagas",
        APP,
        "--participants",
        APP,
        "--scenario",
        "participant-kill",
        "--duration",
        "8",
        "--sagas-per-second",
        "2",
        "--fault-every",
        "4",
        broken=True,
    )
    report = _report(result)
    assert result.returncode == 1, report
    twice = next(c for c in report["checks"] if c["name"] == "no effect applied twice")
    assert twice["ok"] is False
    assert "(Do of saga " in twice["detail"], twice
    assert "applied 2 times" in twice["detail"], twice


def test_broker_restart_is_refused_when_the_drill_did_not_start_kafka(
    pg: PgTarget, tmp_path: Path
) -> None:
    result = _drill(
        pg,
        "127.0.0.1:1",
        "tnokafka",
        tmp_path,
        "--sagas",
        APP,
        "--participants",
        APP,
        "--scenario",
        "broker-restart",
    )
    assert result.returncode == 1
    said = result.stdout + result.stderr
    # The error says what to do (pass the restart command) and why it is needed.
    assert "broker-restart needs --broker-restart CMD" in said, said
    assert "the drill did not start that broker" in said, said


def test_compensations_out_of_reverse_order_or_of_unapplied_steps_break_the_check() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)

    def row(i: int, step: str, compensation: bool) -> dict[str, Any]:
        return {
            "saga_id": "s",
            "step": step,
            "compensation": compensation,
            "at": t0 + timedelta(seconds=i),
            "seq": i,
        }

    good = [row(0, "a", False), row(1, "b", False), row(2, "b", True), row(3, "a", True)]
    assert _compensations(good).ok  # type: ignore[arg-type]
    wrong_order = [row(0, "a", False), row(1, "b", False), row(2, "a", True), row(3, "b", True)]
    check = _compensations(wrong_order)  # type: ignore[arg-type]
    assert not check.ok
    assert "not ['b', 'a']" in check.detail
    unapplied = [row(0, "a", False), row(1, "c", True)]
    check = _compensations(unapplied)  # type: ignore[arg-type]
    assert not check.ok
    assert "never applied" in check.detail
