"""`saga replay DIRECTORY`: every *.json in it, exit 1 if any diverges."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest

from saga_engine.testing import SagaTestEnv
from tests.cli.conftest import as_json, invoke, one_line_error

HISTORIES = Path(__file__).parent.parent / "replay" / "histories"
GOOD = sorted(p for p in HISTORIES.glob("*.json") if ".BAD." not in p.name)
BAD = sorted(HISTORIES.glob("*.BAD.json"))


@pytest.fixture(autouse=True)
def _callback_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """The callbacks' goldens were signed with the testing kit's key: the CLI reads it
    from the settings, as a deployment's replay would read its own."""
    secret = SagaTestEnv([]).settings.callbacks.keys["test"].get_secret_value()
    monkeypatch.setenv("SAGA_CALLBACKS__KEYS", orjson.dumps({"test": secret}).decode())


def test_a_directory_of_good_histories_replays_cleanly(tmp_path: Path) -> None:
    for path in GOOD:
        shutil.copy(path, tmp_path)
    (tmp_path / "notes.txt").write_text("not a history")
    report = as_json(invoke(["replay", str(tmp_path), "--sagas", "tests.sagas", "--json"]))
    assert [h["file"] for h in report["histories"]] == [p.name for p in GOOD]
    assert all(h["deterministic"] for h in report["histories"])
    assert report["diverged"] == 0
    table = invoke(["replay", str(tmp_path), "--sagas", "tests.sagas"])
    assert table.exit_code == 0, table.output
    assert f"{len(GOOD)} of {len(GOOD)} histories replay cleanly" in table.stdout


def test_one_diverging_history_fails_the_directory(tmp_path: Path) -> None:
    for path in [*GOOD, *BAD]:
        shutil.copy(path, tmp_path)
    (tmp_path / "broken.json").write_text("{not json")
    result = invoke(["replay", str(tmp_path), "--sagas", "tests.sagas", "--json"])
    assert result.exit_code == 1, result.output
    report = orjson.loads(result.stdout)
    failed = {h["file"] for h in report["histories"] if not h["deterministic"]}
    assert failed == {"broken.json", *(p.name for p in BAD)}
    assert report["diverged"] == 2
    table = invoke(["replay", str(tmp_path), "--sagas", "tests.sagas"])
    assert table.exit_code == 1
    assert "diverged" in table.stdout


def test_an_empty_directory_is_an_error(tmp_path: Path) -> None:
    line = one_line_error(invoke(["replay", str(tmp_path), "--sagas", "tests.sagas"]))
    assert "no *.json history files" in line
