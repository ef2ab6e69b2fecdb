"""The docs' examples hold: the README's Python examples run, as written, in order, and
the `saga replay --json` documents in docs/operations.md are what the CLI prints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from tests.cli.conftest import invoke
from tests.doc_blocks import ROOT, async_tests, code_blocks, exec_blocks

README = ROOT / "README.md"
OPERATIONS = ROOT / "docs" / "operations.md"
HISTORIES = ROOT / "tests" / "replay" / "histories"


def test_readme_has_the_saga_example() -> None:
    blocks = code_blocks(README, "python")
    assert len(blocks) >= 2
    assert "class PlaceOrder(Saga[OrderRequest, OrderResult])" in blocks[0].code
    assert len(blocks[0].code.splitlines()) < 80


async def test_readme_examples_run() -> None:
    namespace: dict[str, Any] = {"__name__": "readme_example"}
    exec_blocks(code_blocks(README, "python"), README, namespace)
    tests = async_tests(namespace)
    assert len(tests) >= 2
    for test in tests:
        await test()


def _replay_json(target: Path) -> Any:
    result = invoke(["replay", str(target), "--sagas", "tests.sagas", "--json"])
    assert result.exit_code == 1, result.output  # each example shows a divergence
    return orjson.loads(result.stdout)


def test_operations_shows_replay_json_as_printed(tmp_path: Path) -> None:
    heading = "## Replay checks: `saga replay --json`"
    one, directory = (orjson.loads(b.code) for b in code_blocks(OPERATIONS, "json", under=heading))
    assert _replay_json(HISTORIES / "place-order-old-step-name.BAD.json") == one
    (tmp_path / "place-order-approved.json").write_bytes(
        (HISTORIES / "place-order-approved.json").read_bytes()
    )
    (tmp_path / "broken.json").write_text("{not json")
    assert _replay_json(tmp_path) == directory
