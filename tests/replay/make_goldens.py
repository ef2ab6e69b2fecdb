"""Regenerates the golden histories in tests/replay/histories/ from the current code.

    .venv/bin/python -m tests.replay.make_goldens

Run it only when a change of history format is intended: the point of the golden
files is that histories recorded by older code keep replaying. Never regenerate the
files of an old event version (those without ``_v`` on a kind now above version 1, such
as saga_started's): write new files beside them instead (test_golden_histories checks
that a golden stays for every version of every versioned kind).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson

from saga_engine.replay import export_history
from saga_engine.testing import SagaRun, SagaTestEnv
from tests.sagas import (
    Approval,
    OrderRequest,
    PlaceOrder,
    QuoteShipping,
    ReleaseStock,
    ReserveStock,
    ShippingQuote,
    StockReserved,
)

OUT = Path(__file__).parent / "histories"


async def _export(env: SagaTestEnv, run: SagaRun, name: str) -> dict[str, object]:
    doc = export_history(run.saga_id, "place-order", await run.history())
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


if __name__ == "__main__":
    asyncio.run(main())
