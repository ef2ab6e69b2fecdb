"""``saga drill`` of a race (issue 41), as docs/races.md gives it: engines killed while
captures lose to a timer; each capture given up in doubt and applied is undone exactly
once, by its participant's own ledger."""

from __future__ import annotations

import asyncio
import re
import shlex
from pathlib import Path

import pytest

from tests.conftest import PgTarget
from tests.doc_blocks import code_blocks
from tests.internal.e2e.test_drill import ROOT, _drill, _report

RACES = ROOT / "docs" / "races.md"


@pytest.mark.timeout(240)  # the drill's own bound (170 s) and the test's set-up around it
async def test_the_documented_race_drill_undoes_each_applied_loser_once(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str, tmp_path: Path
) -> None:
    (block,) = code_blocks(RACES, "bash", under="## Drilling a race")
    args = shlex.split(block.code)[2:]
    assert args[:2] == ["--sagas", "tests.internal.e2e.drill_race_app"]
    result = await asyncio.to_thread(_drill, pg, kafka_bootstrap, f"t{unique_id}", tmp_path, *args)
    report = _report(result)
    assert result.returncode == 0, report
    assert [f for f in report["faults"] if f.startswith("SIGKILL engine-")], report["faults"]
    checks = {c["name"]: c for c in report["checks"]}
    assert all(c["ok"] for c in checks.values()), report["checks"]
    given_up = checks["a step given up is undone once"]["detail"]
    found = re.fullmatch(
        r"(\d+) steps given up in doubt \((\d+) applied\), each undone once", given_up
    )
    assert found is not None, given_up
    # Captures take 0 to 1 s against a half-second timer: some lose, and are applied late.
    assert int(found.group(2)) > 0, given_up
