"""`saga flow-policy show|rollout|clear` against a real admin API over HTTP, an engine
with two flow policies: the rollouts and their audit trail, a policy column in `saga
flow`, and the API's refusals on one line with their exit codes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from saga_engine.testing import SagaTestEnv
from tests.admin.conftest import OPERATOR_TOKEN, READER_TOKEN
from tests.admin.served import Served, served_in_thread
from tests.admin.test_flow_policies import with_policies
from tests.cli.conftest import as_json, invoke, one_line_error


async def _nothing(env: SagaTestEnv) -> dict[str, str]:
    return {}


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with served_in_thread(with_policies(port=0), _nothing) as running:
        yield running


def _env(token: str = OPERATOR_TOKEN) -> dict[str, str]:
    return {"SAGA_ADMIN_TOKEN": token}


def test_saga_flow_policy_rollout_show_and_clear(served: Served) -> None:
    url = ["--admin-url", served.url]
    shown = invoke(["flow-policy", "show", *url], _env(READER_TOKEN))
    assert shown.exit_code == 0, shown.output
    assert "no flow-policy rollout: every new saga runs under policy 1" in shown.stdout
    assert "participant ledger: concurrency adaptive" in shown.stdout
    set_ = invoke(
        ["flow-policy", "rollout", "--version", "2", "--percent", "25", "--reason", "try", *url],
        _env(),
    )
    assert set_.exit_code == 0, set_.output
    assert (
        "flow-policy rollout of every saga type set: 25% of new sagas (by saga id) run under "
        "flow policy 2" in " ".join(set_.stdout.split())
    )
    typed = as_json(
        invoke(
            [
                "flow-policy",
                "rollout",
                "--version",
                "2",
                "--percent",
                "100",
                "--saga-type",
                "noop",
                "--reason",
                "all noops",
                "--json",
                *url,
            ],
            _env(),
        )
    )
    assert [r["saga_type"] for r in typed["rollouts"]] == [None, "noop"]
    shown = invoke(["flow-policy", "show", *url], _env(READER_TOKEN))
    assert shown.exit_code == 0, shown.output
    assert "policy 2 at 25%" in shown.stdout
    assert "none -> policy 2 at 100%" in shown.stdout
    assert "olivia" in shown.stdout
    cleared = invoke(
        ["flow-policy", "clear", "--saga-type", "noop", "--reason", "done", *url], _env()
    )
    assert cleared.exit_code == 0, cleared.output
    assert "flow-policy rollout of noop cleared" in cleared.stdout
    view = as_json(invoke(["flow-policy", "show", "--limit", "1", "--json", *url], _env()))
    assert [r["saga_type"] for r in view["rollouts"]] == [None]
    assert [(c["saga_type"], c["reason"]) for c in view["audit"]] == [("flow:noop", "done")]
    flow = invoke(["flow", *url], _env(READER_TOKEN))
    assert flow.exit_code == 0, flow.output
    assert "policy" in flow.stdout  # several policies: a column for it


def test_saga_flow_policy_refusals_are_one_line_with_their_exit_codes(served: Served) -> None:
    url = ["--admin-url", served.url]
    base = ["flow-policy", "rollout", "--version", "2", "--reason", "x", *url]
    assert "percent" in one_line_error(invoke([*base, "--percent", "101"], _env()), 5)
    predicate = one_line_error(invoke([*base, "--percent", "0", "--predicate", "beta"], _env()), 5)
    assert "declares a rollout predicate 'beta'" in predicate
    missing = one_line_error(invoke([*base, "--percent", "1", "--saga-type", "nope"], _env()), 3)
    assert "no saga named 'nope'" in missing
    one_line_error(invoke([*base, "--percent", "1"], _env(READER_TOKEN)), 6)
    one_line_error(invoke(["flow-policy", "clear", "--reason", "x", *url], _env(READER_TOKEN)), 6)
    one_line_error(invoke(["flow-policy", "show", "--admin-url", "http://127.0.0.1:9"], _env()), 7)
