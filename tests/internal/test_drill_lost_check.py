"""The drill's "no saga lost" check: every saga terminal, or parked with a non-empty
reason, read from its history (or its record's error) and printed in the detail."""

from __future__ import annotations

from datetime import UTC, datetime

from saga_engine.cli._drill_checks import _lost, parked_reason
from saga_engine.core.history._events import (
    CompensationStuck,
    ErrorInfo,
    Event,
    SagaParked,
    StepParked,
)
from saga_engine.core.history._status import SagaStatus
from saga_engine.store._store import LoadedSaga, SagaRecord, StoredEvent

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _loaded(status: SagaStatus, *events: Event, error: dict[str, str] | None = None) -> LoadedSaga:
    record = SagaRecord(
        saga_id="s",
        saga_type="t",
        status=status,
        last_seq=len(events),
        created_at=T0,
        updated_at=T0,
        error=error,
    )
    return LoadedSaga(record, [StoredEvent(i + 1, e) for i, e in enumerate(events)])


def _error(message: str) -> ErrorInfo:
    return ErrorInfo(type="StepFailed", message=message)


def test_the_reason_is_the_last_parking_events_message() -> None:
    stuck = CompensationStuck(at=T0, step="reserve-credit", error=_error(" ledger down "))
    parked = StepParked(at=T0, step="pay", error=_error("card refused"))
    loaded = _loaded(SagaStatus.STEP_STUCK, stuck, parked)
    assert parked_reason(loaded) == "step_parked: card refused"
    replay = SagaParked(at=T0, error=_error("history diverged at seq 4"))
    assert "history diverged" in parked_reason(_loaded(SagaStatus.NONDETERMINISTIC, replay))


def test_an_empty_message_falls_back_to_the_records_error_then_to_nothing() -> None:
    blank = CompensationStuck(at=T0, step="reserve-credit", error=_error("   "))
    fallback = _loaded(SagaStatus.COMPENSATION_STUCK, blank, error={"message": "timed out"})
    assert parked_reason(fallback) == "timed out"
    assert parked_reason(_loaded(SagaStatus.COMPENSATION_STUCK, blank)) == ""
    assert parked_reason(_loaded(SagaStatus.COMPENSATION_STUCK, error={"message": ""})) == ""


def test_a_parked_saga_passes_with_its_reason_printed_and_fails_without_one() -> None:
    statuses = {
        "a": SagaStatus.COMPLETED,
        "b": SagaStatus.COMPENSATION_STUCK,
        "c": SagaStatus.COMPENSATED,
    }
    check = _lost(["a", "b", "c"], statuses, {"b": "compensation_stuck: ledger down"})
    assert check.ok, check
    assert "1 compensated, 1 compensation_stuck, 1 completed" in check.detail
    assert "b parked (compensation_stuck): compensation_stuck: ledger down" in check.detail
    for reasons in ({}, {"b": ""}, {"b": "  "}):
        check = _lost(["a", "b", "c"], statuses, reasons)
        assert not check.ok, reasons
        assert check.detail == "b: parked (compensation_stuck) without a reason"


def test_an_open_or_missing_saga_is_lost() -> None:
    check = _lost(["a", "b"], {"a": SagaStatus.RUNNING}, {})
    assert not check.ok
    assert check.detail == "a: still running; b: never started"
