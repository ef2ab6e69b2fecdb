"""The CLI refuses an argument the engine cannot store before any command runs: the one
text rule of ``kernel._input_types`` (bytes that are not UTF-8 reach ``sys.argv`` as
unpaired surrogates; a NUL only through an API such as this runner)."""

from __future__ import annotations

import pytest

from tests.cli.conftest import invoke


@pytest.mark.parametrize("bad", ["a\udcffb", "a\x00b"])
def test_an_argument_postgres_cannot_store_is_a_usage_error_naming_it(bad: str) -> None:
    result = invoke(["archive", "--older-than", "30d", "--type", bad, "--dry-run"])
    assert result.exit_code == 2, (result.stdout, result.stderr, result.exception)
    assert "Traceback" not in result.output
    assert repr(bad.replace("\x00", "\\u0000").replace("\udcff", "\\udcff")) in result.stderr


def test_a_duration_that_reaches_before_year_one_is_a_usage_error() -> None:
    result = invoke(["archive", "--older-than", "1000000w", "--dry-run"])
    assert result.exit_code == 2, (result.stdout, result.stderr, result.exception)
    assert "before year 1" in result.stderr
