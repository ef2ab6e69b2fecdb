"""docs/operations.md's "Flow control" section holds as written: its Python examples
run (a limit of one serves the higher priority first; a budget holds heavy commands
while light ones flow, and refuses a cost above it; weights share a gate), and its
environment block is read by Settings into the limits it describes."""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from saga_engine.settings import FlowLimit, Settings
from tests.doc_blocks import ROOT, async_tests, code_blocks, exec_blocks

OPERATIONS = ROOT / "docs" / "operations.md"
SECTION = "## Flow control"


@pytest.mark.parametrize(
    ("index", "expected"),
    [
        (0, "test_a_limit_sends_the_higher_priority_first"),
        (1, "test_a_budget_holds_heavy_commands_while_light_ones_flow"),
        (2, "test_a_heavier_key_gets_its_weights_share"),
    ],
)
async def test_the_flow_control_examples_run(index: int, expected: str) -> None:
    blocks = code_blocks(OPERATIONS, "python", under=SECTION)
    assert len(blocks) == 3
    assert len(code_blocks(OPERATIONS, "python", under="### Costs and budgets")) == 1
    assert len(code_blocks(OPERATIONS, "python", under="### Weighted fairness")) == 1
    namespace: dict[str, Any] = {"__name__": "flow_control_example"}
    exec_blocks([blocks[index]], OPERATIONS, namespace)
    tests = async_tests(namespace)
    assert [t.__name__ for t in tests] == [expected]
    for test in tests:
        await test()


def test_the_flow_control_environment_is_what_settings_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (block, _) = code_blocks(OPERATIONS, "bash", under=SECTION)
    for line in block.code.splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        monkeypatch.setenv(name, shlex.split(value)[0])
    limits = Settings().limits
    assert limits.participants == {
        "payments": FlowLimit(concurrency=20, rate=50),
        "encoder": FlowLimit(budget={"cpu": 32, "memory_mb": 8192}),
        "inventory": FlowLimit(concurrency="adaptive", min_concurrency=2, max_concurrency=64),
    }
    assert limits.saga_types == {"checkout": FlowLimit(concurrency=100)}
    assert limits.aging_s == 10
    assert limits.cost_classes == {"heavy": {"cpu": 8, "memory_mb": 2048}}
    assert limits.fairness_weights == {"gold": 3, "*": 1}
    assert limits.enabled


def test_the_flow_policy_environment_is_what_settings_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (block,) = code_blocks(OPERATIONS, "bash", under="### Trying a flow policy on a share of sagas")
    for line in block.code.splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        monkeypatch.setenv(name, shlex.split(value)[0])
    limits = Settings().limits
    assert limits.versions == [1, 2]
    assert limits.policy(1).participants == {"payments": FlowLimit(concurrency=20)}
    two = limits.policy(2)
    assert two.participants == {
        "payments": FlowLimit(concurrency="adaptive", algorithm="aimd", max_concurrency=40)
    }
    assert two.learned_costs is False
    assert limits.policy(1).learned_costs is True
