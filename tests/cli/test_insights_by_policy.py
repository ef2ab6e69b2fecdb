"""`saga insights NAME --flow-policy N` and `--by-policy` against a real admin API over
HTTP: one flow policy's figures, and every policy's side by side."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from saga_engine.settings import AdminSettings, LimitsSettings, Settings
from tests.admin.sagas import Noop
from tests.admin.served import Served, served_in_thread
from tests.admin.test_insights import TimedTransfer
from tests.admin.test_insights_by_policy import seed_policies
from tests.cli.conftest import as_json, invoke, one_line_error


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    settings = Settings(
        admin=AdminSettings(host="127.0.0.1", port=0),
        limits=LimitsSettings.model_validate({"policies": {"2": {}}}),
    )
    with served_in_thread(settings, seed_policies, sagas=(TimedTransfer, Noop)) as running:
        yield running


def test_one_flow_policys_figures(served: Served) -> None:
    url = served.url
    every = invoke(["insights", "timed-transfer", "--window", "1d", "--admin-url", url])
    assert every.exit_code == 0, every.output
    assert "timed-transfer: 4 runs ended in the last 1d" in every.stdout
    assert "flow policies in the window: 1: 2 runs, 2: 2 runs (compare them: --by-policy)" in (
        every.stdout
    )
    two = invoke(
        ["insights", "timed-transfer", "--window", "1d", "--flow-policy", "2", "--admin-url", url]
    )
    assert two.exit_code == 0, two.output
    assert "timed-transfer: 2 runs under flow policy 2 ended in the last 1d" in two.stdout
    assert "compensated 1, completed 1" in two.stdout
    assert served.seeded["two-slow"] in two.stdout  # the SLA's breach, policy 2's
    assert "account closed" in two.stdout
    args = ["insights", "timed-transfer", "--window", "1d", "--flow-policy", "1"]
    one = as_json(invoke([*args, "--admin-url", url, "--json"]))
    assert (one["flow_policy"], one["runs"], one["outcomes"]) == (1, 2, {"completed": 2})
    assert one["sla"]["breaching_runs"] == []


def test_every_flow_policy_side_by_side(served: Served) -> None:
    url = served.url
    shown = invoke(
        ["insights", "timed-transfer", "--window", "1d", "--by-policy", "--admin-url", url]
    )
    assert shown.exit_code == 0, shown.output
    text = shown.stdout
    assert "timed-transfer: 4 runs ended in the last 1d, by flow policy" in text
    lines = text.splitlines()
    [first] = [line for line in lines if line.startswith("│ 1 ")]
    assert "│ 2 " in first
    assert "50.0%" in first
    assert "completed 2" in first
    [second] = [line for line in lines if line.startswith("│ 2 ")]
    assert "compensated 1, completed 1" in second
    assert "p99 (1)" in text
    assert "held p99 (2)" in text
    [approve] = [line for line in lines if "signal:approve" in line]
    assert approve.split("│")[2].strip() == "-"  # policy 1's runs never waited for it
    args = ["insights", "timed-transfer", "--window", "1d", "--by-policy"]
    body = as_json(invoke([*args, "--admin-url", url, "--json"]))
    assert [p["version"] for p in body["policies"]] == [1, 2]
    assert [p["runs"] for p in body["policies"]] == [2, 2]


def test_bad_flow_policies_are_one_line(served: Served) -> None:
    url = served.url
    for value in ("0", "10001"):
        refused = invoke(["insights", "timed-transfer", "--flow-policy", value, "--admin-url", url])
        assert "flow_policy" in one_line_error(refused, 5)
    both = invoke(
        ["insights", "timed-transfer", "--flow-policy", "2", "--by-policy", "--admin-url", url]
    )
    assert "--by-policy" in one_line_error(both, 1)
    missing = invoke(["insights", "nope", "--by-policy", "--admin-url", url])
    assert "nope" in one_line_error(missing, 3)
