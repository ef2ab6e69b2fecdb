"""``saga drill`` with Kafka link faults, on the real stack: the engines' link cut while
the participants' is not, the participants' cut while the engines' is not, and both links
slow. Each drill passes every check, and its report shows the fault was felt: the cut
link's proxy dropped connections and held the clients' new ones until it ended (the
other link's proxy cut nothing), sagas were open when the cut ended and all finished
after it; the slow links delivered frames late."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PgTarget
from tests.internal.e2e.test_drill import APP, _drill, _report

pytestmark = pytest.mark.integration

_CHECKS = {
    "no saga lost": True,
    "no effect applied twice": True,
    "compensations only for applied steps, in reverse order": True,
    "every history replays": True,
}


async def _link_drill(
    pg: PgTarget, bootstrap: str, namespace: str, tmp: Path, scenario: str
) -> dict[str, Any]:
    # One fault (duration // fault-every), 6 s into the load, which runs 10 s: sagas are
    # started during the fault, whatever the machine's pace (both clocks start at the
    # engines' first progress).
    args = ["--sagas", APP, "--participants", APP, "--scenario", scenario]
    args += ["--sagas-per-second", "3", "--duration", "10", "--fault-every", "6"]
    result = await asyncio.to_thread(_drill, pg, bootstrap, namespace, tmp, *args)
    report = _report(result)
    assert result.returncode == 0, (report, result.stderr[-3000:])
    assert {c["name"]: c["ok"] for c in report["checks"]} == _CHECKS, report["checks"]
    assert report["sagas"] == 30
    assert len(report["faults"]) == 1, report["faults"]
    return report


def _cut_felt(report: dict[str, Any], group: str, other_group: str) -> None:
    cut, spared = f"{group}s-kafka", f"{other_group}s-kafka"
    (fault,) = report["faults"]
    found = re.fullmatch(
        rf"{group} Kafka link cut, stalled 8s: (\d+) connections dropped, "
        r"(\d+) held until it ended, (\d+) sagas open then",
        fault,
    )
    assert found, fault
    dropped, held, still_open = (int(g) for g in found.groups())
    stats = report["links"][cut]
    assert stats["cuts"] == 1
    assert dropped == stats["dropped"] > 0, stats
    # The clients tried again during the cut, and got through once it ended.
    assert held == stats["held"] > 0, stats
    assert stats["forwarded_after_cut"] > 0, stats
    # The other group's link carried on untouched.
    other = report["links"][spared]
    assert (other["cuts"], other["dropped"], other["held"]) == (0, 0, 0), other
    # Sagas were stalled when the cut ended, and "no saga lost" holds: they resumed.
    assert still_open > 0, fault
    assert report["timings"]["first_progress_after_fault_s"] is not None, report["timings"]


@pytest.mark.timeout(240)  # the drill's own bound (170 s) and the test's set-up around it
async def test_the_engines_cut_from_kafka_lose_and_double_nothing(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str, tmp_path: Path
) -> None:
    report = await _link_drill(pg, kafka_bootstrap, f"t{unique_id}", tmp_path, "engine-link-cut")
    _cut_felt(report, "engine", "participant")


@pytest.mark.timeout(240)
async def test_the_participants_cut_from_kafka_lose_and_double_nothing(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str, tmp_path: Path
) -> None:
    report = await _link_drill(
        pg, kafka_bootstrap, f"t{unique_id}", tmp_path, "participant-link-cut"
    )
    _cut_felt(report, "participant", "engine")


@pytest.mark.timeout(240)
async def test_slow_kafka_links_lose_and_double_nothing(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str, tmp_path: Path
) -> None:
    report = await _link_drill(pg, kafka_bootstrap, f"t{unique_id}", tmp_path, "slow-link")
    (fault,) = report["faults"]
    found = re.fullmatch(
        r"Kafka links slowed by 300 ms each way for 8s: (\d+) frames delayed, "
        r"\d+ sagas open when it ended",
        fault,
    )
    assert found, fault
    links = report["links"]
    # Both groups' frames came late, and nothing was cut.
    assert links["engines-kafka"]["delayed"] > 0, links
    assert links["participants-kafka"]["delayed"] > 0, links
    # Counted while slow (the report's line) and after it (frames read while slow are
    # still delivered late).
    total = links["engines-kafka"]["delayed"] + links["participants-kafka"]["delayed"]
    assert 0 < int(found[1]) <= total, (fault, links)
    assert all(s["cuts"] == s["dropped"] == 0 for s in links.values()), links
