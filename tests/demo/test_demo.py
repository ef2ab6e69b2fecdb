"""The demo end to end: real processes, real servers, every scenario driven over HTTP."""

from __future__ import annotations

import pytest

from saga_engine.events import (
    CommandIssued,
    CompensationCompleted,
    CompensationStarted,
    NodeSkipped,
    ReplyReceived,
)
from services_demo.config import CUSTOMERS, STOCK
from services_demo.demo_kit import Demo
from services_demo.scenario import run_scenarios

pytestmark = pytest.mark.integration

#: label -> (order status, saga status, words of the rejection reason)
EXPECTED = {
    "approval timed out": ("rejected", "compensated", "approval"),
    "succeeds": ("confirmed", "completed", ""),
    "insufficient credit": ("rejected", "compensated", "insufficient credit"),
    "fails at shipping": ("rejected", "compensated", "cannot ship to erin"),
    "fraud check refuses": (
        "rejected",
        "compensated",
        # Posted to the fraud check's callback URL + /fail, after its 202.
        "the service reported a failure: customer mallory is blocked",
    ),
    "Kafka trigger": ("confirmed", "completed", ""),
    "approved by signal": ("confirmed", "completed", ""),
    "survives a crash": ("confirmed", "completed", ""),
    "heidi's first": ("confirmed", "completed", ""),
    "heidi's second": ("confirmed", "completed", ""),
    "cancelled before payment": ("rejected", "compensated", "cancelled by the customer"),
}

#: (saga type, status) -> how many sagas the scenario leaves: the checkouts, their
#: shipments (child sagas), the nightly reconciliation and the two fulfilments.
SAGAS = {
    ("checkout", "completed"): 6,
    ("checkout", "compensated"): 5,
    ("shipment", "completed"): 6,
    ("shipment", "failed"): 1,
    ("reconciliation", "completed"): 1,
    ("fulfilment", "completed"): 1,
    ("fulfilment", "compensated"): 1,
}


async def test_every_scenario_ends_as_expected_and_nothing_leaks(demo: Demo) -> None:
    placed = {p.label: p for p in await run_scenarios(demo)}
    assert set(placed) == set(EXPECTED)

    for label, (order_status, saga_status, reason) in EXPECTED.items():
        p = placed[label]
        assert p.order["status"] == order_status, label
        assert p.saga_status == saga_status, label
        assert reason in (p.order["reason"] or ""), label
        replies = [e for e in p.events if isinstance(e, ReplyReceived) and not e.compensation]
        applied = [r.step for r in replies if r.outcome == "success"]
        if order_status == "confirmed":
            assert applied[-1] == "confirm-order", label
            continue
        # Rejected: the order learns why first, then the applied steps are undone in reverse
        # (the fraud check has nothing to undo).
        assert applied[-1] == "reject-order", label
        undone = [e.step for e in p.events if isinstance(e, CompensationCompleted)]
        forward = [s for s in applied if s not in ("reject-order", "fraud-check")]
        assert undone == list(reversed(forward)), label

    fraud = [
        e
        for e in placed["succeeds"].events
        if isinstance(e, CommandIssued) and e.step == "fraud-check"
    ]
    assert [(e.participant, e.payload["path"]) for e in fraud] == [("http:fraud", "/check")]
    assert placed["Kafka trigger"].order["source"] == "kafka"
    assert placed["approved by signal"].order["total"] == 1050

    # The books, against the seed data of this fresh stack.
    balances = (await demo.http.get(f"{demo.url('payments')}/customers")).json()
    spent = {"alice": 69, "carol": 1050 + 1800, "dave": 36, "heidi": 1050 + 12}
    assert balances == {c: b - spent.get(c, 0) for c, b in CUSTOMERS.items()}
    stock = {s["sku"]: s for s in (await demo.http.get(f"{demo.url('inventory')}/stock")).json()}
    taken = {"book": 2 + 3 + 1, "lamp": 1, "tv": 1 + 2 + 1, "chair": 1 + 1}
    picked = {"book": 2, "lamp": 1}  # alice's fulfilled order; dave's put back
    for sku, seeded in STOCK.items():
        assert stock[sku]["available"] == seeded - taken.get(sku, 0), sku
        assert stock[sku]["reserved"] == taken.get(sku, 0), sku
        assert stock[sku]["picked"] == picked.get(sku, 0), sku
    await _fulfilment_checks(demo)

    statuses = await demo.db.fetch(
        f'SELECT saga_type, status, count(*) AS n FROM "{demo.target.engine_schema}".sagas '
        "GROUP BY saga_type, status"
    )
    # The checkouts, their shipments (child sagas: one per checkout that got that far; the
    # carrier refused one), the nightly reconciliation its schedule's trigger started, and
    # the two fulfilments (graph sagas).
    assert {(r["saga_type"], r["status"]): r["n"] for r in statuses} == SAGAS


async def _fulfilment_checks(demo: Demo) -> None:
    """alice's order fulfilled (no gift: the wrapping skipped), dave's undone by the graph
    after the orders service refused to notify him; the books of both."""
    done = await demo.history(demo.fulfilments["succeeds"])
    assert [e.node for e in done if isinstance(e, NodeSkipped)] == ["gift_wrap"]
    applied = {e.step for e in done if isinstance(e, ReplyReceived) and e.outcome == "success"}
    assert applied == {"pick[0]", "pick[1]", "invoice", "pack", "label", "notify"}
    undone = await demo.history(demo.fulfilments["Kafka trigger"])
    [plan] = [e for e in undone if isinstance(e, CompensationStarted)]
    assert plan.after == {
        "label": [],
        "invoice": ["label"],
        "pack": ["label"],
        "gift_wrap": ["pack"],
        "pick[0]": ["gift_wrap"],
    }
    [refused] = [e for e in undone if isinstance(e, ReplyReceived) and e.step == "notify"]
    assert refused.outcome == "failure"
    assert "no contact address for dave" in (refused.error or "")
    for label, invoice, label_status in (
        ("succeeds", "issued", "printed"),
        ("Kafka trigger", "void", "void"),
    ):
        order_id = next(p.order_id for p in demo.placed if p.label == label)
        got = (await demo.http.get(f"{demo.url('payments')}/invoices/{order_id}")).json()
        assert got["status"] == invoice, label
        got = (await demo.http.get(f"{demo.url('shipping')}/labels/{order_id}")).json()
        assert got["status"] == label_status, label
