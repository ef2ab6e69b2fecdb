"""docs/operations.md's "Flow control" section holds as written: its Python example
runs (a limit of one serves the higher priority first), and its environment block is
read by Settings into the limits it describes."""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from saga_engine.settings import FlowLimit, Settings
from tests.doc_blocks import ROOT, async_tests, code_blocks, exec_blocks

OPERATIONS = ROOT / "docs" / "operations.md"
SECTION = "## Flow control"


async def test_the_flow_control_example_runs() -> None:
    blocks = code_blocks(OPERATIONS, "python", under=SECTION)
    assert len(blocks) == 1
    namespace: dict[str, Any] = {"__name__": "flow_control_example"}
    exec_blocks(blocks, OPERATIONS, namespace)
    tests = async_tests(namespace)
    assert [t.__name__ for t in tests] == ["test_a_limit_sends_the_higher_priority_first"]
    for test in tests:
        await test()


def test_the_flow_control_environment_is_what_settings_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (block,) = code_blocks(OPERATIONS, "bash", under=SECTION)
    for line in block.code.splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        monkeypatch.setenv(name, shlex.split(value)[0])
    limits = Settings().limits
    assert limits.participants == {"payments": FlowLimit(concurrency=20, rate=50)}
    assert limits.saga_types == {"checkout": FlowLimit(concurrency=100)}
    assert limits.aging_s == 10
    assert limits.enabled
