"""`saga retry / skip / force-compensate / resume` against a real admin API over HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from saga_engine.testing import SagaRun, SagaTestEnv
from tests.admin.conftest import OPERATOR_TOKEN, READER_TOKEN, admin_settings
from tests.admin.sagas import Credit, Refund, Transfer
from tests.admin.served import Served, served_in_thread
from tests.cli.conftest import as_json, invoke, one_line_error


async def seed(env: SagaTestEnv) -> dict[str, str]:
    """Sagas in the states the actions need."""
    ids = {
        name: await env.engine.start(
            Transfer, {"account": name, "amount": 1, "wait_for_approval": True}
        )
        for name in ("waiting", "waiting2")
    }
    ids["done"] = await env.engine.start(Transfer, {"account": "d", "amount": 1})
    await env.settle()
    for name in ("stuck", "stuck2", "stuck3"):
        env.participant("payee").on(Credit, reject="closed", times=1)
        env.participant("ledger").on(Refund, reject="locked", times=2)
        ids[name] = await env.engine.start(Transfer, {"account": name, "amount": 1})
        await env.run_until_settled(SagaRun(env, ids[name], Transfer))
    env.participant("payee").on(Credit, no_reply=True, times=1)  # its command is lost
    ids["lost"] = await env.engine.start(Transfer, {"account": "lost", "amount": 1})
    await env.settle()
    return ids


def test_retry_re_sends_a_step_waiting_for_its_reply(served: Served) -> None:
    ids, url = served.seeded, served.url
    refused = one_line_error(
        invoke(["retry", ids["lost"], "debit", "--reason", "r", "--admin-url", url], _env()), 4
    )
    # What is wrong, and what to do instead.
    assert "can be neither retried nor re-sent" in refused
    assert "re-send one of ['credit']" in refused
    assert "skip the step" in refused
    resent = as_json(
        invoke(
            ["retry", ids["lost"], "credit", "--reason", "lost", "--admin-url", url, "--json"],
            _env(),
        )
    )
    assert (resent["action"], resent["principal"]) == ("retry", "olivia")


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with served_in_thread(admin_settings(port=0), seed) as running:
        yield running


def _env(token: str = OPERATOR_TOKEN) -> dict[str, str]:
    return {"SAGA_ADMIN_TOKEN": token}


def test_retry_resume_and_skip_a_stuck_compensation(served: Served) -> None:
    ids, url = served.seeded, served.url
    retried = as_json(
        invoke(
            ["retry", ids["stuck"], "debit", "--reason", "unlocked", "--admin-url", url, "--json"],
            _env(),
        )
    )
    assert retried["action"] == "retry"
    assert retried["principal"] == "olivia"
    resumed = invoke(["resume", ids["stuck2"], "--reason", "unlocked", "--admin-url", url], _env())
    assert resumed.exit_code == 0, resumed.output
    assert f"resume {ids['stuck2']} by olivia: accepted, status compensating" in resumed.stdout
    skipped = as_json(
        invoke(
            [
                "skip",
                ids["stuck3"],
                "debit",
                "--result",
                '{"refunded": "by hand"}',
                "--reason",
                "refunded by hand",
                "--admin-url",
                url,
                "--json",
            ],
            _env(),
        )
    )
    assert skipped["action"] == "skip"
    assert skipped["status"] == "compensated"


def test_force_compensate_by_the_env_url(served: Served) -> None:
    env = {**_env(), "SAGA_ADMIN_URL": served.url}
    result = invoke(["force-compensate", served.seeded["waiting"], "--reason", "fraud"], env)
    assert result.exit_code == 0, result.output
    assert f"force-compensate {served.seeded['waiting']} by olivia" in result.stdout
    assert OPERATOR_TOKEN not in result.output


def test_refusals_are_the_apis_message_on_one_line(served: Served) -> None:
    ids, url = served.seeded, served.url
    conflict = one_line_error(
        invoke(["force-compensate", ids["done"], "--reason", "late", "--admin-url", url], _env()),
        4,
    )
    assert conflict.startswith("error: 409: ")
    assert f"saga {ids['done']} is completed" in conflict
    missing = one_line_error(
        invoke(["retry", "no-such-saga", "debit", "--reason", "r", "--admin-url", url], _env()),
        3,
    )
    assert missing.startswith("error: 404: ")
    reader = one_line_error(
        invoke(
            ["resume", ids["waiting2"], "--reason", "r", "--admin-url", url], _env(READER_TOKEN)
        ),
        6,
    )
    assert "403" in reader
    assert "operator" in reader
    assert READER_TOKEN not in reader
    anonymous = one_line_error(
        invoke(["resume", ids["waiting2"], "--reason", "r", "--admin-url", url], {}), 6
    )
    assert anonymous.startswith("error: 401: ")
    blank = one_line_error(
        invoke(["resume", ids["waiting2"], "--reason", " ", "--admin-url", url], _env()), 5
    )
    assert blank.startswith("error: 422: ")
    bad_json = one_line_error(
        invoke(
            ["skip", ids["waiting2"], "debit", "--result", "[1]", "--reason", "r"],
            {**_env(), "SAGA_ADMIN_URL": url},
        )
    )
    assert "--result must be a JSON object" in bad_json


def test_an_unreachable_admin_api_is_one_line_error() -> None:
    line = one_line_error(
        invoke(["resume", "x", "--reason", "r", "--admin-url", "http://127.0.0.1:1"], _env()), 7
    )
    assert "could not reach the admin API" in line
    debug = invoke(["--debug", "resume", "x", "--reason", "r", "--admin-url", "http://127.0.0.1:1"])
    assert debug.exit_code == 1
    assert debug.exception is not None
    assert debug.exc_info is not None
