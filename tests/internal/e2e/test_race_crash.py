"""Crash tests of a race (issue 41): real engine and participant processes, the engine
SIGKILLed between the winner's input and the losers' undo, the effects counted in the
participants' own tables (``race_app.py``).

The capture's command goes out while its participant is down, so the timer wins. The
timer's firing, the capture given up (``step_abandoned``, in doubt) and its revert are
decided together and written in one append: a crash can fall before it (the timer fires
again on recovery) or after it, which is what these kill:

- before the revert is sent (``before_send_compensation``): the recovering engine sends
  it, the first time;
- after the revert is sent (``after_send``), before the engine settles: it is sent again,
  under the same command id.

Then the participants start: alpha applies the capture (late: its reply is dropped, the
forward path long decided) and reverts it, once; beta applies the notification once. The
saga completes with the timer's outcome and its history replays under the same code.
"""

from __future__ import annotations

import signal
from collections import Counter

import pytest

from saga_engine import SagaStatus
from saga_engine.client import SagaClient
from saga_engine.events import CompensationIssued, ReplyReceived, StepAbandoned, TimerFired
from saga_engine.protocol import command_id_for
from saga_engine.replay import HistoryExport, replay
from tests.internal.e2e.harness import Cluster
from tests.internal.e2e.race_app import RaceOrder, RaceTransfer
from tests.internal.e2e.test_graph_crash import _history

pytestmark = pytest.mark.integration

APP = "tests.internal.e2e.race_app:SAGAS"


def _start_engine(cluster: Cluster, crash_at: str | None = None) -> None:
    extra = {"SAGA_CRASH_AT": crash_at} if crash_at else {}
    cluster._spawn(
        "engine", ["-m", "saga_engine", "worker", APP, "--log-level", "INFO"], cluster.env(**extra)
    )


@pytest.mark.parametrize(
    ("point", "sent"),
    [("before_send_compensation:1", 1), ("after_send:2", 2)],
    ids=["before-the-revert-is-sent", "after-the-revert-is-sent"],
)
async def test_engine_killed_after_the_timer_won_the_capture_is_reverted_once(
    cluster: Cluster, point: str, sent: int
) -> None:
    # The participants are down: the capture's command waits in alpha's topic unanswered.
    _start_engine(cluster, crash_at=point)
    async with SagaClient(cluster.settings) as client:
        saga_id = await client.start(RaceTransfer, RaceOrder(amount=11, window_s=1.0))
    code = await cluster.wait_exit("engine")
    log = cluster.log_tail("engine")
    assert code == -signal.SIGKILL, log
    assert f"crash point {point.partition(':')[0]} reached" in log

    # The winner's input, the loser given up and its revert are durable together.
    history = await _history(cluster, saga_id)
    kinds = [e.kind for e in history]
    fired = kinds.index("timer_fired")
    assert kinds[fired : fired + 3] == ["timer_fired", "step_abandoned", "compensation_issued"]
    abandoned = next(e for e in history if isinstance(e, StepAbandoned))
    assert (abandoned.step, abandoned.in_doubt) == ("capture", True)
    assert [e.step for e in history if isinstance(e, CompensationIssued)] == ["capture"]
    assert any(isinstance(e, TimerFired) for e in history)
    # alpha's topic: the capture, and the revert only if the engine got to send it.
    assert len(await cluster.commands_in_topic("alpha")) == sent

    for name in ("alpha", "beta"):
        cluster.start_participant(name)
    _start_engine(cluster)
    assert await cluster.wait_settled([saga_id]) == {saga_id: SagaStatus.COMPLETED}, (
        cluster.logs_tail()
    )

    capture = command_id_for(saga_id, "capture", 0, compensation=False)
    revert = command_id_for(saga_id, "capture", 0, compensation=True)
    alpha = [r for r in await cluster.ledger("alpha") if r["saga_id"] == saga_id]
    # Applied late (its participant was down), and reverted: once each.
    assert Counter((r["command_id"], r["kind"]) for r in alpha) == {
        (capture, "apply"): 1,
        (revert, "revert"): 1,
    }
    beta = [r for r in await cluster.ledger("beta") if r["saga_id"] == saga_id]
    assert [r["kind"] for r in beta] == ["apply"]

    history = await _history(cluster, saga_id)
    assert history[-1].output == {"outcome": "expired"}
    # The capture's late reply changed nothing: dropped, never recorded.
    assert not [e for e in history if isinstance(e, ReplyReceived) and e.command_id == capture]
    assert [e.kind for e in history].count("compensation_completed") == 1
    result = replay([RaceTransfer], HistoryExport(saga_id, RaceTransfer.name, history))
    assert result.deterministic, result.error
    assert result.status == SagaStatus.COMPLETED
