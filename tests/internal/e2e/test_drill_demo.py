"""``saga drill --scenario mix`` on the demo's checkout (``services_demo.drill``): the five
services as participants, the engines killed, frozen and cut from Postgres, a participant
killed; every invariant holds. With a payments service that reserves a credit twice
(``drill_demo_broken``), the drill fails and names the command."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import pytest

from tests.conftest import PgTarget
from tests.internal.e2e.test_drill import _doc_command, _drill, _report

SAGAS = "services_demo.sagas"
DEMO = "services_demo.drill"
BROKEN = "tests.internal.e2e.drill_demo_broken"
CHECKS = (
    "no saga lost",
    "no effect applied twice",
    "compensations only for applied steps, in reverse order",
    "every history replays",
)


# About 50 s; the limit leaves room for a first build of the Go shipping service when the
# Go build cache is cold (a fresh CI machine).
@pytest.mark.timeout(240)
async def test_the_documented_mix_drill_of_the_demo_checkout_passes(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str, tmp_path: Path
) -> None:
    args = _doc_command(SAGAS)
    assert args[:4] == ["--sagas", SAGAS, "--participants", DEMO], args
    assert args[args.index("--scenario") + 1] == "mix", args
    result = await asyncio.to_thread(_drill, pg, kafka_bootstrap, f"t{unique_id}", tmp_path, *args)
    report = _report(result)
    assert result.returncode == 0, [c for c in report["checks"] if not c["ok"]] or report
    assert report["ok"] is True
    # Every kind of fault of the mix, in its order.
    kinds = [f.split()[0] for f in report["faults"]]
    assert kinds == ["SIGKILL", "SIGKILL", "Postgres", "SIGSTOP"], report["faults"]
    assert report["faults"][0].startswith("SIGKILL engine-"), report["faults"]
    assert report["faults"][1].startswith("SIGKILL participant-"), report["faults"]
    checks = {c["name"]: c for c in report["checks"]}
    assert tuple(checks) == CHECKS
    assert all(c["ok"] for c in checks.values()), report["checks"]
    lost = checks["no saga lost"]["detail"]
    # Some checkouts complete, and the refused ones (credit, fraud, shipping, payment,
    # approval) compensate; none is left open.
    assert " completed" in lost, lost
    assert " compensated" in lost, lost
    twice = checks["no effect applied twice"]["detail"]
    assert twice.endswith("commands applied once each"), twice
    assert int(twice.split()[0]) > report["sagas"], twice  # several steps of each
    assert "sagas compensated" in checks[CHECKS[2]]["detail"], checks[CHECKS[2]]
    assert checks[CHECKS[3]]["detail"] == f"{report['sagas']} histories replayed"
    # Every Kafka participant's kit kept the ledger the count comes from, the Go kit's
    # (shipping) too.
    conn = await asyncpg.connect(pg.database_dsn)
    try:
        for service in ("orders", "payments", "inventory", "shipping"):
            rows = await conn.fetchval(
                f'SELECT count(*) FROM "t{unique_id}_{service}".drill_ledger'
            )
            assert rows > 0, service
    finally:
        await conn.close()


async def test_a_demo_participant_that_reserves_credit_twice_fails_the_drill(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str, tmp_path: Path
) -> None:
    result = await asyncio.to_thread(
        _drill,
        pg,
        kafka_bootstrap,
        f"t{unique_id}",
        tmp_path,
        "--sagas",
        SAGAS,
        "--participants",
        BROKEN,
        "--scenario",
        "engine-kill",
        "--duration",
        "6",
        "--sagas-per-second",
        "2",
        "--fault-every",
        "6",
        "--drain-timeout",
        "60",
    )
    report = _report(result)
    assert result.returncode == 1, report
    twice = next(c for c in report["checks"] if c["name"] == "no effect applied twice")
    assert twice["ok"] is False
    assert "(ReserveCredit of saga " in twice["detail"], twice
    assert "applied 2 times" in twice["detail"], twice
