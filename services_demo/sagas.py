"""The ``checkout`` saga and the Kafka trigger that starts it, the ``fulfilment`` graph
saga that ships a confirmed order, and the nightly ``reconciliation`` saga and its
schedule: ``saga worker services_demo.sagas``.

1. ``create-order``: the orders service prices the order and records it (a no-op when
   ``POST /orders`` created it already; orders that come from Kafka are created here);
2. ``reserve-credit`` (payments), 3. ``reserve-stock`` (inventory);
4. ``fraud-check``: an HTTP step, the engine calls ``POST /check`` on the fraud service,
   which answers 202 and posts its verdict to the step's callback URL later
   (``completion="callback"``, docs/callbacks.md);
5. orders of ``APPROVAL_THRESHOLD`` or more wait for the ``approval`` signal (a timeout
   rejects them);
6. the checkout races the orders service's ``payment-captured`` fact for its order
   (``ctx.wait_event``, correlated by ``order_id``) against the customer's ``cancel``
   signal and ``payment_timeout_s`` (``ctx.first``, docs/races.md): a capture published
   before the checkout got here is matched too; a cancel, or no capture in time, rejects
   the order, and so does a capture of another amount than the order's total;
7. ``child:shipment``: a child saga, ``shipment``, books the carrier (shipping); its id
   derives from the checkout's, and ``GET /sagas/{id}`` shows the one from the other;
8. ``confirm-order`` (orders).

One checkout per customer runs at a time (``concurrency``): a customer's second order
waits for the first to end, first come first served, and says so in its ``waiting_for``
("queued behind saga ..."), so two checkouts never spend one balance at once.

Any failure first marks the order rejected with the reason (``reject-order``), then the
engine compensates in reverse: undo the shipment child (which cancels its booking),
release the stock, release the credit. A shipment the carrier refused undid itself: the
checkout's step fails and nothing is owed for it.
``create-order``'s own compensation rejects the order if nothing else did (a cancelled
saga never reaches the ``except`` below); after ``reject-order`` it is a no-op.

``fulfilment`` is declared as a graph (``saga_engine.graph``, see docs/graphs.md): ``pick``
(one inventory step per line) and ``invoice`` (payments, which renders the PDF: the heavy
step) start together; ``gift_wrap`` (only for a gift) after the picking, ``pack`` after
both, ``label`` (the Go shipping service) after the packing and the invoice, ``notify``
(an HTTP call to the orders service) last. A failure undoes the graph in reverse: the
label first, then the parcel and the invoice together, the wrapping, the picked lines.
"""

from __future__ import annotations

import functools
from datetime import timedelta

from saga_engine import (
    ConcurrencyLimit,
    Cost,
    EventSource,
    RetryPolicy,
    Saga,
    SagaContext,
    Settings,
    Signal,
    SignalTimeout,
    StepFailed,
    Winner,
)
from saga_engine.graph import GraphSaga, each, http, node, step
from saga_engine.schedules import CatchUp, Overlap, Schedule
from saga_engine.triggers import KafkaTrigger
from services_demo.config import APPROVAL_THRESHOLD, DemoSettings, orders_topic, payments_topic
from services_demo.contracts import (
    Approval,
    CancelCheckout,
    CancelShipment,
    CheckoutInput,
    CheckoutResult,
    ConfirmOrder,
    CreateOrder,
    CreditReserved,
    FraudVerdict,
    Fulfilled,
    FulfilmentInput,
    GiftWrapped,
    InvoiceIssued,
    IssueInvoice,
    LabelPrinted,
    LinePicked,
    Notified,
    Notify,
    OrderCreated,
    OrderRequested,
    PackParcel,
    ParcelPacked,
    PaymentCaptured,
    PickLine,
    PrintLabel,
    PutBackLine,
    ReconcileInput,
    ReconciliationReport,
    RejectOrder,
    ReleaseCredit,
    ReleaseStock,
    ReserveCredit,
    ReserveStock,
    ScheduleShipment,
    ShipmentScheduled,
    StockReserved,
    UnpackParcel,
    UnwrapGift,
    VoidInvoice,
    VoidLabel,
    WrapGift,
)

#: Per-attempt timeout of the Kafka steps, and how often they are re-sent.
STEP_TIMEOUT_S = 10
STEP_RETRY = RetryPolicy(max_attempts=3)
#: How long the fraud check waits for the fraud service's verdict on its callback URL.
FRAUD_CALLBACK_TIMEOUT = timedelta(minutes=2)


class CheckoutRejected(Exception):
    """A business "no" decided by the saga itself (not approved, fraud verdict)."""


def _reason(exc: Exception) -> str:
    if isinstance(exc, StepFailed):
        return f"{exc.step}: {exc.reason}"
    if isinstance(exc, SignalTimeout):
        return "approval: no decision before the approval timeout"
    return str(exc)


#: The orders service publishes ``payment-captured`` when a customer's payment is
#: captured (``POST /orders/{id}/payment``); the engine keeps each fact an hour for a
#: checkout that has not reached its wait yet.
payment_captured = EventSource(
    topic=payments_topic(Settings().kafka.topic_prefix, DemoSettings()),
    model=PaymentCaptured,
    key="order_id",
    retention=timedelta(hours=1),
    name="payment-captured",
)


class Shipment(Saga[ScheduleShipment, ShipmentScheduled]):
    """A child of ``checkout``: books the carrier. A saga of its own, so it shows in the
    admin (with its parent) and can grow steps (labels, pickup) without changing the
    checkout; when the checkout compensates after it completed, it undoes its booking."""

    name = "shipment"

    async def run(self, ctx: SagaContext, shipment: ScheduleShipment) -> ShipmentScheduled:
        return await ctx.step(
            "book-carrier",
            to="shipping",
            command=shipment,
            compensate=CancelShipment(order_id=shipment.order_id),
            returns=ShipmentScheduled,
            timeout=STEP_TIMEOUT_S,
            retry=STEP_RETRY,
        )


class Checkout(Saga[CheckoutInput, CheckoutResult]):
    name = "checkout"
    #: A customer's checkouts run one at a time; the others queue behind, FIFO.
    concurrency = ConcurrencyLimit(key="customer", limit=1)
    #: Large orders wait for it; the engine refuses any other signal, or a bad payload.
    approval = Signal(Approval)
    #: The customer's cancel, raced against the payment and its timeout.
    cancel = Signal(CancelCheckout)

    async def run(self, ctx: SagaContext, order: CheckoutInput) -> CheckoutResult:
        oid, customer, items = order.order_id, order.customer, order.items
        try:
            created = await ctx.step(
                "create-order",
                to="orders",
                command=CreateOrder(order_id=oid, customer=customer, items=items),
                compensate=RejectOrder(
                    order_id=oid, customer=customer, items=items, reason="checkout cancelled"
                ),
                returns=OrderCreated,
                timeout=STEP_TIMEOUT_S,
                retry=STEP_RETRY,
            )
            await ctx.step(
                "reserve-credit",
                to="payments",
                command=ReserveCredit(order_id=oid, customer=customer, amount=created.total),
                compensate=ReleaseCredit(order_id=oid),
                returns=CreditReserved,
                timeout=STEP_TIMEOUT_S,
                retry=STEP_RETRY,
            )
            await ctx.step(
                "reserve-stock",
                to="inventory",
                command=ReserveStock(order_id=oid, items=items),
                compensate=ReleaseStock(order_id=oid),
                returns=StockReserved,
                timeout=STEP_TIMEOUT_S,
                retry=STEP_RETRY,
            )
            verdict = await ctx.http_step(
                "fraud-check",
                endpoint="fraud",
                method="POST",
                path="/check",
                json={"order_id": oid, "customer": customer, "total": created.total},
                returns=FraudVerdict,
                retry=RetryPolicy(max_attempts=3),
                timeout=5,
                # The service answers 202 and posts its verdict to the step's callback
                # URL later (its failure, a blocked customer, to the URL + /fail).
                completion="callback",
                callback_timeout=FRAUD_CALLBACK_TIMEOUT,
            )
            if not verdict.approved:
                raise CheckoutRejected(f"fraud-check: not approved (score {verdict.score})")
            approved_by = None
            if created.total >= APPROVAL_THRESHOLD:
                approval = await ctx.wait_signal(self.approval, timeout=order.approval_timeout_s)
                if not approval.approved:
                    raise CheckoutRejected(f"approval: refused by {approval.by} {approval.note}")
                approved_by = approval.by
            # A race: the payment, the customer's cancel or the timeout, whichever
            # history records first (docs/races.md).
            won = await ctx.first(
                paid=ctx.wait_event(payment_captured, key=oid),
                cancelled=ctx.wait_signal(self.cancel),
                expired=ctx.sleep(order.payment_timeout_s),
            )
            match won:
                case Winner("paid", PaymentCaptured() as paid):
                    pass
                case Winner("cancelled", CancelCheckout() as cancel):
                    raise CheckoutRejected(f"payment: cancelled by the customer {cancel.reason}")
                case _:
                    raise CheckoutRejected("payment: not captured before the payment timeout")
            if paid.amount != created.total:
                raise CheckoutRejected(
                    f"payment: captured {paid.amount}, order total {created.total}"
                )
            shipment = await ctx.child(
                Shipment,
                ScheduleShipment(order_id=oid, customer=customer, items=items),
                poll=60,
            )
            await ctx.step(
                "confirm-order",
                to="orders",
                command=ConfirmOrder(order_id=oid, shipment_id=shipment.shipment_id),
                timeout=STEP_TIMEOUT_S,
                retry=STEP_RETRY,
            )
        except (StepFailed, SignalTimeout, CheckoutRejected) as exc:
            # The order shows why before the compensations run; then the engine undoes
            # the applied steps in reverse order.
            await ctx.step(
                "reject-order",
                to="orders",
                command=RejectOrder(
                    order_id=oid, customer=customer, items=items, reason=_reason(exc)
                ),
                timeout=STEP_TIMEOUT_S,
                retry=RetryPolicy(max_attempts=10),
            )
            raise
        return CheckoutResult(
            order_id=oid,
            total=created.total,
            shipment_id=shipment.shipment_id,
            fraud_score=verdict.score,
            approved_by=approved_by,
        )


def checkout_input(message: OrderRequested) -> CheckoutInput:
    """A trigger message as the saga's input (the approval timeout of this deployment)."""
    return CheckoutInput(
        order_id=message.order_id,
        customer=message.customer,
        items=message.items,
        approval_timeout_s=DemoSettings().approval_timeout_s,
        payment_timeout_s=DemoSettings().payment_timeout_s,
    )


def order_key(order_id: str) -> str:
    """The idempotency key of an order's saga: the same order never starts two sagas,
    whether it came through ``POST /orders`` or a Kafka message."""
    return f"order-{order_id}"


#: Messages on ``{prefix}.orders.requested`` start checkouts (``SAGA_DEMO_ORDERS_TOPIC``
#: overrides the topic). A redelivered or duplicated message maps to the same saga id.
orders_requested = KafkaTrigger(
    topic=orders_topic(Settings().kafka.topic_prefix, DemoSettings()),
    saga=Checkout,
    message=OrderRequested,
    to_input=checkout_input,
    idempotency_key=lambda m: order_key(m.order_id),
)


def fulfilment_key(order_id: str) -> str:
    """The idempotency key of an order's fulfilment: one fulfilment per order."""
    return f"fulfil-{order_id}"


#: A fulfilment's step to a participant over Kafka: the checkout's timeout and retries.
kafka_step = functools.partial(step, timeout=STEP_TIMEOUT_S, retry=STEP_RETRY)


def _lines(order: FulfilmentInput) -> list[PickLine]:
    return [
        PickLine(order_id=order.order_id, line=n, sku=item.sku, qty=item.qty)
        for n, item in enumerate(order.items)
    ]


class Fulfilment(GraphSaga[FulfilmentInput, Fulfilled]):
    """Ships a confirmed order, declared as a graph: the engine runs each node once the
    nodes it names in ``after`` are done, and undoes the graph in reverse on a failure.

    ::

        pick[0..n] ─┬─ gift_wrap (a gift only) ─┐
                    └───────────────────────────┴─ pack ─┐
        invoice ─────────────────────────────────────────┴─ label ── notify (HTTP)
    """

    name = "fulfilment"

    #: One step per line of the order, four at a time; each put back if the rest fails.
    pick = node(
        each(
            _lines,
            kafka_step(
                "inventory",
                lambda order, item: item,
                compensate=lambda order, item: PutBackLine(order_id=order.order_id, line=item.line),
                returns=LinePicked,
            ),
            max_items=50,
            concurrency=4,
        )
    )
    #: Renders the invoice's PDF: the heavy step, in parallel with the picking.
    invoice = node(
        kafka_step(
            "payments",
            lambda order: IssueInvoice(
                order_id=order.order_id, customer=order.customer, amount=order.total
            ),
            compensate=lambda order: VoidInvoice(order_id=order.order_id),
            returns=InvoiceIssued,
            # Rendering the PDF holds 4 of the payments service's 8 CPUs (ENGINE_LIMITS).
            cost=Cost(cpu=4),
        )
    )
    #: Only for a gift (``when``): skipped otherwise, and the packing goes on.
    gift_wrap = node(
        kafka_step(
            "inventory",
            lambda order, pick: WrapGift(
                order_id=order.order_id, units=sum(line.qty for line in pick)
            ),
            compensate=lambda order: UnwrapGift(order_id=order.order_id),
            returns=GiftWrapped,
        ),
        after=[pick],
        when=lambda order: order.gift,
    )
    pack = node(
        kafka_step(
            "inventory",
            lambda order, pick: PackParcel(
                order_id=order.order_id, units=sum(line.qty for line in pick), gift=order.gift
            ),
            compensate=lambda order: UnpackParcel(order_id=order.order_id),
            returns=ParcelPacked,
        ),
        after=[pick, gift_wrap],
    )
    label = node(
        kafka_step(
            "shipping",
            lambda order, pack, invoice: PrintLabel(
                order_id=order.order_id,
                customer=order.customer,
                parcel_id=pack.parcel_id,
                invoice_id=invoice.invoice_id,
            ),
            compensate=lambda order: VoidLabel(order_id=order.order_id),
            returns=LabelPrinted,
        ),
        after=[pack, invoice],
    )
    #: The engine calls the orders service, which tells the customer; it refuses a
    #: customer it cannot reach (``SAGA_DEMO_UNREACHABLE``), and the graph is undone.
    notify = node(
        http(
            "orders",
            "/notifications",
            lambda order, label, invoice: Notify(
                order_id=order.order_id,
                customer=order.customer,
                tracking=label.tracking,
                invoice_id=invoice.invoice_id,
            ).model_dump(),
            returns=Notified,
            retry=RetryPolicy(max_attempts=3),
            timeout=5,
        ),
        after=[label],
    )


__all__ = [
    "Checkout",
    "CheckoutRejected",
    "Fulfilment",
    "Shipment",
    "checkout_input",
    "fulfilment_key",
    "order_key",
    "orders_requested",
    "payment_captured",
]


class Reconciliation(Saga[ReconcileInput, ReconciliationReport]):
    """The nightly reconciliation: reads every customer's balance from the payments
    service (an HTTP step) and reports the books' total. A schedule starts it every
    night; operators can trigger it now (``saga schedule trigger nightly-reconciliation``)."""

    name = "reconciliation"

    async def run(self, ctx: SagaContext, job: ReconcileInput) -> ReconciliationReport:
        balances = await ctx.http_step(
            "read-balances",
            endpoint=job.ledger,
            method="GET",
            path="/customers",
            retry=RetryPolicy(max_attempts=3),
            timeout=5,
        )
        return ReconciliationReport(
            customers=len(balances), total_balance=sum(int(v) for v in balances.values())
        )


#: Declared here, created by the worker at its start: 02:00 UTC every night. A night the
#: engines were down is caught up once (``last``); a run still going is not doubled.
NIGHTLY_RECONCILIATION = Schedule(
    id="nightly-reconciliation",
    saga=Reconciliation,
    cron="0 2 * * *",
    input={"ledger": "payments"},
    catchup=CatchUp.LAST,
    overlap=Overlap.SKIP,
)
