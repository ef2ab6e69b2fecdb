"""`saga insights NAME [--window]` against a real admin API over HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from saga_engine.settings import AdminSettings, Settings
from tests.admin.sagas import Noop
from tests.admin.served import Served, served_in_thread
from tests.admin.test_insights import TimedTransfer
from tests.admin.test_web_insights import _seed
from tests.cli.conftest import as_json, invoke, one_line_error


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    settings = Settings(admin=AdminSettings(host="127.0.0.1", port=0))
    with served_in_thread(settings, _seed, sagas=(TimedTransfer, Noop)) as running:
        yield running


def test_insights_as_a_table_and_as_json(served: Served) -> None:
    url = served.url
    shown = invoke(["insights", "timed-transfer", "--window", "1d", "--admin-url", url])
    assert shown.exit_code == 0, shown.output
    text = shown.stdout
    assert "timed-transfer: 3 runs ended in the last 1d" in text
    assert "compensated 1, completed 2" in text
    assert "SLA 60s: 66.7% within, 1 breached" in text
    assert served.seeded["slow"] in text
    assert "account closed" in text
    for node in ("debit", "credit", "signal:approve"):
        assert node in text
    body = as_json(invoke(["insights", "timed-transfer", "--admin-url", url, "--json"]))
    assert body["window"] == "1h"
    assert [n["name"] for n in body["nodes"]] == ["debit", "credit", "signal:approve"]


def test_bad_input_is_one_line(served: Served) -> None:
    missing = one_line_error(invoke(["insights", "nope", "--admin-url", served.url]), 3)
    assert "nope" in missing
    one_line_error(invoke(["insights", "noop", "--window", "2h", "--admin-url", served.url]), 5)
