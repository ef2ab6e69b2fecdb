"""``saga drill --scenario shard-down`` on a deployment of two shards (the suite's clusters
2 and 3, never stopped: the drill stops a shard for the engines with a proxy in front of
it). Each shard is down in turn while sagas flow: the other shard's sagas go on ending,
the stopped one's end once it is back, and every invariant holds. (Without shards the
scenario is refused: ``test_drill_broker``.)"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from tests.conftest import PgTarget
from tests.internal.e2e.test_drill import APP, _doc_command, _drill, _report
from tests.internal.e2e.test_drill_links import _CHECKS

pytestmark = pytest.mark.integration


@pytest.mark.timeout(240)  # the drill's own bound (170 s) and the test's set-up around it
async def test_each_shard_down_in_turn_the_others_go_on_and_nothing_is_lost(
    pg: PgTarget,
    pg_shards: tuple[PgTarget, ...],
    kafka_bootstrap: str,
    unique_id: str,
    tmp_path: Path,
) -> None:
    shards = [
        {"name": name, "partitions": partitions, "dsn": target.database_dsn}
        for name, partitions, target in zip("ab", ("0-1", "2-3"), pg_shards, strict=False)
    ]
    sharded = {"SAGA_PG__SHARDS": json.dumps(shards), "SAGA_PG__CONTROL_DSN": pg.database_dsn}
    # The documented drill: two faults of 6 s (duration // fault-every), shard a's then
    # shard b's, while the load runs: sagas of both shards are open during each.
    args = _doc_command(APP, "shard-down")
    assert args[:6] == ["--sagas", APP, "--participants", APP, "--scenario", "shard-down"]
    assert args[-2:] == ["--down-for", "6"]
    result = await asyncio.to_thread(
        _drill, pg, kafka_bootstrap, f"t{unique_id}", tmp_path, *args, env_extra=sharded
    )
    report = _report(result)
    assert result.returncode == 0, (report, result.stderr[-3000:])
    checks = {c["name"]: c for c in report["checks"]}
    assert {name: c["ok"] for name, c in checks.items()} == {
        **_CHECKS,
        "other shards went on while one was down": True,
    }, report["checks"]
    assert report["sagas"] == 60
    faults = report["faults"]
    assert [f.split()[1] for f in faults] == ["a", "b"], faults
    for fault in faults:
        found = re.fullmatch(
            r"shard (\w) down for the engines 6s \(its port refused them\): (\d+) sagas of "
            r"the other shards ended meanwhile, (\d+) of \w's; (\d+) of \w's still open "
            r"when it came back",
            fault,
        )
        assert found, fault
        # The other shard went on; the stopped one ended nothing while it was down, and
        # sagas of its own waited for it.
        assert int(found[2]) > 0, fault
        assert int(found[3]) == 0, fault
        assert int(found[4]) > 0, fault
    for name in ("a", "b"):
        stats = report["links"][f"engines-shard-{name}"]
        # Its port refused the engines while it was down, and carried them again after.
        assert stats["cuts"] == 1, stats
        assert stats["refused"] > 0, stats
        assert stats["forwarded_after_cut"] > 0, stats
    print(
        "\n"
        + "\n".join(faults)
        + "\n"
        + checks["other shards went on while one was down"]["detail"]
    )
