"""`saga retry --command`, `saga rerun` and `saga show` (pivot, parked steps, rerun link)
against a real admin API over HTTP (issue 26 §3, §6)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from saga_engine.testing import SagaRun, SagaTestEnv
from tests.admin.conftest import OPERATOR_TOKEN, admin_settings
from tests.admin.redrive_sagas import Order, Ship
from tests.admin.served import Served, served_in_thread
from tests.cli.conftest import as_json, invoke, one_line_error


async def seed(env: SagaTestEnv) -> dict[str, str]:
    """Orders whose ``ship`` step was refused and parked, one of them past its pivot."""
    ids = {}
    env.participant("shipping").on(Ship, reply={"to": "42 Main St"})
    for name, pivot in (("parked", False), ("pivoted", True), ("other", False)):
        env.participant("shipping").on(Ship, reject="no such address", times=1)
        ids[name] = await env.engine.start(
            Order, {"order": name, "amount": 3, "pivot": pivot}, idempotency_key=name
        )
        await env.run_until_settled(SagaRun(env, ids[name], Order))
    return ids


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with served_in_thread(admin_settings(port=0), seed, sagas=(Order,)) as running:
        yield running


ENV = {"SAGA_ADMIN_TOKEN": OPERATOR_TOKEN}


def test_show_says_where_the_pivot_is_and_a_cancel_past_it_is_refused(served: Served) -> None:
    ids, url = served.seeded, served.url
    shown = invoke(["show", ids["pivoted"], "--admin-url", url], ENV)
    assert shown.exit_code == 0, shown.output
    assert "charge (passed: it only goes forward)" in shown.stdout
    assert "parked steps" in shown.stdout
    refused = invoke(["cancel", ids["pivoted"], "--reason", "too late", "--admin-url", url], ENV)
    assert "past its pivot" in one_line_error(refused, 4)


def test_retry_with_an_edited_command(served: Served) -> None:
    ids, url = served.seeded, served.url
    bad = invoke(
        [
            "retry",
            ids["parked"],
            "ship",
            "--reason",
            "fix",
            "--command",
            '{"order": "parked"}',
            "--admin-url",
            url,
        ],
        ENV,
    )
    assert "address" in one_line_error(bad, 5)
    not_json = invoke(
        ["retry", ids["parked"], "ship", "--reason", "fix", "--command", "{", "--admin-url", url],
        ENV,
    )
    assert "--command is not valid JSON" in one_line_error(not_json)
    edited = '{"order": "parked", "address": "42 Main St"}'
    done = as_json(
        invoke(
            [
                "retry",
                ids["parked"],
                "ship",
                "--reason",
                "address fixed",
                "--command",
                edited,
                "--admin-url",
                url,
                "--json",
            ],
            ENV,
        )
    )
    assert (done["action"], done["principal"]) == ("retry", "olivia")
    history = invoke(["history", ids["parked"], "--admin-url", url], ENV)
    assert "with an edited command requested by olivia" in history.stdout


def test_rerun_starts_a_linked_saga(served: Served) -> None:
    ids, url = served.seeded, served.url
    args = [
        "rerun",
        ids["other"],
        "--reason",
        "once more",
        "--input",
        '{"order": "other", "amount": 4}',
        "--admin-url",
        url,
    ]
    first = invoke(args, ENV)
    assert first.exit_code == 0, first.output
    again = as_json(invoke([*args, "--json"], ENV))
    assert f"rerun of {ids['other']}: saga {again['saga_id']}" in first.stdout
    shown = as_json(invoke(["show", again["saga_id"], "--admin-url", url, "--json"], ENV))
    assert shown["rerun_of"]["saga_id"] == ids["other"]
    assert shown["input"]["amount"] == 4
    bad = invoke(
        ["rerun", ids["other"], "--reason", "x", "--input", '{"order": "o"}', "--admin-url", url],
        ENV,
    )
    assert "amount" in one_line_error(bad, 5)
