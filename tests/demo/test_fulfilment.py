"""The demo's ``fulfilment`` graph saga in the testing kit: what starts together, a
skipped gift-wrap, and the order in which a refused notification undoes the graph."""

from __future__ import annotations

from saga_engine import SagaStatus
from saga_engine.events import CommandIssued, CompensationStarted, NodeSkipped
from saga_engine.testing import SagaTestEnv
from services_demo.contracts import (
    Fulfilled,
    FulfilmentInput,
    GiftWrapped,
    InvoiceIssued,
    IssueInvoice,
    Item,
    LabelPrinted,
    LinePicked,
    Notified,
    PackParcel,
    ParcelPacked,
    PickLine,
    PrintLabel,
    WrapGift,
)
from services_demo.sagas import Fulfilment

LINES = [Item(sku="book", qty=2), Item(sku="lamp", qty=1)]


def order(*, gift: bool) -> FulfilmentInput:
    return FulfilmentInput(order_id="o-1", customer="alice", items=LINES, total=69, gift=gift)


def scripted() -> SagaTestEnv:
    """Every participant answers; the compensations get the kit's default success."""
    env = SagaTestEnv([Fulfilment])
    inventory = env.participant("inventory")
    inventory.on(PickLine, reply=LinePicked(order_id="o-1", line=0, sku="book", qty=2))
    inventory.on(WrapGift, reply=GiftWrapped(order_id="o-1", units=3))
    inventory.on(PackParcel, reply=ParcelPacked(order_id="o-1", parcel_id="pcl-1", units=3))
    env.participant("payments").on(
        IssueInvoice,
        reply=InvoiceIssued(order_id="o-1", invoice_id="inv-1", amount=69, pdf_sha256="ab"),
    )
    env.participant("shipping").on(PrintLabel, reply=LabelPrinted(order_id="o-1", tracking="t-1"))
    env.participant("http:orders").on(
        "HttpRequest", reply=Notified(order_id="o-1", notification_id="n-1", channel="email")
    )
    return env


async def test_picks_and_invoice_start_together_and_no_gift_skips_the_wrapping() -> None:
    env = scripted()
    run = await env.start(Fulfilment, order(gift=False))
    assert await env.run_until_settled(run) == SagaStatus.COMPLETED
    history = await run.history()
    issued = [e for e in history if isinstance(e, CommandIssued)]
    # The picking's lines and the invoice are sent before any of them answers.
    assert {e.step for e in issued[:3]} == {"pick[0]", "pick[1]", "invoice"}
    assert [e.node for e in history if isinstance(e, NodeSkipped)] == ["gift_wrap"]
    pack = next(e for e in issued if e.step == "pack")
    assert pack.payload == {"order_id": "o-1", "units": 4, "gift": False}  # 2 + 2 scripted
    notify = next(e for e in issued if e.step == "notify")
    assert notify.participant == "http:orders"
    assert notify.payload["body"] == {
        "order_id": "o-1",
        "customer": "alice",
        "tracking": "t-1",
        "invoice_id": "inv-1",
    }
    output = await run.output()
    assert isinstance(output, Fulfilled)
    assert output.gift_wrap is None
    assert len(output.pick) == 2


async def test_a_refused_notification_undoes_the_graph_in_reverse() -> None:
    env = scripted()
    env.participant("http:orders").on("HttpRequest", reject="no contact address for alice")
    run = await env.start(Fulfilment, order(gift=True))
    assert await env.run_until_settled(run) == SagaStatus.COMPENSATED
    [plan] = [e for e in await run.history() if isinstance(e, CompensationStarted)]
    assert plan.after is not None
    assert sorted(plan.owed) == ["gift_wrap", "invoice", "label", "pack", "pick[0]", "pick[1]"]
    assert plan.after["label"] == []  # first
    assert plan.after["pack"] == ["label"]
    assert plan.after["invoice"] == ["label"]  # beside the parcel's, not after it
    assert plan.after["gift_wrap"] == ["pack"]
    # The lines after the wrapping (the parcel being undone before it, so before them).
    assert plan.after["pick[0]"] == plan.after["pick[1]"] == ["gift_wrap"]
    undone = env.compensated_steps()
    assert undone.index("label") < undone.index("pack") < undone.index("gift_wrap")
    assert undone.index("gift_wrap") < min(undone.index("pick[0]"), undone.index("pick[1]"))
