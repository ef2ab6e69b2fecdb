"""The orders service (port base+1): takes orders over HTTP and starts the checkout saga.

- ``POST /orders`` records the order (pending), starts the ``checkout`` saga through the
  saga inbox on Kafka and answers 202. With an ``Idempotency-Key`` header, a repeat
  returns the same order and saga (and re-sends the start, which the engine dedupes).
- ``GET /orders/{id}`` shows the order as the saga moves it: pending, then confirmed or
  rejected with the reason. ``GET /orders`` lists them.
- ``POST /orders/{id}/approval`` sends the ``approval`` signal to a large order's saga.
- ``POST /orders/{id}/cancel`` sends the ``cancel`` signal: the checkout races it against
  the payment and the payment timeout.
- ``POST /orders/{id}/payment`` is the payment provider's webhook: it records the captured
  amount and publishes the ``payment-captured`` fact (``SagaClient.publish_event``, the id
  ``capture-{order_id}``, so a repeated webhook is kept once); the checkout waits for it.
- ``POST /notifications`` is called by the engine (the ``fulfilment`` saga's HTTP node
  ``notify``): it tells the customer their parcel is on its way, once per
  ``Idempotency-Key``, and refuses (422) an order that is not confirmed or a customer it
  cannot reach (``SAGA_DEMO_UNREACHABLE``, default ``dave``).
- As a participant it handles ``CreateOrder`` (the saga's first step: it prices the
  order, and creates it when it came from Kafka rather than HTTP), ``ConfirmOrder`` and
  ``RejectOrder``.

Run it with ``uvicorn services_demo.orders:app --port 8101``.
"""

from __future__ import annotations

import contextlib
import hashlib
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any

import asyncpg
import orjson
from fastapi import FastAPI, Header, HTTPException, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from saga_engine import Settings, TransientError, saga_id_for
from saga_engine.client import SagaClient
from saga_engine.participant import Participant, Rejected, Transaction
from services_demo._service import (
    Holder,
    add_health,
    answer_once,
    answers_ddl,
    observe,
    running_service,
)
from services_demo.config import APPROVAL_THRESHOLD, PRICES
from services_demo.contracts import (
    NAME_PATTERN,
    Approval,
    CancelCheckout,
    CheckoutInput,
    ConfirmOrder,
    CreateOrder,
    Item,
    Notified,
    Notify,
    OrderCreated,
    OrderState,
    PaymentCaptured,
    RejectOrder,
)
from services_demo.sagas import Checkout, order_key, orders_requested, payment_captured

DDL = """
CREATE TABLE IF NOT EXISTS orders (
    order_id        text PRIMARY KEY,
    saga_id         text NOT NULL,
    customer        text NOT NULL,
    items           jsonb NOT NULL,
    total           int,
    status          text NOT NULL CHECK (status IN ('pending', 'confirmed', 'rejected')),
    reason          text,
    shipment_id     text,
    source          text NOT NULL,
    idempotency_key text UNIQUE,
    request_hash    text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);
-- Added with the payment-captured fact: a stack that ran an older demo gets it too.
ALTER TABLE orders ADD COLUMN IF NOT EXISTS captured int;
""" + answers_ddl("notifications")


class PriceError(ValueError):
    pass


def price(items: list[Item]) -> int:
    unknown = sorted({i.sku for i in items if i.sku not in PRICES})
    if unknown:
        raise PriceError(f"unknown SKU {', '.join(unknown)} (we sell {', '.join(sorted(PRICES))})")
    return sum(PRICES[i.sku] * i.qty for i in items)


def _items_json(items: list[Item]) -> str:
    return orjson.dumps([i.model_dump() for i in items]).decode()


def saga_id_of(order_id: str) -> str:
    return saga_id_for(Checkout.name, order_key(order_id))


# --------------------------------------------------------------------------- participant


def build_participant(settings: Settings) -> Participant:
    orders = Participant("orders", settings)

    @orders.handles(CreateOrder)
    async def create(cmd: CreateOrder, tx: Transaction) -> OrderCreated:
        total = await tx.fetchval("SELECT total FROM orders WHERE order_id = $1", cmd.order_id)
        if total is not None:  # created by POST /orders: already priced
            return OrderCreated(order_id=cmd.order_id, total=total)
        try:
            total = price(cmd.items)
        except PriceError as exc:
            raise Rejected(str(exc)) from None
        await tx.execute(
            "INSERT INTO orders (order_id, saga_id, customer, items, total, status, source) "
            "VALUES ($1, $2, $3, $4::jsonb, $5, 'pending', 'kafka')",
            cmd.order_id,
            tx.saga_id,
            cmd.customer,
            _items_json(cmd.items),
            total,
        )
        return OrderCreated(order_id=cmd.order_id, total=total)

    @orders.handles(ConfirmOrder)
    async def confirm(cmd: ConfirmOrder, tx: Transaction) -> OrderState:
        status = await tx.fetchval(
            "SELECT status FROM orders WHERE order_id = $1 FOR UPDATE", cmd.order_id
        )
        if status is None:
            raise Rejected(f"no order {cmd.order_id}")
        if status == "rejected":
            raise Rejected(f"order {cmd.order_id} was rejected already")
        await tx.execute(
            "UPDATE orders SET status = 'confirmed', shipment_id = $2, updated_at = now() "
            "WHERE order_id = $1",
            cmd.order_id,
            cmd.shipment_id,
        )
        return OrderState(order_id=cmd.order_id, status="confirmed")

    @orders.handles(RejectOrder)
    async def reject(cmd: RejectOrder, tx: Transaction) -> OrderState:
        # Creates the order if the saga failed before create-order did (an unknown SKU in
        # a Kafka message); a pending order becomes rejected; the first reason stays.
        row = await tx.fetchrow(
            "INSERT INTO orders (order_id, saga_id, customer, items, status, reason, source) "
            "VALUES ($1, $2, $3, $4::jsonb, 'rejected', $5, 'kafka') "
            "ON CONFLICT (order_id) DO UPDATE SET status = 'rejected', reason = $5, "
            "updated_at = now() WHERE orders.status = 'pending' "
            "RETURNING status, reason",
            cmd.order_id,
            tx.saga_id,
            cmd.customer,
            _items_json(cmd.items),
            cmd.reason,
        )
        if row is None:
            row = await tx.fetchrow(
                "SELECT status, reason FROM orders WHERE order_id = $1", cmd.order_id
            )
            assert row is not None
        return OrderState(order_id=cmd.order_id, status=row["status"], reason=row["reason"])

    return orders


# --------------------------------------------------------------------------- HTTP API


class NewOrder(BaseModel):
    customer: str = Field(pattern=NAME_PATTERN, examples=["alice"])
    items: list[Item] = Field(min_length=1, max_length=50, examples=[[{"sku": "book", "qty": 2}]])


class Accepted(BaseModel):
    order_id: str
    saga_id: str
    status_url: str


class OrderView(BaseModel):
    order_id: str
    saga_id: str
    customer: str
    items: list[Item]
    total: int | None
    status: str
    reason: str | None
    shipment_id: str | None
    #: The amount the payment provider captured (``POST /orders/{id}/payment``).
    captured: int | None = None
    source: str
    created_at: str
    updated_at: str


class PaymentRequest(BaseModel):
    amount: int = Field(gt=0)


class ApprovalRequest(BaseModel):
    approved: bool = True
    by: str = "operator"
    note: str = ""


def _view(row: asyncpg.Record) -> OrderView:
    return OrderView(
        order_id=row["order_id"],
        saga_id=row["saga_id"],
        customer=row["customer"],
        items=[Item.model_validate(i) for i in orjson.loads(row["items"])],
        total=row["total"],
        status=row["status"],
        reason=row["reason"],
        shipment_id=row["shipment_id"],
        captured=row["captured"],
        source=row["source"],
        created_at=row["created_at"].isoformat(),
        updated_at=row["updated_at"].isoformat(),
    )


def create_app() -> FastAPI:
    holder = Holder()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with running_service("orders", ddl=DDL, participant=build_participant) as svc:
            svc.extra_health.update(
                approval_threshold=APPROVAL_THRESHOLD,
                approval_timeout_s=svc.demo.approval_timeout_s,
                orders_topic=orders_requested.topic,
            )
            async with SagaClient(svc.settings, source="/services-demo/orders") as client:
                svc.saga_client = client
                holder.set(svc)
                try:
                    yield
                finally:
                    holder.set(None)

    app = FastAPI(
        title="orders",
        summary="Takes orders and starts a checkout saga for each (saga-engine demo).",
        lifespan=lifespan,
    )
    add_health(app, holder)
    observe(app, "orders")

    def saga_client() -> SagaClient:
        client = holder.service.saga_client
        assert client is not None
        return client

    async def start_saga(order_id: str, customer: str, items: list[Item]) -> str:
        saga_input = CheckoutInput(
            order_id=order_id,
            customer=customer,
            items=items,
            approval_timeout_s=holder.service.demo.approval_timeout_s,
            payment_timeout_s=holder.service.demo.payment_timeout_s,
        )
        try:
            return await saga_client().start(
                Checkout, saga_input, idempotency_key=order_key(order_id)
            )
        except TransientError as exc:
            # The order is recorded; the same request again (same Idempotency-Key) starts it.
            raise HTTPException(
                503,
                f"order {order_id} is recorded but its checkout could not start ({exc}); "
                "send the same request again with the same Idempotency-Key",
            ) from exc

    @app.post("/orders", status_code=202, response_model=Accepted, tags=["orders"])
    async def place_order(
        order: NewOrder,
        response: Response,
        idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
    ) -> Accepted:
        """Records the order and starts its checkout saga; the saga decides its fate."""
        try:
            total = price(order.items)
        except PriceError as exc:
            raise HTTPException(422, str(exc)) from None
        request_hash = hashlib.sha256(order.model_dump_json().encode()).hexdigest()
        order_id = f"ord-{uuid.uuid4().hex[:12]}"
        pool = holder.pool
        row = await pool.fetchrow(
            "INSERT INTO orders (order_id, saga_id, customer, items, total, status, source, "
            "idempotency_key, request_hash) "
            "VALUES ($1, $2, $3, $4::jsonb, $5, 'pending', 'http', $6, $7) "
            "ON CONFLICT (idempotency_key) DO NOTHING RETURNING order_id",
            order_id,
            saga_id_of(order_id),
            order.customer,
            _items_json(order.items),
            total,
            idempotency_key,
            request_hash,
        )
        if row is None:  # a repeat of an earlier request with this Idempotency-Key
            existing = await pool.fetchrow(
                "SELECT order_id, request_hash FROM orders WHERE idempotency_key = $1",
                idempotency_key,
            )
            assert existing is not None
            if existing["request_hash"] != request_hash:
                raise HTTPException(
                    409, "this Idempotency-Key was used for a different order request"
                )
            order_id = existing["order_id"]
            response.headers["Idempotent-Replayed"] = "true"
        # Sent again on a repeat too: if the first attempt died before the start left,
        # this one starts the saga; if not, the engine recognises the saga id.
        saga_id = await start_saga(order_id, order.customer, order.items)
        return Accepted(order_id=order_id, saga_id=saga_id, status_url=f"/orders/{order_id}")

    @app.get("/orders/{order_id}", response_model=OrderView, tags=["orders"])
    async def get_order(order_id: str) -> OrderView:
        row = await holder.pool.fetchrow("SELECT * FROM orders WHERE order_id = $1", order_id)
        if row is None:
            raise HTTPException(404, f"no order {order_id}")
        return _view(row)

    @app.get("/orders", response_model=list[OrderView], tags=["orders"])
    async def list_orders(customer: str | None = None, limit: int = 100) -> list[OrderView]:
        rows = await holder.pool.fetch(
            "SELECT * FROM orders WHERE $1::text IS NULL OR customer = $1 "
            "ORDER BY created_at DESC LIMIT $2",
            customer,
            min(max(limit, 1), 1000),
        )
        return [_view(r) for r in rows]

    @app.post("/orders/{order_id}/approval", status_code=202, tags=["orders"])
    async def approve(order_id: str, decision: ApprovalRequest) -> dict[str, Any]:
        """Sends the ``approval`` signal to the order's saga (large orders wait for it)."""
        row = await holder.pool.fetchrow(
            "SELECT saga_id, status FROM orders WHERE order_id = $1", order_id
        )
        if row is None:
            raise HTTPException(404, f"no order {order_id}")
        if row["status"] != "pending":
            raise HTTPException(409, f"order {order_id} is {row['status']} already")
        signal = Approval(approved=decision.approved, by=decision.by, note=decision.note)
        try:
            signal_id = await saga_client().signal(row["saga_id"], Checkout.approval, signal)
        except TransientError as exc:
            raise HTTPException(503, f"the approval could not be sent ({exc}); retry") from exc
        return {"order_id": order_id, "saga_id": row["saga_id"], "signal_id": signal_id}

    @app.post("/orders/{order_id}/cancel", status_code=202, tags=["orders"])
    async def cancel(order_id: str, request: CancelCheckout) -> dict[str, Any]:
        """Sends the ``cancel`` signal to the order's saga: the customer cancels while it
        waits for the payment (before that, the saga takes it once it waits)."""
        row = await holder.pool.fetchrow(
            "SELECT saga_id, status FROM orders WHERE order_id = $1", order_id
        )
        if row is None:
            raise HTTPException(404, f"no order {order_id}")
        if row["status"] != "pending":
            raise HTTPException(409, f"order {order_id} is {row['status']} already")
        try:
            signal_id = await saga_client().signal(row["saga_id"], Checkout.cancel, request)
        except TransientError as exc:
            raise HTTPException(503, f"the cancel could not be sent ({exc}); retry") from exc
        return {"order_id": order_id, "saga_id": row["saga_id"], "signal_id": signal_id}

    @app.post("/orders/{order_id}/payment", status_code=202, tags=["orders"])
    async def payment_captured_hook(order_id: str, payment: PaymentRequest) -> dict[str, Any]:
        """The payment provider's webhook: records the capture and publishes the fact."""
        # The first capture's amount stays; the same amount again is a repeated webhook
        # (the fact is published again under the same id, which the engines keep once).
        row = await holder.pool.fetchrow(
            "UPDATE orders SET captured = coalesce(captured, $2), updated_at = now() "
            "WHERE order_id = $1 RETURNING captured",
            order_id,
            payment.amount,
        )
        if row is None:
            raise HTTPException(404, f"no order {order_id}")
        if row["captured"] != payment.amount:
            raise HTTPException(409, f"order {order_id} was captured for {row['captured']}")
        fact = PaymentCaptured(order_id=order_id, amount=payment.amount)
        try:
            event_id = await saga_client().publish_event(
                payment_captured, fact, event_id=f"capture-{order_id}"
            )
        except TransientError as exc:
            raise HTTPException(503, f"the capture could not be published ({exc}); retry") from exc
        return {"order_id": order_id, "event_id": event_id}

    @app.post(
        "/notifications",
        response_model=Notified,
        responses={422: {"description": "not confirmed, or the customer cannot be reached"}},
        tags=["notifications"],
    )
    async def notify(
        body: Notify, idempotency_key: Annotated[str, Header(min_length=1, max_length=200)]
    ) -> JSONResponse:
        """Tells the customer their parcel is on its way (called by the engine for the
        fulfilment's ``notify`` node); the same ``Idempotency-Key`` gets the same answer."""
        status = await holder.pool.fetchval(
            "SELECT status FROM orders WHERE order_id = $1", body.order_id
        )
        code, answer = (
            200,
            Notified(
                order_id=body.order_id,
                notification_id=f"ntf-{idempotency_key[:12]}",
                channel="email",
            ).model_dump(),
        )
        if status != "confirmed":
            code, answer = 422, {"detail": f"order {body.order_id} is {status or 'unknown'}"}
        elif body.customer in holder.service.demo.unreachable_customers:
            code, answer = 422, {"detail": f"no contact address for {body.customer}"}
        stored, response, _ = await answer_once(
            holder.pool, "notifications", idempotency_key, body, code, answer
        )
        return JSONResponse(response, status_code=stored)

    return app


app = create_app()
