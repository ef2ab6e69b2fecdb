"""The ``saga`` CLI driven through typer's CliRunner."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
from typer.testing import CliRunner, Result

from saga_engine.cli import app

#: Wide enough that rich does not wrap ids in tables.
BASE_ENV = {"COLUMNS": "250", "NO_COLOR": "1"}


def invoke(args: Sequence[str], env: dict[str, str] | None = None) -> Result:
    runner = CliRunner(env={**BASE_ENV, **(env or {})})
    return runner.invoke(app, list(args))


def as_json(result: Result) -> Any:
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr)
    return orjson.loads(result.stdout)


def one_line_error(result: Result, exit_code: int = 1) -> str:
    """Asserts the failure is ``exit_code`` with one line on stderr and no traceback
    (the admin API's refusals: 3 not found, 4 conflict, 5 invalid, 6 auth, 7 unreachable)."""
    assert result.exit_code == exit_code, (result.stdout, result.stderr, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]
