"""Crash tests of continue-as-new (issue 41 §4): real engine and participant processes
on Postgres and Kafka, the engine SIGKILLed right after the append that holds the old
run's last event and the new run's first (``run_continued`` and the new run's command),
before or after that command is sent; the effects counted in the participants' own
tables (``continue_app.py``).

The old run's end and the new run's beginning are one event in one append, so a crash
can only fall before it (the reply is applied again after recovery, and continues again
to the same run) or after it (the new run is begun: the recovering engine loads it from
its ``run_continued`` and sends its command, under the same id). Either way each run is
recorded once and each run's step is applied once; a refused close reverts every run's
step once, last first, as one long run would.
"""

from __future__ import annotations

import signal
from collections import Counter

import pytest

from saga_engine import SagaStatus
from saga_engine.client import SagaClient
from saga_engine.events import CommandIssued, CompensationIssued, RunContinued
from saga_engine.replay import HistoryExport, replay
from saga_engine.store import PostgresEventStore
from tests.internal.e2e.continue_app import Looper, LoopRequest
from tests.internal.e2e.harness import Cluster
from tests.internal.e2e.test_graph_crash import _history

pytestmark = pytest.mark.integration

APP = "tests.internal.e2e.continue_app:SAGAS"
RUNS = 3


def _start_engine(cluster: Cluster, crash_at: str | None = None) -> None:
    extra = {"SAGA_CRASH_AT": crash_at} if crash_at else {}
    cluster._spawn(
        "engine", ["-m", "saga_engine", "worker", APP, "--log-level", "INFO"], cluster.env(**extra)
    )


async def _runs_loaded(cluster: Cluster, saga_id: str) -> tuple[list[int], int]:
    """The saga's runs as the store numbers them, and the events the engine loads."""
    store = await PostgresEventStore.connect(cluster.settings.pg)
    try:
        runs = await store.runs(saga_id)
        loaded = await store.load_run(saga_id)
    finally:
        await store.close()
    return [r.run for r in runs], len(loaded.events)


@pytest.mark.parametrize(
    ("point", "refuse_close"),
    [
        ("before_send:2", False),
        ("after_send:2", False),
        ("before_send:2", True),
    ],
    ids=["before-the-new-runs-command", "after-the-new-runs-command", "then-compensated"],
)
async def test_engine_killed_between_runs_loses_and_doubles_nothing(
    cluster: Cluster, point: str, refuse_close: bool
) -> None:
    for name in ("alpha", "beta"):
        cluster.start_participant(name)
    # Hit 1 is the start's command; hit 2 the append that continues into run 2.
    _start_engine(cluster, crash_at=point)
    async with SagaClient(cluster.settings) as client:
        saga_id = await client.start(Looper, LoopRequest(until=RUNS, refuse_close=refuse_close))
    code = await cluster.wait_exit("engine")
    log = cluster.log_tail("engine")
    assert code == -signal.SIGKILL, log
    assert f"crash point {point.partition(':')[0]} reached" in log

    # The old run's last event and the new run's first are durable together.
    history = await _history(cluster, saga_id)
    kinds = [e.kind for e in history]
    at = kinds.index("run_continued")
    assert kinds[at - 1 : at + 2] == ["reply_received", "run_continued", "command_issued"]

    _start_engine(cluster)
    want = SagaStatus.COMPENSATED if refuse_close else SagaStatus.COMPLETED
    assert await cluster.wait_settled([saga_id]) == {saga_id: want}, cluster.logs_tail()

    history = await _history(cluster, saga_id)
    # Each run recorded once, in order; the engine loads the last one alone.
    assert [e.run for e in history if isinstance(e, RunContinued)] == [2, 3]
    runs, loaded = await _runs_loaded(cluster, saga_id)
    assert runs == [1, 2, 3]
    assert loaded < len(history)
    # Each run's step applied once (its own command id, though its name is the same).
    applies = [e.command_id for e in history if isinstance(e, CommandIssued) and e.step == "apply"]
    assert len(set(applies)) == RUNS
    alpha = [r for r in await cluster.ledger("alpha") if r["saga_id"] == saga_id]
    per_command = Counter((r["command_id"], r["kind"]) for r in alpha)
    assert {c for (c, kind) in per_command if kind == "apply"} == set(applies)
    assert all(n == 1 for n in per_command.values()), per_command
    beta = [r for r in await cluster.ledger("beta") if r["saga_id"] == saga_id]
    assert [r["kind"] for r in beta] == ([] if refuse_close else ["apply"])
    reverts = [e for e in history if isinstance(e, CompensationIssued)]
    if refuse_close:
        # Every run's step reverted once, last run first: one long run's order.
        assert [e.payload["amount"] for e in reverts] == [2, 1, 0]
        reverted = sorted((r["at"], r["command_id"]) for r in alpha if r["kind"] == "revert")
        assert [c for _, c in reverted] == [e.command_id for e in reverts]
    else:
        assert reverts == []
    result = replay([Looper], HistoryExport(saga_id, Looper.name, history))
    assert result.deterministic, result.error
    assert result.status == want
