"""docs/redrive-and-pivots.md: its Python examples run as written, and its shell examples
name `saga` commands and options that exist."""

from __future__ import annotations

from typing import Any

from tests.cli.conftest import invoke
from tests.doc_blocks import ROOT, async_tests, code_blocks, exec_blocks, shell_commands

DOC = ROOT / "docs" / "redrive-and-pivots.md"


async def test_the_python_examples_run() -> None:
    blocks = code_blocks(DOC, "python")
    assert len(blocks) == 3
    namespace: dict[str, Any] = {"__name__": "doc_redrive"}
    exec_blocks(blocks, DOC, namespace)
    tests = async_tests(namespace)
    assert [t.__name__ for t in tests] == [
        "test_a_parked_step_retried_with_an_edited_command",
        "test_past_the_pivot_the_saga_only_goes_forward",
        "test_a_child_as_the_pivot",
    ]
    for test in tests:
        await test()


def test_the_shell_examples_use_real_commands_and_options() -> None:
    [block] = code_blocks(DOC, "sh")
    commands = shell_commands(block)
    assert [c[1] for c in commands] == ["retry", "skip", "show", "rerun"]
    for command in commands:
        assert command[0] == "saga"
        shown = invoke([command[1], "--help"])
        assert shown.exit_code == 0, shown.output
        for option in (t for t in command if t.startswith("--")):
            assert option in shown.stdout, f"saga {command[1]} has no {option}"
