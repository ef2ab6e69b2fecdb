"""Regenerates the golden histories in tests/replay/histories/ from the current code.

    .venv/bin/python -m tests.replay.make_goldens          # all of them
    .venv/bin/python -m tests.replay.make_goldens races    # the races' only (issue 41)
    .venv/bin/python -m tests.replay.make_goldens callbacks  # the callbacks' only (issue 41)
    .venv/bin/python -m tests.replay.make_goldens continued  # continue-as-new's only (issue 41)

Run it only when a change of history format is intended: the point of the golden
files is that histories recorded by older code keep replaying. Never regenerate the
files of an old event version (those without ``_v`` on a kind now above version 1, such
as saga_started's): write new files beside them instead (test_golden_histories checks
that a golden stays for every version of every versioned kind).
"""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta
from pathlib import Path

import orjson

from saga_engine.replay import export_history
from saga_engine.testing import SagaRun, SagaTestEnv
from tests.sagas import (
    Approval,
    BillingPeriod,
    Capture,
    ChargePeriod,
    CheckoutRequest,
    KycCheck,
    KycRequest,
    MonthlyBilling,
    OrderRequest,
    PlaceOrder,
    QuoteShipping,
    RaceCheckout,
    RefundPeriod,
    ReleaseStock,
    ReserveStock,
    ShippingQuote,
    StockReserved,
    WaitCheckout,
)

OUT = Path(__file__).parent / "histories"


async def _export(
    env: SagaTestEnv, run: SagaRun, name: str, saga_type: str = "place-order"
) -> dict[str, object]:
    doc = export_history(run.saga_id, saga_type, await run.history())
    (OUT / f"{name}.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
    return doc


def _happy(env: SagaTestEnv) -> None:
    env.participant("inventory").on(ReserveStock, reply=StockReserved(reservation="r-1"))
    env.participant("shipping").on(QuoteShipping, reply=ShippingQuote(price=7))


async def main() -> None:
    OUT.mkdir(exist_ok=True)
    env = SagaTestEnv([PlaceOrder])
    _happy(env)
    run = await env.start(
        PlaceOrder, OrderRequest(customer="c1", total=30), saga_id="golden-completed"
    )
    await env.run_until_settled(run)
    good = await _export(env, run, "place-order-completed")

    env = SagaTestEnv([PlaceOrder])
    env.participant("inventory").on(ReserveStock, reply=StockReserved(reservation="r-2"))
    env.participant("shipping").on(QuoteShipping, reject="no route to customer")
    run = await env.start(
        PlaceOrder, OrderRequest(customer="c2", total=10), saga_id="golden-compensated"
    )
    await env.run_until_settled(run)
    await _export(env, run, "place-order-compensated")

    env = SagaTestEnv([PlaceOrder])
    _happy(env)
    run = await env.start(
        PlaceOrder,
        OrderRequest(customer="c3", total=900, needs_approval=True),
        saga_id="golden-approved",
    )
    await env.signal(run, "approval", Approval(approved=True, by="manager"))
    await env.run_until_settled(run)
    await _export(env, run, "place-order-approved")

    env = SagaTestEnv([PlaceOrder])
    _happy(env)
    env.participant("inventory").on(ReleaseStock, no_reply=True, times=1)
    run = await env.start(
        PlaceOrder,
        OrderRequest(customer="c4", total=5, needs_approval=True),
        saga_id="golden-timeouts",
    )
    await env.run_until_settled(run)
    await _export(env, run, "place-order-signal-timeout")

    # History recorded by an older version that named its first step "reserve-funds":
    # today's code must refuse to replay it (NondeterminismError), not diverge silently.
    bad = orjson.loads(orjson.dumps(good))
    bad["saga_id"] = "golden-renamed-step"
    for event in bad["events"]:
        if event.get("step") == "reserve-credit":
            event["step"] = "reserve-funds"
    (OUT / "place-order-old-step-name.BAD.json").write_bytes(
        orjson.dumps(bad, option=orjson.OPT_INDENT_2) + b"\n"
    )


async def races() -> None:
    """Races (issue 41): the capture loses to the timer in ``ctx.first`` and in
    ``asyncio.wait`` (given up, refunded at once), and the same ``asyncio.wait`` race as
    an engine recorded it before a step could be given up (no ``step_abandoned``: the
    capture was left owed, never refunded, as the saga completed)."""
    for saga, name in ((RaceCheckout, "race-checkout"), (WaitCheckout, "wait-checkout")):
        env = SagaTestEnv([saga])
        env.participant("payments").on(Capture, no_reply=True)
        run = await env.start(
            saga, CheckoutRequest(order="o-1", amount=30), saga_id=f"golden-{name}"
        )
        await env.run_until_settled(run)
        doc = await _export(env, run, f"{name}-expired", name)
    events = [
        e
        for e in doc["events"]  # type: ignore[attr-defined]
        if (e["kind"] != "step_abandoned" and e.get("step") != "capture")
        or e["kind"] == "command_issued"
    ]
    for seq, event in enumerate(events, start=1):
        event["seq"] = seq
    legacy = {**doc, "saga_id": "golden-wait-checkout-legacy", "events": events}
    (OUT / "wait-checkout-before-step-abandoned.json").write_bytes(
        orjson.dumps(legacy, option=orjson.OPT_INDENT_2) + b"\n"
    )


async def callbacks() -> None:
    """Callbacks (issue 41 section 2), signed with the testing kit's key: a verdict
    posted to the URL, and none before the timeout."""
    env = SagaTestEnv([KycCheck])
    run = await env.start(KycCheck, KycRequest(applicant="ada"), saga_id="golden-kyc-answered")
    url = env.commands("kyc")[-1].payload["callback_url"]
    await env.callback(url, {"approved": True, "score": 91})
    await _export(env, run, "callback-kyc-answered", KycCheck.name)
    run = await env.start(KycCheck, KycRequest(applicant="bo"), saga_id="golden-kyc-timed-out")
    await env.advance(timedelta(days=2, seconds=1))
    await _export(env, run, "callback-kyc-timed-out", KycCheck.name)


async def continued() -> None:
    """Continue-as-new (issue 41 section 4): three runs that complete, and three whose
    last charge is refused (the runs before refunded, last first)."""
    for name, refused in (
        ("continued-billing-completed", False),
        ("continued-billing-compensated", True),
    ):
        env = SagaTestEnv([MonthlyBilling])
        payments = env.participant("payments").on(ChargePeriod, reply={}).on(RefundPeriod, reply={})
        if refused:
            payments.on(ChargePeriod, reject="card expired", times=1)
            payments.on(ChargePeriod, reply={}, times=2)
        run = await env.start(
            MonthlyBilling, BillingPeriod(customer="c-1"), saga_id=f"golden-{name}"
        )
        for _ in range(3):
            await env.advance(timedelta(days=30))
        await _export(env, run, name, MonthlyBilling.name)


if __name__ == "__main__":
    if sys.argv[1:] == ["callbacks"]:
        asyncio.run(callbacks())
    elif sys.argv[1:] == ["continued"]:
        asyncio.run(continued())
    else:
        if sys.argv[1:] != ["races"]:
            asyncio.run(main())
        asyncio.run(races())
        asyncio.run(callbacks())
        asyncio.run(continued())
