"""docs/architecture.md's batch handler example runs as written: it registers, and
called with a batch it writes the commands it applies, in one statement, and answers
each command in order."""

from __future__ import annotations

from typing import Any

from saga_engine.participant import BatchCommand, CommandBatch, Rejected
from tests.doc_blocks import ROOT, code_blocks, exec_blocks

ARCHITECTURE = ROOT / "docs" / "architecture.md"


class Recording:
    """A connection that records the statements it is given."""

    def __init__(self) -> None:
        self.statements: list[tuple[str, tuple[Any, ...]]] = []

    async def execute(self, query: str, *args: Any) -> str:
        self.statements.append((query, args))
        return "INSERT 0 1"


async def test_the_batch_handler_example_runs() -> None:
    [block] = code_blocks(ARCHITECTURE, "python", under="### Batch handlers")
    namespace: dict[str, Any] = {"__name__": "doc_batch_handlers"}
    exec_blocks([block], ARCHITECTURE, namespace)
    assert namespace["ledger"].command_types == ["Apply"]

    apply = namespace["Apply"]
    commands = [
        BatchCommand(
            apply(account="a", amount=amount), f"c{i}", f"s{i}", "transfer", "apply", 1, False, {}
        )
        for i, amount in enumerate([5, 0, 7])
    ]
    connection = Recording()
    batch = CommandBatch(connection, commands, participant="ledger")  # type: ignore[arg-type]
    answers = await namespace["apply"](batch)

    [(_, args)] = connection.statements
    assert args == (["c0", "c2"], ["a", "a"], [5, 7])
    assert [type(a).__name__ for a in answers] == ["Applied", "Rejected", "Applied"]
    assert isinstance(answers[1], Rejected)
    assert answers[0].receipt == "c0"
