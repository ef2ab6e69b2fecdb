"""Committed histories must keep replaying with today's code (and the bad one must not)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from saga_engine import NondeterminismError, Saga, SagaStatus, SerializationError
from saga_engine.cli import app
from saga_engine.events import EVENT_TYPES, SagaStarted
from saga_engine.replay import export_history, load_history, replay
from saga_engine.testing import SagaTestEnv
from tests.sagas import KycCheck, MonthlyBilling, PlaceOrder, RaceCheckout, WaitCheckout

HISTORIES = Path(__file__).parent / "histories"
GOOD = sorted(p for p in HISTORIES.glob("*.json") if not p.name.endswith(".BAD.json"))
BAD = sorted(HISTORIES.glob("*.BAD.json"))
#: The sagas the goldens were recorded by.
SAGAS: list[type[Saga[Any, Any]]] = [
    PlaceOrder,
    RaceCheckout,
    WaitCheckout,
    KycCheck,
    MonthlyBilling,
]
#: The callbacks' goldens were signed with the testing kit's key (their URLs, carried by
#: a step's command, must derive the same on replay).
CALLBACK_KEYS = SagaTestEnv([]).settings.callbacks


def test_the_goldens_cover_both_ends_a_signal_and_a_timer() -> None:
    """What the goldens protect: a saga that completes, one that compensates, a signal
    received and a timer fired, recorded by older code (a regeneration that loses one of
    these paths fails here, not silently)."""
    kinds = {e["kind"] for path in GOOD for e in orjson.loads(path.read_bytes())["events"]}
    ends = {load_history(path).events[-1].kind for path in GOOD}
    assert {"saga_completed", "saga_compensated"} <= ends
    assert {"signal_received", "timer_fired", "compensation_completed"} <= kinds
    # A race's loser given up and refunded (issue 41), a callback answered.
    assert {"step_abandoned", "callback_awaited", "callback_received"} <= kinds
    # A saga that continued as new, its compensations carried across runs (issue 41).
    assert "run_continued" in kinds


@pytest.mark.parametrize("path", GOOD, ids=lambda p: p.stem)
def test_golden_history_replays_deterministically(path: Path) -> None:
    history = load_history(path)
    result = replay(SAGAS, history, callbacks=CALLBACK_KEYS)
    assert result.deterministic, result.error
    assert result.status.is_terminal
    # The recorded terminal event agrees with the replayed status.
    assert history.events[-1].kind == f"saga_{result.status.value}"


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.stem)
def test_bad_history_is_refused_with_the_divergence(path: Path) -> None:
    result = replay([PlaceOrder], load_history(path))
    assert not result.deterministic
    # The history is of a finished saga: the divergence is reported, and it stays finished.
    assert result.status == SagaStatus.COMPLETED
    assert isinstance(result.error, NondeterminismError)
    assert result.error.seq == 2
    assert "reserve-funds" in result.error.expected
    assert "reserve-credit" in result.error.actual


def test_there_is_a_golden_history_per_version_of_each_versioned_event() -> None:
    """An event type at version N has goldens storing it at every version 1..N: those
    written before a change of its shape must keep loading (through the upcasters) and
    replaying. A version-1 event is stored without ``_v``."""
    stored: dict[str, set[int]] = {}
    for path in GOOD:
        for event in orjson.loads(path.read_bytes())["events"]:
            stored.setdefault(event["kind"], set()).add(event.get("_v", 1))
    for event_type in EVENT_TYPES:
        kind = event_type.kind
        if event_type.version > 1:
            assert stored.get(kind, set()) >= set(range(1, event_type.version + 1)), kind
    assert SagaStarted.version == 2
    # Every start recorded before saga versions ran version 1 of its type.
    for path in GOOD:
        first = load_history(path).events[0]
        assert isinstance(first, SagaStarted)
        assert first.saga_version == 1


def test_export_round_trips() -> None:
    history = load_history(GOOD[0])
    doc = export_history(history.saga_id, history.saga_type, history.events)
    again = load_history(orjson.dumps(doc))
    assert again == history


def test_malformed_exports_are_refused() -> None:
    with pytest.raises(SerializationError, match="not a saga history export"):
        load_history(b'{"events": []}')
    with pytest.raises(SerializationError, match="malformed JSON"):
        load_history(b"{nope")
    doc = orjson.loads(GOOD[0].read_bytes())
    doc["events"][1]["seq"] = 7
    with pytest.raises(SerializationError, match="sequence numbers"):
        load_history(doc)


runner = CliRunner()


def test_cli_replay_reports_deterministic() -> None:
    result = runner.invoke(app, ["replay", str(GOOD[-1]), "--sagas", "tests.sagas"])
    assert result.exit_code == 0, result.output
    assert "deterministic" in result.output


def test_cli_replay_reads_the_callback_keys_from_the_settings() -> None:
    answered = str(HISTORIES / "callback-kyc-answered.json")
    secret = CALLBACK_KEYS.keys["test"].get_secret_value()
    keys = {"SAGA_CALLBACKS__KEYS": orjson.dumps({"test": secret}).decode()}
    result = runner.invoke(app, ["replay", answered, "--sagas", "tests.sagas"], env=keys)
    assert result.exit_code == 0, result.output
    unsigned = runner.invoke(app, ["replay", answered, "--sagas", "tests.sagas"])
    assert unsigned.exit_code == 1
    assert "callback key 'test' is not configured here" in " ".join(unsigned.output.split())


def test_cli_replay_reports_the_first_divergence_and_exits_1() -> None:
    result = runner.invoke(app, ["replay", str(BAD[0]), "--sagas", "tests.sagas", "--json"])
    assert result.exit_code == 1
    report = orjson.loads(result.stdout)
    assert report["deterministic"] is False
    assert "event #2" in report["error"]


def test_cli_errors_are_one_line() -> None:
    result = runner.invoke(app, ["replay", str(GOOD[0]), "--sagas", "no_such_module"])
    assert result.exit_code == 1
    assert "cannot import saga module 'no_such_module'" in result.stderr
    assert "Traceback" not in result.output + result.stderr


def test_a_race_replays_to_the_same_winner_and_one_refund() -> None:
    """The winner is the first input in history (the timer): the replay from the stored
    JSON gives the same output, and the capture it gave up is refunded exactly once."""
    for name in ("race-checkout-expired", "wait-checkout-expired"):
        history = load_history(HISTORIES / f"{name}.json")
        result = replay(SAGAS, history)
        assert result.deterministic, result.error
        assert result.status == SagaStatus.COMPLETED
        done = history.events[-1]
        assert done.output["outcome"] == "expired"  # type: ignore[union-attr]
        kinds = [(e.kind, getattr(e, "step", None)) for e in history.events]
        assert kinds.count(("compensation_issued", "capture")) == 1
        assert kinds.count(("compensation_completed", "capture")) == 1
        assert kinds.index(("step_abandoned", "capture")) == 1 + kinds.index(("timer_fired", None))


def test_a_race_recorded_before_steps_were_given_up_replays_as_it_ran() -> None:
    """An ``asyncio.wait`` race an older engine recorded: its cancelled capture left owed
    (no ``step_abandoned``, no refund). Today's code replays it as it ran, recording
    nothing new: a history is never rewritten by an upgrade."""
    history = load_history(HISTORIES / "wait-checkout-before-step-abandoned.json")
    assert not any(e.kind == "step_abandoned" for e in history.events)
    result = replay(SAGAS, history)
    assert result.deterministic, result.error
    assert result.status == SagaStatus.COMPLETED
