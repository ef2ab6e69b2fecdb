"""A saga over three participant processes: success, and a failure at step 3 that
compensates steps 2 and 1 in that order, seen in the participants' own tables."""

from __future__ import annotations

import pytest

from saga_engine import SagaStatus
from saga_engine.client import SagaClient
from tests.internal.e2e.app import Transfer, TransferRequest
from tests.internal.e2e.harness import Cluster

pytestmark = pytest.mark.integration


async def test_success_and_failure_at_step_three(participants_up: Cluster) -> None:
    cluster = participants_up
    cluster.start_engine("engine")
    async with SagaClient(cluster.settings) as client:
        ok = await client.start(Transfer, TransferRequest(amount=5))
        failed = await client.start(Transfer, TransferRequest(amount=7, fail_at="gamma"))
    statuses = await cluster.wait_settled([ok, failed])
    assert statuses == {ok: SagaStatus.COMPLETED, failed: SagaStatus.COMPENSATED}
    await cluster.check_effects(statuses, {failed: "gamma"})

    alpha = {r["kind"]: r["at"] for r in await cluster.ledger("alpha") if r["saga_id"] == failed}
    beta = {r["kind"]: r["at"] for r in await cluster.ledger("beta") if r["saga_id"] == failed}
    gamma = [r for r in await cluster.ledger("gamma") if r["saga_id"] == failed]
    assert gamma == [], "the refused step left nothing behind"
    # Applied in order, undone in reverse: beta's revert committed before alpha's.
    assert alpha["apply"] < beta["apply"] < beta["revert"] < alpha["revert"]
