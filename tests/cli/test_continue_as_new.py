"""`saga history` of a saga that continued as new, against a real admin API over HTTP
(issue 41 §4): the current run and the chain of runs by default, every run with
``--all-runs``."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta

import pytest

from saga_engine.testing import SagaTestEnv
from tests.admin.conftest import READER_TOKEN, admin_settings
from tests.admin.served import Served, served_in_thread
from tests.cli.conftest import invoke
from tests.test_continue_as_new import Billing, Charge, Refund, Subscription


async def seed(env: SagaTestEnv) -> dict[str, str]:
    env.participant("payments").on(Charge, reply={}).on(Refund, reply={})
    run = await env.start(Subscription, Billing(until=3))
    for _ in range(3):
        await env.advance(timedelta(days=30))
    return {"saga_id": run.saga_id}


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with served_in_thread(admin_settings(port=0), seed, sagas=(Subscription,)) as running:
        yield running


ENV = {"SAGA_ADMIN_TOKEN": READER_TOKEN, "COLUMNS": "200"}


def _kinds(text: str) -> list[str]:
    """The kinds in the table's event column (the gist may repeat a kind)."""
    return re.findall(r"│ (saga_started|run_continued|saga_completed) +│", text)


def test_history_shows_the_current_run_and_the_chain(served: Served) -> None:
    saga_id, url = served.seeded["saga_id"], served.url
    shown = invoke(["history", saga_id, "--admin-url", url], ENV)
    assert shown.exit_code == 0, shown.output
    assert _kinds(shown.stdout) == ["saga_started", "run_continued", "saga_completed"]
    assert "runs: run 1 (" in shown.stdout
    assert "run 3 (" in shown.stdout
    assert "--all-runs shows every run" in shown.stdout
    every = invoke(["history", saga_id, "--all-runs", "--admin-url", url], ENV)
    assert every.exit_code == 0, every.output
    assert _kinds(every.stdout) == [
        "saga_started",
        "run_continued",
        "run_continued",
        "saga_completed",
    ]
    assert "--all-runs shows" not in every.stdout
