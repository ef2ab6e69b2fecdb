"""docs/graphs.md's examples run as written."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

from tests.doc_blocks import ROOT, async_tests, code_blocks, exec_blocks

GRAPHS = ROOT / "docs" / "graphs.md"


@pytest.fixture
def namespace() -> Iterator[dict[str, Any]]:
    """The document's blocks run as one module (registered, so that pydantic resolves
    the models' annotations in it)."""
    module = types.ModuleType("doc_graphs")
    sys.modules[module.__name__] = module
    try:
        exec_blocks(code_blocks(GRAPHS, "python"), GRAPHS, module.__dict__)
        yield module.__dict__
    finally:
        del sys.modules[module.__name__]


def test_the_refusal_example_runs(namespace: dict[str, Any]) -> None:
    namespace["test_a_cycle_is_refused_at_definition"]()


async def test_the_async_examples_run(namespace: dict[str, Any]) -> None:
    tests = async_tests(namespace)
    assert [t.__name__ for t in tests] == [
        "test_the_graph_runs_what_is_ready",
        "test_a_failure_undoes_the_graph_in_reverse",
    ]
    for test in tests:
        await test()
