"""docs/operations.md's "Rolling out a new saga version" works as written: its Python
example runs (a gradual rollout in the testing kit), and each `saga rollout` command its
shell block shows parses with those options (it then fails only to reach an admin API)."""

from __future__ import annotations

from typing import Any

from tests.cli.conftest import invoke
from tests.doc_blocks import ROOT, async_tests, code_blocks, exec_blocks, shell_commands

OPERATIONS = ROOT / "docs" / "operations.md"
HEADING = "## Rolling out a new saga version"
#: Where no admin API listens: the CLI's exit code 7 (unreachable) means it parsed.
NOWHERE = "http://127.0.0.1:9"


async def test_the_rollout_example_runs() -> None:
    namespace: dict[str, Any] = {"__name__": "rollout_example"}
    exec_blocks(code_blocks(OPERATIONS, "python", under=HEADING), OPERATIONS, namespace)
    tests = async_tests(namespace)
    assert [t.__name__ for t in tests] == ["test_a_gradual_rollout"]
    for test in tests:
        await test()


def test_the_rollout_commands_exist_with_those_options() -> None:
    [block] = code_blocks(OPERATIONS, "shell", under=HEADING)
    commands = shell_commands(block)
    assert len(commands) == 6
    for command in commands:
        assert command[:2] == ["saga", "rollout"], command
        result = invoke([*command[1:], "--admin-url", NOWHERE])
        assert result.exit_code == 7, (command, result.output)
        assert "could not reach the admin API" in result.stderr
