"""The narrated checkout demo (``make demo``): every promise of saga-engine, end to end.

    python -m services_demo.scenario            # starts the engine and the services itself
    python -m services_demo.scenario --external # against a running stack (SAGA_* settings)
    python -m services_demo.scenario --compose  # against `docker compose up --build --wait`
    python -m services_demo.scenario --shards   # the store on two shards, a range moved
                                                # while it runs (`make demo-shards`)

It places orders over HTTP and through Kafka and prints what happens and where to look:

1. an order that succeeds (and the same request again, with its Idempotency-Key); its
   checkout waits for the orders service's ``payment-captured`` fact;
2. one rejected for insufficient credit;
3. one that fails at shipping: its stock and credit are released;
4. one the fraud service refuses: its HTTP step is answered 202 and the refusal posted to
   the step's callback URL later (the fraud check of every order answers so);
5. one started by a Kafka message, sent twice: one saga; malformed ones are dead-lettered;
6. a large order approved by a signal;
7. a crash: the engine is SIGKILLed while a large order waits for its approval, restarted,
   recovers the saga from its history, the approval arrives and the order completes;
8. a large order nobody approves: rejected when its approval times out;
9. one checkout per customer at a time: a customer's second order waits for the first;
10. the nightly reconciliation, a saga its schedule starts every night at 02:00, triggered
   now through the engine's admin API: it reads the balances over HTTP and completes;
11. a graph saga: the fulfilment of the first order (its lines picked and its invoice
   rendered at once, packed, labelled by the Go service, the customer notified over HTTP);
   the invoice's PDF, over 256 KiB, comes back from payments by reference;
12. a fulfilment refused at its last node (the customer cannot be notified): the graph
   is undone in reverse, and the stock, invoice, parcel and label are as they were.

Then each saga's final status and history summary, and the balances and stock before
and after, checked to the unit: nothing leaked, nothing was applied twice. Every
expectation is checked; the exit status is 0 only if all of them held.

With ``--shards`` (``make demo-shards``) the engine's store is on two shards, on two
Postgres clusters (services_demo/shard_move.py): while the fourth order runs, ``saga shard
move`` moves the inbox partition of a saga in flight to the other shard, and at the end
every saga's history is read through the admin API and replayed, and the moved range's
sagas are in the target shard only.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import os
import sys
import time
import uuid
from collections import Counter
from typing import Any

import httpx
import orjson

from saga_engine import SagaUnsuccessful, Settings, saga_id_for
from saga_engine.events import (
    CallbackReceived,
    CommandIssued,
    CompensationCompleted,
    CompensationStarted,
    DomainEventReceived,
    Event,
    KeyAcquired,
    KeyQueued,
    NodeSkipped,
    ReplyReceived,
    SagaCompleted,
)
from services_demo.config import BLOB_THRESHOLD_BYTES, PORT_OFFSETS, SERVICES
from services_demo.contracts import Approval, FulfilmentInput
from services_demo.demo_kit import (
    FINISHED,
    CommandEngine,
    Demo,
    DemoFailed,
    Placed,
    Snapshot,
    Target,
    check,
    items,
    say,
    summarize,
)
from services_demo.run import DemoShard, DemoStack, StackConfig, StackError, free_base_port
from services_demo.sagas import Checkout, Fulfilment, fulfilment_key
from services_demo.shard_move import ShardMove


def heading(number: str, title: str) -> None:
    say()
    label = f"{number}. {title}" if number else title
    say(f"== {label} " + "=" * max(0, 74 - len(label)))


# --------------------------------------------------------------------------- the scenarios


async def order_succeeds(demo: Demo) -> Placed:
    heading("1", "An order that succeeds")
    key = f"demo-{demo.run_id}-1"
    placed = await demo.place(
        "succeeds", "alice", items(book=2, lamp=1), expect="confirmed", idempotency_key=key
    )
    again = await demo.http.post(
        f"{demo.url('orders')}/orders",
        json={"customer": "alice", "items": placed.items},
        headers={"Idempotency-Key": key},
    )
    check(
        again.status_code == 202 and again.json()["order_id"] == placed.order_id,
        "the same request again (same Idempotency-Key) returns the same order and saga",
    )
    await demo.settle(placed)
    facts = [e for e in placed.events if isinstance(e, DomainEventReceived)]
    check(
        len(facts) == 1,
        "the checkout waited for the orders service's payment-captured fact and recorded it "
        "once (published before the checkout reached its wait, matched all the same)",
    )
    calls = await demo.fraud_calls(placed)
    if demo.fraud_flaky:
        check(
            calls == 2,
            "the fraud service answered 503 first; the engine retried with the same "
            "Idempotency-Key (2 calls, 1 stored answer)",
        )
    verdicts = [e for e in placed.events if isinstance(e, CallbackReceived)]
    check(
        len(verdicts) == 1 and not verdicts[0].failed,
        "the fraud service answered 202 and posted its verdict to the step's callback URL "
        "later (Saga-Callback-Url): recorded once, as callback_received",
    )
    say(f"    look: GET {demo.url('orders')}/orders/{placed.order_id}")
    await shipment_child(demo, placed, "completed")
    return placed


async def shipment_child(demo: Demo, placed: Placed, status: str) -> None:
    """The checkout started its shipment as a child saga: the admin API names it."""
    admin = demo.target.admin_url
    if admin is None:
        return
    detail = (await demo.http.get(f"{admin}/sagas/{placed.saga_id}")).json()
    children = detail.get("children") or []
    check(
        [(c.get("saga_type"), c.get("status")) for c in children] == [("shipment", status)],
        f"its shipment ran as a child saga, which ended {status}",
    )
    if children:
        child = (await demo.http.get(f"{admin}/sagas/{children[0]['saga_id']}")).json()
        check(
            (child.get("parent") or {}).get("saga_id") == placed.saga_id,
            "the child names its parent",
        )
        say(f"    look: GET {admin}/sagas/{placed.saga_id}/lineage")


async def insufficient_credit(demo: Demo) -> Placed:
    heading("2", "Rejected for insufficient credit")
    placed = await demo.place(
        "insufficient credit",
        "bob",
        items(chair=1),
        expect="rejected",
        reason="insufficient credit",
    )
    await demo.settle(placed)
    held = await demo.reservations("bob")
    check(placed.order_id not in held, "payments reserved nothing for it")
    return placed


async def shipping_fails(demo: Demo) -> Placed:
    heading("3", "Fails at shipping: stock and credit are released")
    placed = await demo.place(
        "fails at shipping", "erin", items(lamp=1, mug=2), expect="rejected", reason="cannot ship"
    )
    await demo.settle(placed)
    held = await demo.reservations("erin")
    check(
        held.get(placed.order_id, {}).get("status") == "released",
        "payments: the credit was reserved, then released",
    )
    undone = [e.step for e in placed.events if isinstance(e, CompensationCompleted)]
    check(
        undone[:2] == ["reserve-stock", "reserve-credit"],
        f"compensated in reverse order: {', '.join(undone)}",
    )
    # The carrier refused the child's booking: the child undid itself (it failed with
    # nothing applied), so the checkout owed nothing for it.
    await shipment_child(demo, placed, "failed")
    return placed


async def fraud_refuses(demo: Demo) -> Placed:
    heading("4", "Refused by the fraud check, an HTTP step answered by callback")
    placed = await demo.place(
        "fraud check refuses", "mallory", items(tv=1), expect="rejected", reason="blocked"
    )
    await demo.settle(placed)
    issued = [e for e in placed.events if isinstance(e, CommandIssued) and e.step == "fraud-check"]
    check(
        len(issued) == 1 and issued[0].participant == "http:fraud",
        "the history records the HTTP call as a step: endpoint 'fraud', path /check",
    )
    refusals = [e for e in placed.events if isinstance(e, CallbackReceived)]
    check(
        len(refusals) == 1 and refusals[0].failed,
        "it answered 202, then posted the refusal to the callback URL + /fail: the step "
        "failed with the service's reason",
    )
    return placed


async def kafka_trigger(demo: Demo) -> Placed:
    heading("5", f"Started by a Kafka message on {demo.target.orders_topic}")
    order_id = f"kafka-{demo.run_id}"
    lines = items(book=3)
    message = orjson.dumps({"order_id": order_id, "customer": "dave", "items": lines})
    saga_id = saga_id_for("checkout", f"order-{order_id}")
    placed = Placed("Kafka trigger", order_id, saga_id, "dave", lines, expect="confirmed")
    demo.placed.append(placed)
    for _ in range(2):  # the same message twice, as a redelivery would
        await demo.send_trigger(message, order_id)
    say(f"  sent {message.decode()} twice")
    await demo.send_trigger(f"not json {demo.run_id}".encode(), "bad")
    await demo.send_trigger(orjson.dumps({"order_id": f"bad-{demo.run_id}"}), "bad")
    say("  sent a message that is not JSON, and one without customer and items")
    await demo.wait_for(
        f"the orders service to learn of {order_id}", lambda: _exists(demo, order_id)
    )
    say(f"  the saga's first step created order {order_id} in the orders service")
    await demo.pay(placed)
    await demo.settle(placed)
    await demo.wait_for(
        "the engine to consume every trigger message",
        lambda: _caught_up(demo),
    )
    found = await demo.on_saga_dbs(
        "SELECT count(*) AS n FROM {schema}.sagas WHERE idempotency_key = $1",
        f"order-{order_id}",
    )
    count = sum(rows[0]["n"] for rows in found.values())
    check(count == 1, "both copies consumed, one saga: its id derives from the idempotency key")
    held = await demo.reservations("dave")
    check(order_id in held, "one credit reservation for the order", quiet=True)
    reasons = await _dead_letters(demo, demo.run_id, 2)
    check(
        reasons == ["invalid_body", "malformed_json"],
        f"the bad messages went to {demo.target.kafka.topic_prefix}.dlq: {', '.join(reasons)}",
    )
    return placed


async def _exists(demo: Demo, order_id: str) -> bool:
    return await demo.order(order_id) is not None


async def _caught_up(demo: Demo) -> bool:
    return await demo.trigger_backlog() == 0


async def _dead_letters(demo: Demo, marker: str, count: int) -> list[str]:
    found: list[str] = []

    async def enough() -> bool:
        found[:] = await demo.dead_letters(marker)
        return len(found) >= count

    await demo.wait_for("the dead letters", enough, within_s=20)
    return found


async def approved_by_signal(demo: Demo) -> Placed:
    heading("6", "A large order, approved by a signal")
    placed = await demo.place(
        "approved by signal", "carol", items(tv=1, chair=1), expect="confirmed"
    )
    await demo.waiting_for_approval(placed)
    say(
        f"  1050 credits: the saga waits for the 'approval' signal ({demo.approval_timeout_s:.0f} s at most)"
    )
    await demo.client.signal(
        placed.saga_id, Checkout.approval, Approval(approved=True, by="demo-script")
    )
    say("  SagaClient.signal(saga_id, Checkout.approval, Approval(approved=True)) sent")
    await demo.settle(placed)
    return placed


async def crash_and_recover(demo: Demo) -> Placed | None:
    heading("7", "A crash: the engine is killed while a saga waits, and recovers")
    if demo.target.engine is None:
        say("  skipped: no way to kill the engine (give --engine-kill-cmd and --engine-start-cmd)")
        return None
    placed = await demo.place("survives a crash", "carol", items(tv=2), expect="confirmed")
    await demo.waiting_for_approval(placed)
    say("  the saga has reserved credit and stock, passed the fraud check, and waits for approval")
    say(f"  kill: {await demo.target.engine.kill()}")
    order = await demo.order(placed.order_id)
    check(order is not None and order["status"] == "pending", "the order is still pending")
    say(f"  restart: {await demo.target.engine.restart()}")
    await demo.approve(placed, by="demo-script (HTTP)")
    say(f"  POST /orders/{placed.order_id}/approval: the orders service signals the saga")
    await demo.settle(placed, within_s=60)
    kinds = Counter(e.kind for e in placed.events)
    check(
        kinds["reply_received"] == 6 and kinds["signal_received"] == 1,
        "one reply per step and one signal in the history: nothing was run twice",
    )
    if demo.fraud_flaky:
        check(
            await demo.fraud_calls(placed) == 2,
            "the fraud service was not called again: replay answered it from history",
        )
    say("  the whole history:")
    for seq, event in enumerate(placed.events, start=1):
        say(f"    {seq:>3} {event.describe()}")
    return placed


async def start_unapproved(demo: Demo) -> Placed:
    heading("8a", "A large order nobody will approve (placed first, checked at the end)")
    placed = await demo.place(
        "approval timed out", "grace", items(tv=1, chair=2), expect="rejected", reason="approval"
    )
    await demo.waiting_for_approval(placed)
    say(
        f"  1200 credits: it waits for an approval that will not come ({demo.approval_timeout_s:.0f} s)"
    )
    return placed


async def finish_unapproved(demo: Demo, placed: Placed) -> Placed:
    heading("8b", "The large order nobody approved")
    await demo.settle(placed, within_s=demo.approval_timeout_s + 60)
    held = await demo.reservations("grace")
    check(
        held.get(placed.order_id, {}).get("status") == "released",
        "its credit (and stock) were released",
    )
    return placed


async def one_checkout_per_customer(demo: Demo) -> list[Placed]:
    heading("9", "One checkout per customer at a time: the second order waits its turn")
    first = await demo.place("heidi's first", "heidi", items(tv=1, chair=1), expect="confirmed")
    await demo.waiting_for_approval(first)
    second = await demo.place("heidi's second", "heidi", items(book=1), expect="confirmed")

    async def queued() -> bool:
        return any(isinstance(e, KeyQueued) for e in await demo.history(second.saga_id))

    await demo.wait_for(f"saga {second.saga_id} to queue behind {first.saga_id}", queued)
    events = await demo.history(second.saga_id)
    behind = [e.behind for e in events if isinstance(e, KeyQueued)]
    check(
        behind == [[first.saga_id]] and not any(isinstance(e, KeyAcquired) for e in events),
        "the second checkout is recorded but does not run: queued behind the first "
        "(concurrency key 'customer')",
    )
    admin = demo.target.admin_url
    if admin is not None:
        detail = (await demo.http.get(f"{admin}/sagas/{second.saga_id}")).json()
        waits = [w["what"] for w in detail.get("waiting_for") or []]
        check(
            any(f"queued behind saga {first.saga_id}" in w for w in waits),
            f"GET /sagas/{second.saga_id} says why it waits: {'; '.join(waits)}",
        )
    await demo.approve(first, by="demo-script (HTTP)")
    await demo.settle(first)
    await demo.settle(second)
    ended = max(e.at for e in first.events)
    granted = [e.at for e in second.events if isinstance(e, KeyAcquired)]
    check(
        len(granted) == 1 and granted[0] >= ended,
        "the second ran once the first had ended: never two of heidi's checkouts at once",
    )
    return [first, second]


async def cancelled_while_waiting_for_payment(demo: Demo) -> Placed:
    heading("13", "A race: the customer cancels while the checkout waits for the payment")
    placed = await demo.place(
        "cancelled before payment",
        "ivan",
        items(lamp=1),
        expect="rejected",
        reason="cancelled by the customer",
        pay=False,
    )
    await demo.waiting_for_payment(placed)
    say(
        "  the checkout races payment-captured, the customer's cancel and the payment "
        "timeout (ctx.first)"
    )
    await demo.cancel(placed, reason="changed my mind")
    say(f"  POST /orders/{placed.order_id}/cancel: the orders service signals the saga")
    await demo.settle(placed)
    winner = [e for e in placed.events if e.kind in ("signal_received", "timer_fired")]
    check(
        [e.kind for e in winner] == ["signal_received"],
        "the cancel won the race: the payment timer never fired",
    )
    held = await demo.reservations("ivan")
    check(
        held.get(placed.order_id, {}).get("status") == "released",
        "its credit (and stock) were released",
    )
    return placed


async def nightly_reconciliation(demo: Demo) -> str | None:
    """The schedule declared next to the saga, fired now by an operator: one saga, which
    reads every balance from the payments service and completes. Returns its id."""
    heading("10", "A scheduled saga: the nightly reconciliation, triggered now")
    admin = demo.target.admin_url
    if admin is None:
        say("  skipped: the engine's admin API is not reachable (set SAGA_ADMIN_URL)")
        return None
    schedule = (await demo.http.get(f"{admin}/schedules/nightly-reconciliation")).json()
    check(schedule.get("state") == "active", "the worker created the schedule it declares")
    say(
        f"  schedule nightly-reconciliation: {schedule.get('spec')}, next run "
        f"{schedule.get('next_fire_at')}"
    )
    response = await demo.http.post(f"{admin}/schedules/nightly-reconciliation/trigger")
    check(response.status_code == 200, f"POST .../trigger answered {response.status_code}")
    saga_id: str = response.json()["saga_id"]
    say(f"  POST /schedules/nightly-reconciliation/trigger -> saga {saga_id}")

    async def done() -> bool:
        row = await demo.saga_row(saga_id)
        return row is not None and row["status"] in FINISHED

    await demo.wait_for(f"the reconciliation saga {saga_id} to end", done)
    row = await demo.saga_row(saga_id)
    check(row is not None and row["status"] == "completed", "the reconciliation completed")
    ended = [e for e in await demo.history(saga_id) if isinstance(e, SagaCompleted)]
    balances = (await demo.http.get(f"{demo.url('payments')}/customers")).json()
    report = ended[0].output if ended else {}
    check(
        report.get("customers") == len(balances),
        f"it read {report.get('customers')} customers' balances (total "
        f"{report.get('total_balance')}) from the payments service over HTTP",
    )
    after = (await demo.http.get(f"{admin}/schedules/nightly-reconciliation")).json()
    check(after.get("last_saga_id") == saga_id, "the schedule links its last saga")
    return saga_id


#: How long a fulfilment may take, start to end, before the demo gives up on it.
FULFILMENT_WITHIN_S = 60.0


def describe_graph() -> None:
    """The fulfilment's declared graph, one line per node (the console draws it)."""
    for n in Fulfilment.graph.nodes:
        what = [f"one step per line (at most {n.max_items})"] if n.kind == "each" else []
        what += ["an HTTP call"] if n.kind == "http" else []
        what.append(f"after {', '.join(n.after)}" if n.after else "at the start")
        what += ["only for a gift"] if n.conditional else []
        what += ["nothing to undo"] if not n.compensable else []
        say(f"    {n.name:<10} {n.to:<10} {', '.join(what)}")


async def start_fulfilment(demo: Demo, placed: Placed, *, gift: bool) -> str:
    order = FulfilmentInput(
        order_id=placed.order_id,
        customer=placed.customer,
        items=placed.items,
        total=placed.total,
        gift=gift,
    )
    saga_id = await demo.client.start(
        Fulfilment, order, idempotency_key=fulfilment_key(placed.order_id)
    )
    demo.fulfilments[placed.label] = saga_id
    say(
        f"  SagaClient.start(Fulfilment, order {placed.order_id} of {placed.customer}) -> saga {saga_id}"
    )
    admin = demo.target.admin_url
    if admin is not None:
        say(f"    look: {admin}/ui/sagas/{saga_id} (the graph, each node's state)")
    return saga_id


def _started_together(events: list[Event]) -> set[str]:
    """The steps sent before the first reply arrived."""
    sent: set[str] = set()
    for e in events:
        if isinstance(e, ReplyReceived):
            break
        if isinstance(e, CommandIssued):
            sent.add(e.step)
    return sent


async def fulfilment_completes(demo: Demo, placed: Placed) -> str:
    heading("11", f"A graph saga: the fulfilment of {placed.customer}'s order")
    say("  fulfilment is declared as a graph (saga_engine.graph.GraphSaga); its nodes:")
    describe_graph()
    before = await demo.snapshot()
    saga_id = await start_fulfilment(demo, placed, gift=False)
    output = await demo.client.result(saga_id, timeout=FULFILMENT_WITHIN_S, saga=Fulfilment)
    events = await demo.history(saga_id)
    say(f"    saga completed: {summarize(events)}")
    together = _started_together(events)
    check(
        {"invoice", "pick[0]"} <= together,
        f"the lines' picking and the invoice started together: {', '.join(sorted(together))}",
    )
    check(
        [e.node for e in events if isinstance(e, NodeSkipped)] == ["gift_wrap"],
        "not a gift: gift_wrap was skipped, and the packing went on",
    )
    invoice = output.invoice
    took = _step_seconds(events, "invoice")
    say(
        f"    invoice {invoice.invoice_id}: {took:.2f}s from command to reply, its PDF rendered "
        "in the handler (the heavy step); the picking went on meanwhile"
    )
    check(
        (await _invoice(demo, placed))["status"] == "issued",
        f"payments: invoice {invoice.invoice_id} issued",
    )
    await invoice_by_reference(demo, saga_id, invoice.invoice_id, invoice.pdf)
    floor = await _floor(demo, placed)
    check(
        [line["status"] for line in floor["lines"]] == ["picked"] * len(placed.items)
        and (floor["parcel"] or {}).get("status") == "packed",
        f"inventory: {len(placed.items)} line(s) picked, parcel {output.pack.parcel_id} packed",
    )
    label = await _label(demo, placed)
    check(
        label["status"] == "printed" and label["tracking"] == output.label.tracking,
        f"shipping (Go): label {output.label.tracking} printed",
    )
    check(
        output.notify.channel == "email",
        f"orders: {placed.customer} notified by {output.notify.channel} (an HTTP node)",
    )
    after = await demo.snapshot()
    for line in placed.items:
        sku = line["sku"]
        check(
            after.picked[sku] - before.picked[sku] == line["qty"]
            and after.available[sku] == before.available[sku],
            f"{sku}: {line['qty']} reserved unit(s) picked off the shelf",
            quiet=True,
        )
    return saga_id


async def fulfilment_undone(demo: Demo, placed: Placed) -> str:
    heading("12", "A fulfilment refused at its last node, undone by the graph")
    before = await demo.snapshot()
    saga_id = await start_fulfilment(demo, placed, gift=True)
    try:
        await demo.client.result(saga_id, timeout=FULFILMENT_WITHIN_S, saga=Fulfilment)
        ended = "completed"
    except SagaUnsuccessful as exc:
        ended = exc.status
    events = await demo.history(saga_id)
    say(f"    saga {ended}: {summarize(events)}")
    check(ended == "compensated", f"the fulfilment ended {ended} (expected compensated)")
    refused = [
        e
        for e in events
        if isinstance(e, ReplyReceived) and e.step == "notify" and not e.compensation
    ]
    check(
        bool(refused) and refused[-1].outcome == "failure",
        f"notify (HTTP) refused: {refused[-1].error if refused else '?'}",
    )
    [plan] = [e for e in events if isinstance(e, CompensationStarted)]
    say("  the undo plan recorded in compensation_started (each undone after the steps named):")
    for step in plan.owed:
        first = (plan.after or {}).get(step, [])
        say(f"    {step:<10} after {', '.join(first) or 'nothing: first'}")
    undone = [e.step for e in events if isinstance(e, CompensationCompleted)]
    picks = [s for s in undone if s.startswith("pick[")]
    check(
        len(picks) == len(placed.items)
        and undone.index("label") < min(undone.index("pack"), undone.index("invoice"))
        and undone.index("pack") < undone.index("gift_wrap") < min(map(undone.index, picks)),
        f"undone in the graph's reverse: {', '.join(undone)} (the invoice beside the parcel)",
    )
    invoice = await _invoice(demo, placed)
    check(invoice["status"] == "void", f"payments: invoice {invoice['invoice_id']} voided")
    floor = await _floor(demo, placed)
    check(
        {line["status"] for line in floor["lines"]} == {"put_back"}
        and (floor["gift_wrap"] or {}).get("status") == "unwrapped"
        and (floor["parcel"] or {}).get("status") == "unpacked",
        "inventory: every line put back, the gift unwrapped, the parcel unpacked",
    )
    check((await _label(demo, placed))["status"] == "void", "shipping (Go): the label voided")
    after = await demo.snapshot()
    check(
        (after.available, after.reserved, after.picked)
        == (before.available, before.reserved, before.picked),
        "the stock is where it was: available, reserved and picked, SKU by SKU",
    )
    return saga_id


async def invoice_by_reference(demo: Demo, saga_id: str, invoice_id: str, pdf: str) -> None:
    """The invoice's document (over 256 KiB) came back from payments by reference: the
    saga holds it whole, its reply and its history hold references to one blob."""
    document = base64.b64decode(pdf)
    check(
        len(document) > BLOB_THRESHOLD_BYTES
        and document.startswith(b"%PDF")
        and invoice_id.encode() in document[:200],
        f"the invoice's PDF ({len(document) // 1024} KiB) reached the saga whole",
    )
    found = await demo.on_saga_dbs(
        "SELECT (SELECT count(*) FROM {schema}.saga_blob_refs WHERE saga_id = $1) AS refs, "
        "(SELECT max(length(data::text)) FROM {schema}.saga_events WHERE saga_id = $1) AS longest",
        saga_id,
    )
    refs = sum(rows[0]["refs"] for rows in found.values())
    longest = max((rows[0]["longest"] or 0) for rows in found.values())
    check(
        refs >= 1 and longest < BLOB_THRESHOLD_BYTES,
        f"  by reference: the reply and the history hold references to {refs} blob(s), "
        f"the longest event is {longest:,} bytes (docs/large-payloads.md)",
    )


def _step_seconds(events: list[Event], step: str) -> float:
    sent = next(e.at for e in events if isinstance(e, CommandIssued) and e.step == step)
    got = next(e.at for e in events if isinstance(e, ReplyReceived) and e.step == step)
    return (got - sent).total_seconds()


async def _invoice(demo: Demo, placed: Placed) -> dict[str, Any]:
    return await demo.get_json("payments", f"/invoices/{placed.order_id}")


async def _floor(demo: Demo, placed: Placed) -> dict[str, Any]:
    return await demo.get_json("inventory", f"/fulfilments/{placed.order_id}")


async def _label(demo: Demo, placed: Placed) -> dict[str, Any]:
    return await demo.get_json("shipping", f"/labels/{placed.order_id}")


async def run_scenarios(demo: Demo, shards: ShardMove | None = None) -> list[Placed]:
    """Every scenario in order, then the books: returns the orders placed, all checked.
    ``shards``: the store is sharded; a range moves while the fourth order runs, and every
    saga's history is read through the admin API at the end."""
    before = await demo.snapshot()
    unapproved = await start_unapproved(demo)
    succeeded = await order_succeeds(demo)
    await insufficient_credit(demo)
    await shipping_fails(demo)
    if shards is not None:
        await shards.start(unapproved)  # the range of a saga that waits: in flight
    await fraud_refuses(demo)  # while the range moves
    if shards is not None:
        await shards.finish()
    by_kafka = await kafka_trigger(demo)
    await approved_by_signal(demo)
    await crash_and_recover(demo)
    await one_checkout_per_customer(demo)
    await cancelled_while_waiting_for_payment(demo)
    await finish_unapproved(demo, unapproved)
    await nightly_reconciliation(demo)
    await fulfilment_completes(demo, succeeded)
    await fulfilment_undone(demo, by_kafka)
    after = await demo.snapshot()
    report(demo, before, after)
    await check_books(demo, before, after)
    if shards is not None:
        heading("", "Past one database: every saga's history, and where it lives")
        await shards.check_histories()
    where_to_look(demo)
    return demo.placed


def where_to_look(demo: Demo) -> None:
    t = demo.target
    example = demo.placed[-1].saga_id if demo.placed else "SAGA_ID"
    prefix = t.kafka.topic_prefix
    heading("", "Where to look")
    say(
        f"  a saga's history    SAGA_PG__DB_SCHEMA={t.engine_schema} .venv/bin/saga replay {example} "
        "--sagas services_demo.sagas (from Postgres; `saga history ID` asks a running engine)"
    )
    say(f"  the engine's tables SELECT saga_id, status, current_step FROM {t.engine_schema}.sagas;")
    say(
        f"                      SELECT seq, kind, data FROM {t.engine_schema}.saga_events "
        f"WHERE saga_id = '{example}' ORDER BY seq;"
    )
    if t.shards:
        say(
            f"  past one database   the sagas' tables are in each shard's database (schema "
            f"{t.engine_schema}): "
            + ", ".join(f"{sh['name']} {sh['dsn'].rsplit('@', 1)[-1]}" for sh in t.shards)
            + "; `saga shard status` with the engine's settings"
        )
    if t.service_schemas:
        say(f"  the services' data  schemas {', '.join(t.service_schemas)} (one per service)")
    say(f"  Kafka               {prefix}.inbox, {prefix}.cmd.*, {t.orders_topic}, {prefix}.dlq")
    say("  the services' APIs  " + ", ".join(f"{t.urls[s]}/docs" for s in SERVICES[:4]))


def report(demo: Demo, before: Snapshot, after: Snapshot) -> None:
    heading("", "Every saga")
    for p in demo.placed:
        outcome = p.order.get("reason") or f"total {p.order.get('total')}"
        say(f"  {p.label:<22} {p.order_id:<22} order {p.order.get('status')}: {outcome}")
        say(f"  {'':<22} saga {p.saga_id} {p.saga_status}")
        say(f"  {'':<22} {p.summary}")
    heading("", "Balances and stock, before and after")
    customers = sorted({p.customer for p in demo.placed})
    for c in customers:
        spent = before.balances[c] - after.balances[c]
        say(f"  {c:<8} balance {before.balances[c]:>7} -> {after.balances[c]:>7}  (spent {spent})")
    for sku in sorted(before.available):
        say(
            f"  {sku:<8} in stock {before.available[sku]:>6} -> {after.available[sku]:>6}  "
            f"reserved {before.reserved[sku]} -> {after.reserved[sku]}  "
            f"picked {before.picked[sku]} -> {after.picked[sku]}"
        )


async def check_books(demo: Demo, before: Snapshot, after: Snapshot) -> None:
    """Confirmed orders took exactly their totals and units; rejected ones took nothing."""
    heading("", "Nothing leaked")
    confirmed = [p for p in demo.placed if p.expect == "confirmed"]
    for c in sorted({p.customer for p in demo.placed}):
        owed = sum(p.total for p in confirmed if p.customer == c)
        check(
            before.balances[c] - after.balances[c] == owed,
            f"{c} paid {owed}: the totals of the confirmed orders, nothing for the rejected",
        )
        held = await demo.reservations(c)
        for p in demo.placed:
            if p.customer != c:
                continue
            status = held.get(p.order_id, {}).get("status")
            want = {"reserved"} if p.expect == "confirmed" else {None, "released"}
            check(status in want, f"{p.order_id}: credit {status}", quiet=True)
    taken: Counter[str] = Counter()
    for p in confirmed:
        for line in p.items:
            taken[line["sku"]] += line["qty"]
    for sku in sorted(before.available):
        check(
            before.available[sku] - after.available[sku] == taken[sku]
            and after.reserved[sku] - before.reserved[sku] == taken[sku],
            f"{sku}: {taken[sku]} unit(s) taken by confirmed orders, every other unit back",
            quiet=not taken[sku],
        )


# --------------------------------------------------------------------------- main


def _local_config(sharded: bool) -> StackConfig:
    port = os.environ.get("SAGA_DEMO_BASE_PORT")
    config = StackConfig.from_env(
        f"demo_{uuid.uuid4().hex[:6]}",
        base_port=int(port) if port else free_base_port(),
        approval_timeout_s=float(os.environ.get("SAGA_DEMO_APPROVAL_TIMEOUT_S", "30")),
    )
    if not sharded:
        return config
    second = [d for d in os.environ.get("SAGA_DEV_PG_SHARD_DSNS", "").split(",") if d]
    if not second:
        raise StackError(
            "--shards needs a second Postgres cluster: run `make demo-shards`, or name one "
            "in SAGA_DEV_PG_SHARD_DSNS (`SAGA_DEV_PG_CLUSTERS=2 make up` prints it)"
        )
    half = config.partitions // 2
    shards = (
        DemoShard("a", f"0-{half - 1}", config.dsn),
        DemoShard("b", f"{half}-{config.partitions - 1}", second[0]),
    )
    return dataclasses.replace(config, shards=shards)


async def _main_local(keep: bool, sharded: bool = False) -> int:
    try:
        config = _local_config(sharded)
    except StackError as exc:
        say(f"error: {exc}")
        return 2
    stack = DemoStack(config)
    t0 = time.monotonic()
    say("saga-engine demo: a checkout saga across five services, over Kafka and HTTP")
    say(
        f"  Postgres schemas {config.namespace}_*, Kafka topics {config.topic_prefix}.*, "
        f"logs in {config.logs}/{config.namespace}-*.log"
    )
    ok = False
    try:
        await stack.start()
        say(f"  engine and services up in {time.monotonic() - t0:.1f}s:")
        for s in SERVICES:
            page = "/health (Go)" if s == "shipping" else "/docs"
            say(f"    {s:<10} {config.url(s)}{page}")
        async with Demo(
            Target.of_stack(stack), approval_timeout_s=config.approval_timeout_s
        ) as demo:
            await run_scenarios(demo, ShardMove(demo, stack) if sharded else None)
        ok = True
    except (DemoFailed, StackError) as exc:
        say(f"\nFAILED: {exc}")
        for name in stack.procs:
            say(f"--- {name} (last lines of {stack.log_path(name)})\n{stack.log_tail(name, 15)}")
    finally:
        stack.stop()
    if ok and not keep:
        await stack.drop_data()
    elif not ok or keep:
        say(f"\nkept: schemas {', '.join(config.schemas)} and topics {config.topic_prefix}.*")
    say(
        f"\n{'every expectation held' if ok else 'the demo FAILED'} "
        f"({time.monotonic() - t0:.0f}s); the engine and the services are stopped"
    )
    return 0 if ok else 1


async def _main_external(kill_cmd: str | None, start_cmd: str | None) -> int:
    settings = Settings()
    base = int(os.environ.get("SAGA_DEMO_BASE_PORT", "8100"))
    urls = {s: f"http://127.0.0.1:{base + off}" for s, off in PORT_OFFSETS.items()}
    async with httpx.AsyncClient(timeout=5) as http:
        health = (await http.get(f"{urls['orders']}/health")).json()
    target = Target(
        urls=urls,
        engine_dsn=settings.pg.dsn.get_secret_value(),
        engine_schema=settings.pg.db_schema,
        kafka=settings.kafka,
        orders_topic=health["orders_topic"],
        engine=CommandEngine(kill_cmd, start_cmd) if kill_cmd and start_cmd else None,
        admin_url=os.environ.get("SAGA_ADMIN_URL"),
        codec=settings.codec,
    )
    try:
        async with Demo(target, approval_timeout_s=float(health["approval_timeout_s"])) as demo:
            await run_scenarios(demo)
    except DemoFailed as exc:
        say(f"\nFAILED: {exc}")
        return 1
    say("\nevery expectation held")
    return 0


#: How docker-compose.yml configures the stack, as seen from the machine.
COMPOSE_ENV = {
    "SAGA_PG__DSN": "postgresql://postgres:saga@127.0.0.1:54329/saga",
    "SAGA_PG__DB_SCHEMA": "demo_engine",
    "SAGA_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:19092",
    "SAGA_KAFKA__TOPIC_PREFIX": "demo",
    "SAGA_KAFKA__GROUP_ID": "demo-engines",
    "SAGA_DEMO_BASE_PORT": "8100",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keep", action="store_true", help="keep the run's schemas and topics")
    parser.add_argument(
        "--external",
        action="store_true",
        help="use a running stack (SAGA_* settings, SAGA_DEMO_BASE_PORT) instead of starting one",
    )
    parser.add_argument("--engine-kill-cmd", help="external: how to SIGKILL the engine")
    parser.add_argument("--engine-start-cmd", help="external: how to start it again")
    parser.add_argument(
        "--compose",
        action="store_true",
        help="external, against `docker compose up` (its settings and `docker compose kill`)",
    )
    parser.add_argument(
        "--shards",
        action="store_true",
        help="the engine's store on two shards (two Postgres clusters: SAGA_DEV_PG_SHARD_DSNS), "
        "a range moved while the scenario runs (`make demo-shards`)",
    )
    args = parser.parse_args(argv)
    if args.shards and (args.compose or args.external):
        parser.error("--shards starts its own stack: not with --external or --compose")
    if args.compose:
        for key, value in COMPOSE_ENV.items():
            os.environ.setdefault(key, value)
        return asyncio.run(
            _main_external(
                args.engine_kill_cmd or "docker compose kill -s SIGKILL engine",
                args.engine_start_cmd or "docker compose start engine",
            )
        )
    if args.external:
        return asyncio.run(_main_external(args.engine_kill_cmd, args.engine_start_cmd))
    return asyncio.run(_main_local(args.keep, args.shards))


if __name__ == "__main__":
    sys.exit(main())
