"""`saga rollout show|set` against a real admin API over HTTP: the audit trail, and the
API's refusals on one line with their exit codes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from saga_engine.testing import SagaTestEnv
from tests.admin.conftest import OPERATOR_TOKEN, READER_TOKEN, admin_settings
from tests.admin.served import Served, served_in_thread
from tests.cli.conftest import as_json, invoke, one_line_error


async def _nothing(env: SagaTestEnv) -> dict[str, str]:
    return {}


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with served_in_thread(admin_settings(port=0), _nothing) as running:
        yield running


def _env(token: str = OPERATOR_TOKEN) -> dict[str, str]:
    return {"SAGA_ADMIN_TOKEN": token}


def test_set_then_show_with_the_audit_trail(served: Served) -> None:
    url = served.url
    dark = invoke(
        [
            "rollout",
            "set",
            "noop",
            "--version",
            "2",
            "--percent",
            "0",
            "--reason",
            "deploy v2 dark",
            "--admin-url",
            url,
        ],
        _env(),
    )
    assert dark.exit_code == 0, dark.output
    assert "rollout of noop set: version 2 is not deployed on this engine" in dark.stdout
    view = as_json(
        invoke(
            [
                "rollout",
                "set",
                "noop",
                "--version",
                "2",
                "--percent",
                "25",
                "--reason",
                "canary",
                "--admin-url",
                url,
                "--json",
            ],
            _env(),
        )
    )
    assert view["rollout"] == {"version": 2, "percent": 25, "predicate": None}
    shown = invoke(["rollout", "show", "noop", "--admin-url", url], _env(READER_TOKEN))
    assert shown.exit_code == 0, shown.output
    assert "v2 at 25%" in shown.stdout
    assert "v2 at 0% -> v2 at 25%" in shown.stdout
    assert "none (highest deployed) -> v2 at 0%" in shown.stdout
    assert "olivia" in shown.stdout
    every = as_json(invoke(["rollout", "show", "--admin-url", url, "--json"], _env(READER_TOKEN)))
    assert [v["saga_type"] for v in every] == ["noop", "transfer"]


def test_refusals_are_one_line_with_their_exit_codes(served: Served) -> None:
    url = served.url
    base = ["--reason", "x", "--admin-url", url]
    invalid = one_line_error(
        invoke(["rollout", "set", "transfer", "--version", "2", "--percent", "101", *base], _env()),
        5,
    )
    assert "percent" in invalid
    predicate = one_line_error(
        invoke(
            [
                "rollout",
                "set",
                "transfer",
                "--version",
                "1",
                "--percent",
                "0",
                "--predicate",
                "beta",
                *base,
            ],
            _env(),
        ),
        5,
    )
    assert "declares a rollout predicate 'beta'" in predicate
    missing = one_line_error(
        invoke(["rollout", "set", "nope", "--version", "2", "--percent", "1", *base], _env()), 3
    )
    assert "no saga named 'nope'" in missing
    one_line_error(
        invoke(
            ["rollout", "set", "transfer", "--version", "2", "--percent", "1", *base],
            _env(READER_TOKEN),
        ),
        6,
    )
    assert (
        as_json(invoke(["rollout", "show", "transfer", "--admin-url", url, "--json"], _env()))[
            "audit"
        ]
        == []
    )
