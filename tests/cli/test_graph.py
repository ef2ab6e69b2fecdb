"""`saga graph NAME`: a graph saga's declared graph as a table, as Graphviz dot
(``--dot``) and as JSON, read from a real admin API over HTTP or, with ``--sagas``, from
the saga classes (no engine); an unknown type and a saga written as code are one line."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from saga_engine.settings import AdminSettings, Settings
from saga_engine.testing import SagaTestEnv
from tests.admin.graph_sagas import Fulfil
from tests.admin.sagas import Noop, Transfer
from tests.admin.served import Served, served_in_thread
from tests.cli.conftest import as_json, invoke, one_line_error

DOT = """digraph "fulfil" {
  rankdir=LR;
  node [shape=box];
  "reserve" [label="reserve\\nstep → inventory"];
  "charge" [label="charge\\nstep → payments"];
  "label" [label="label\\nstep → shipping"];
  "gift" [label="gift\\nstep → wrapping", style=dashed, color=grey40];
  "lines" [label="lines\\neach → warehouse (≤ 5)", shape=box3d];
  "notify" [label="notify\\nstep → mailer", color=grey40];
  "reserve" -> "label";
  "charge" -> "label";
  "reserve" -> "gift";
  "reserve" -> "lines";
  "label" -> "notify";
  "lines" -> "notify";
}
"""


async def _nothing(env: SagaTestEnv) -> dict[str, str]:
    return {}


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    settings = Settings(admin=AdminSettings(host="127.0.0.1", port=0))
    with served_in_thread(settings, _nothing, sagas=(Fulfil, Transfer, Noop)) as running:
        yield running


def test_the_graph_as_a_table(served: Served) -> None:
    shown = invoke(["graph", "fulfil", "--admin-url", served.url])
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    assert "fulfil: the declared graph, in its order" in lines[0]
    rows = {
        line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
        for line in lines
        if line.startswith("│") and "node" not in line
    }
    assert list(rows) == ["reserve", "charge", "label", "gift", "lines", "notify"]
    assert rows["label"] == ["step", "shipping", "reserve, charge", "-", "yes", "-"]
    assert rows["gift"] == ["step", "wrapping", "reserve", "when", "no", "-"]
    assert rows["lines"] == ["each", "warehouse", "reserve", "≤ 5 items", "yes", "-"]
    assert rows["reserve"] == ["step", "inventory", "-", "-", "yes", "-"]
    assert rows["charge"] == ["step", "payments", "-", "-", "yes", "cpu=2"]


def test_the_graph_as_dot_and_json_from_the_api_and_from_the_classes(served: Served) -> None:
    remote = invoke(["graph", "fulfil", "--dot", "--admin-url", served.url])
    assert remote.exit_code == 0, remote.output
    assert remote.stdout == DOT
    local = invoke(["graph", "fulfil", "--dot", "--sagas", "tests.admin.graph_sagas"])
    assert local.exit_code == 0, local.output
    assert local.stdout == DOT
    body = as_json(invoke(["graph", "fulfil", "--json", "--admin-url", served.url]))
    assert body == Fulfil.graph.as_dict()
    assert as_json(invoke(["graph", "fulfil", "--json", "-s", "tests.admin.graph_sagas"])) == body


def test_an_unknown_type_or_a_saga_written_as_code_is_one_line(served: Served) -> None:
    missing = one_line_error(invoke(["graph", "nope", "--admin-url", served.url]), 3)
    assert "'nope'" in missing
    missing = one_line_error(invoke(["graph", "nope", "--sagas", "tests.admin.graph_sagas"]), 3)
    assert "'nope'" in missing
    code = one_line_error(invoke(["graph", "transfer", "--admin-url", served.url]))
    assert "written as code" in code
    code = one_line_error(invoke(["graph", "transfer", "--sagas", "tests.admin.sagas"]))
    assert "written as code" in code
