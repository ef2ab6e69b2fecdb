"""bench/graph.py, run small: it prints its figures as JSON, and its two sagas do the
same work (the same steps, participants and commands), the graph's only in another order."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime

import pytest

from bench.graph import code_first_saga, graph_saga, layout, main
from saga_engine.core.authoring._definition import SagaDefinition
from saga_engine.core.history._decision import Reply, StartSaga
from saga_engine.core.history._events import CommandIssued
from saga_engine.core.runtime._runtime import SagaRuntime


def test_the_bench_prints_both_figures_and_their_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    result = main(["--runs", "4", "--rounds", "2", "--layers", "2", "--width", "4"])
    printed = json.loads(capsys.readouterr().out)
    assert printed == result
    assert (printed["nodes"], printed["edges"]) == (8, 10)
    # saga_started, a command and its reply per node, saga_completed: for both.
    assert printed["events_per_saga"] == {"graph": 18, "code_first": 18}
    for kind in ("graph", "code_first"):
        assert printed[kind]["runs"] == 4
        assert len(printed[kind]["us_per_node_rounds"]) == 2
        assert printed[kind]["us_per_node_median"] > 0
    ratio = printed["graph"]["us_per_node_median"] / printed["code_first"]["us_per_node_median"]
    assert printed["graph_over_code_first"] == round(ratio, 3)


def _commands(saga: type) -> list[tuple[str, str, str]]:
    now = datetime.now(UTC)
    definition = SagaDefinition.of(saga)
    start = StartSaga(saga_id="s-1", saga_type=definition.name, input={}, at=now)
    runtime, decision = SagaRuntime.start(definition, start)
    waiting = list(decision.commands)
    while waiting:
        command = waiting.pop(0)
        waiting += runtime.handle(Reply(command.command_id, "success", now)).commands
    assert runtime.status.value == "completed"
    issued = [e for e in runtime.history if isinstance(e, CommandIssued)]
    runtime.close()
    return sorted((e.step, e.participant, json.dumps(e.payload, sort_keys=True)) for e in issued)


def test_the_graph_and_the_code_first_saga_send_the_same_commands() -> None:
    assert _commands(graph_saga(3, 5)) == _commands(code_first_saga(3, 5))


def test_each_node_runs_after_two_or_three_nodes_of_the_layer_before() -> None:
    rows = layout(5, 10)
    assert [len(row) for row in rows] == [10] * 5
    assert all(after == [] for _, after in rows[0])
    for before, row in itertools.pairwise(rows):
        names = {name for name, _ in before}
        for _, after in row:
            assert 2 <= len(after) <= 3
            assert set(after) <= names
