"""``saga cancel`` and ``saga signal`` say what happened (issue 39, 8.4): accepted (with
the note when what it decided is sent later), refused with the reason and its exit code,
or an unknown outcome with its own exit code (8) and what to look at."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.cli.conftest import invoke, one_line_error

URL = "http://admin.test"


def _answer(monkeypatch: pytest.MonkeyPatch, answer: httpx.Response | Exception) -> None:
    def request(method: str, url: str, **kwargs: Any) -> httpx.Response:
        if isinstance(answer, Exception):
            raise answer
        answer.request = httpx.Request(method, url)
        return answer

    monkeypatch.setattr(httpx, "request", request)


def test_a_cancel_recorded_and_sent_later_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    note = "recorded; what it decided could not be sent yet (broker away): it is owed"
    _answer(
        monkeypatch,
        httpx.Response(
            200,
            json={
                "saga_id": "s-1",
                "action": "cancel",
                "principal": "olivia",
                "status": "running",
                "outcome": "accepted",
                "note": note,
            },
        ),
    )
    result = invoke(["cancel", "s-1", "--reason", "r", "--admin-url", URL])
    assert result.exit_code == 0, result.output
    assert "cancel s-1 by olivia: accepted, status running; recorded" in result.stdout


def test_an_unknown_outcome_has_its_own_exit_code(monkeypatch: pytest.MonkeyPatch) -> None:
    _answer(
        monkeypatch,
        httpx.Response(
            503,
            json={
                "detail": "the cancel may or may not be recorded: ...",
                "error": "OutcomeUnknown",
            },
        ),
    )
    line = one_line_error(invoke(["cancel", "s-1", "--reason", "r", "--admin-url", URL]), 8)
    assert line.startswith("error: outcome unknown: the cancel may or may not be recorded")


def test_an_action_unanswered_in_time_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    _answer(monkeypatch, httpx.ReadTimeout("timed out"))
    result = invoke(["signal", "s-1", "approve", "--admin-url", URL])
    line = one_line_error(result, 8)
    assert "may or may not be recorded" in line
    assert "saga history" in line


def test_an_action_not_recorded_is_an_error_saying_send_it_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _answer(
        monkeypatch,
        httpx.Response(
            503,
            json={
                "detail": "the cancel is not recorded (x); nothing changed: send it again",
                "error": "TransientError",
            },
        ),
    )
    line = one_line_error(invoke(["cancel", "s-1", "--reason", "r", "--admin-url", URL]), 1)
    assert "not recorded" in line


def test_a_refused_action_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    _answer(
        monkeypatch,
        httpx.Response(
            409,
            json={
                "detail": "saga s-1 is completed; it accepts no cancel any more",
                "error": "InvalidTransition",
            },
        ),
    )
    line = one_line_error(invoke(["cancel", "s-1", "--reason", "r", "--admin-url", URL]), 4)
    assert "completed" in line
