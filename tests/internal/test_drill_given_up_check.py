"""The drill's "a step given up is undone once" check (issue 41): every step a saga's code
gave up in doubt had its compensation completed once, and its participant's ledger shows
it undone exactly once when it applied the step; the check is there only when some saga
under drill gave a step up."""

from __future__ import annotations

from typing import Any

from saga_engine.cli._drill_checks import _given_up
from saga_engine.core.history._events import CompensationCompleted, Event, StepAbandoned
from saga_engine.core.history._status import SagaStatus
from tests.internal.test_drill_lost_check import T0, _loaded


def _row(step: str, compensation: bool) -> dict[str, Any]:
    return {"saga_id": "s", "step": step, "compensation": compensation}


GIVEN_UP = StepAbandoned(at=T0, step="capture", command_ids=["c-1"], in_doubt=True)
UNDONE = CompensationCompleted(at=T0, step="capture")


def _check(status: SagaStatus, events: list[Event], rows: list[dict[str, Any]]) -> Any:
    return _given_up({"s": _loaded(status, *events)}, rows)  # type: ignore[arg-type]


def test_no_step_given_up_no_check() -> None:
    assert _check(SagaStatus.COMPLETED, [], [_row("capture", False)]) is None
    # Given up before anything was sent: nothing in doubt, nothing to check.
    quiet = StepAbandoned(at=T0, step="capture", in_doubt=False)
    assert _check(SagaStatus.COMPLETED, [quiet], []) is None


def test_an_applied_step_undone_once_passes() -> None:
    check = _check(
        SagaStatus.COMPLETED, [GIVEN_UP, UNDONE], [_row("capture", False), _row("capture", True)]
    )
    assert check.ok, check
    assert check.detail == "1 steps given up in doubt (1 applied), each undone once"
    # Never applied (its participant never got it): undone or not, nothing is wrong.
    assert _check(SagaStatus.COMPLETED, [GIVEN_UP, UNDONE], []).ok


def test_an_applied_step_never_undone_or_undone_twice_fails() -> None:
    applied = [_row("capture", False)]
    never = _check(SagaStatus.COMPLETED, [GIVEN_UP, UNDONE], applied)
    assert not never.ok
    assert "applied 1 time(s), undone 0 time(s)" in never.detail
    twice = _check(
        SagaStatus.COMPLETED, [GIVEN_UP, UNDONE], [*applied, *[_row("capture", True)] * 2]
    )
    assert not twice.ok
    no_end = _check(SagaStatus.COMPLETED, [GIVEN_UP], [*applied, _row("capture", True)])
    assert "its compensation completed 0 time(s)" in no_end.detail
    # Still running: its compensation may yet come.
    assert _check(SagaStatus.RUNNING, [GIVEN_UP], applied).ok
