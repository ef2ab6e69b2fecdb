"""The payments service (port base+2): customer credit, reserved per order.

``ReserveCredit`` takes the order's total off the customer's balance into a reservation,
or refuses (``Rejected``) when the balance is short; ``ReleaseCredit`` gives a reserved
amount back and is a no-op when nothing is reserved for the order. ``GET /customers/{id}``
shows the balance and the reservations.

For the ``fulfilment`` saga it issues invoices: ``IssueInvoice`` renders the invoice's PDF
(the demo's heavy step: a bounded CPU loop in a worker thread stands for the rendering)
and records it, once per order; ``VoidInvoice`` voids it (a no-op when none is issued).
``GET /invoices/{order_id}`` shows one.

Run it with ``uvicorn services_demo.payments:app --port 8102``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

from saga_engine import Settings
from saga_engine.participant import Participant, Rejected, Transaction
from services_demo._service import Connection, Holder, add_health, observe, running_service
from services_demo.config import CUSTOMERS, INVOICE_PDF_BYTES
from services_demo.contracts import (
    CreditReleased,
    CreditReserved,
    InvoiceIssued,
    InvoiceVoided,
    IssueInvoice,
    ReleaseCredit,
    ReserveCredit,
    VoidInvoice,
)

DDL = """
CREATE TABLE IF NOT EXISTS customers (
    customer_id text PRIMARY KEY,
    balance     int NOT NULL CHECK (balance >= 0)
);
CREATE TABLE IF NOT EXISTS reservations (
    order_id    text PRIMARY KEY,
    customer_id text NOT NULL REFERENCES customers,
    amount      int NOT NULL,
    status      text NOT NULL CHECK (status IN ('reserved', 'released')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    released_at timestamptz
);
CREATE INDEX IF NOT EXISTS reservations_customer_idx ON reservations (customer_id);
CREATE TABLE IF NOT EXISTS invoices (
    order_id    text PRIMARY KEY,
    invoice_id  text NOT NULL UNIQUE,
    customer_id text NOT NULL REFERENCES customers,
    amount      int NOT NULL CHECK (amount >= 0),
    pdf_sha256  text NOT NULL,
    status      text NOT NULL CHECK (status IN ('issued', 'void')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    voided_at   timestamptz
);
"""

#: How much work rendering one invoice's PDF takes: about 0.2 s of one CPU.
RENDER_ROUNDS = 1_000_000


def render_pdf(invoice_id: str, customer: str, amount: int) -> str:
    """Stands for rendering the invoice's PDF: a bounded CPU loop; returns its digest."""
    text = f"invoice {invoice_id} for {customer}: {amount} credits".encode()
    return hashlib.pbkdf2_hmac("sha256", text, invoice_id.encode(), RENDER_ROUNDS).hex()


def invoice_pdf(invoice_id: str, customer: str, amount: int, digest: str) -> str:
    """The invoice's document as the reply carries it (base64), made again the same from
    its rendered digest: ``INVOICE_PDF_BYTES``, over the 256 KiB from which the reply
    goes by reference (docs/large-payloads.md)."""
    head = f"%PDF-1.7 invoice {invoice_id} for {customer}: {amount} credits\n".encode()
    body = hashlib.shake_256(digest.encode()).digest(INVOICE_PDF_BYTES - len(head))
    return base64.b64encode(head + body).decode()


async def seed(conn: Connection) -> None:
    await conn.executemany(
        "INSERT INTO customers (customer_id, balance) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        list(CUSTOMERS.items()),
    )


def build_participant(settings: Settings) -> Participant:
    payments = Participant("payments", settings)

    @payments.handles(ReserveCredit)
    async def reserve(cmd: ReserveCredit, tx: Transaction) -> CreditReserved:
        balance = await tx.fetchval(
            "SELECT balance FROM customers WHERE customer_id = $1 FOR UPDATE", cmd.customer
        )
        if balance is None:
            raise Rejected(f"unknown customer {cmd.customer}")
        held = await tx.fetchrow(
            "SELECT amount, status FROM reservations WHERE order_id = $1", cmd.order_id
        )
        if held is not None:  # the business key: one reservation per order
            if held["status"] != "reserved":
                raise Rejected(f"the credit of order {cmd.order_id} was released already")
            return CreditReserved(order_id=cmd.order_id, amount=held["amount"], balance=balance)
        if balance < cmd.amount:
            raise Rejected(
                f"insufficient credit: {cmd.customer} has {balance}, the order needs {cmd.amount}",
                details={"balance": balance, "needed": cmd.amount},
            )
        balance = await tx.fetchval(
            "UPDATE customers SET balance = balance - $2 WHERE customer_id = $1 RETURNING balance",
            cmd.customer,
            cmd.amount,
        )
        await tx.execute(
            "INSERT INTO reservations (order_id, customer_id, amount, status) "
            "VALUES ($1, $2, $3, 'reserved')",
            cmd.order_id,
            cmd.customer,
            cmd.amount,
        )
        return CreditReserved(order_id=cmd.order_id, amount=cmd.amount, balance=balance)

    payments.handles(ReleaseCredit)(release_credit)
    payments.handles(IssueInvoice)(issue_invoice)
    payments.handles(VoidInvoice)(void_invoice)
    return payments


async def issue_invoice(cmd: IssueInvoice, tx: Transaction) -> InvoiceIssued:
    row = await tx.fetchrow(
        "SELECT invoice_id, amount, pdf_sha256 FROM invoices WHERE order_id = $1 FOR UPDATE",
        cmd.order_id,
    )
    if row is not None:  # the business key: one invoice per order (issued again if voided)
        if row["amount"] != cmd.amount:
            raise Rejected(
                f"order {cmd.order_id} was invoiced for {row['amount']}, not {cmd.amount}"
            )
        await tx.execute(
            "UPDATE invoices SET status = 'issued', voided_at = NULL WHERE order_id = $1",
            cmd.order_id,
        )
        return InvoiceIssued(
            order_id=cmd.order_id,
            invoice_id=row["invoice_id"],
            amount=row["amount"],
            pdf_sha256=row["pdf_sha256"],
            pdf=invoice_pdf(row["invoice_id"], cmd.customer, row["amount"], row["pdf_sha256"]),
        )
    if await tx.fetchval("SELECT 1 FROM customers WHERE customer_id = $1", cmd.customer) is None:
        raise Rejected(f"unknown customer {cmd.customer}")
    invoice_id = f"inv-{tx.command_id[:12]}"
    # The heavy part, off the event loop: the participant's other commands go on.
    pdf = await asyncio.to_thread(render_pdf, invoice_id, cmd.customer, cmd.amount)
    await tx.execute(
        "INSERT INTO invoices (order_id, invoice_id, customer_id, amount, pdf_sha256, status) "
        "VALUES ($1, $2, $3, $4, $5, 'issued')",
        cmd.order_id,
        invoice_id,
        cmd.customer,
        cmd.amount,
        pdf,
    )
    return InvoiceIssued(
        order_id=cmd.order_id,
        invoice_id=invoice_id,
        amount=cmd.amount,
        pdf_sha256=pdf,
        pdf=invoice_pdf(invoice_id, cmd.customer, cmd.amount, pdf),
    )


async def void_invoice(cmd: VoidInvoice, tx: Transaction) -> InvoiceVoided:
    done = await tx.fetchval(
        "UPDATE invoices SET status = 'void', voided_at = now() "
        "WHERE order_id = $1 AND status = 'issued' RETURNING order_id",
        cmd.order_id,
    )
    # Nothing issued (refused, or voided before): nothing to do.
    return InvoiceVoided(order_id=cmd.order_id, voided=done is not None)


async def release_credit(cmd: ReleaseCredit, tx: Transaction) -> CreditReleased:
    row = await tx.fetchrow(
        "UPDATE reservations SET status = 'released', released_at = now() "
        "WHERE order_id = $1 AND status = 'reserved' RETURNING customer_id, amount",
        cmd.order_id,
    )
    if row is None:  # nothing reserved (refused, or released before): nothing to do
        return CreditReleased(order_id=cmd.order_id, released=0)
    await tx.execute(
        "UPDATE customers SET balance = balance + $2 WHERE customer_id = $1",
        row["customer_id"],
        row["amount"],
    )
    return CreditReleased(order_id=cmd.order_id, released=row["amount"])


class Reservation(BaseModel):
    order_id: str
    amount: int
    status: str


class Invoice(BaseModel):
    order_id: str
    invoice_id: str
    customer_id: str
    amount: int
    pdf_sha256: str
    status: str


class Customer(BaseModel):
    customer_id: str
    balance: int
    reserved: int
    reservations: list[Reservation]


def create_app(
    participant: Callable[[Settings], Participant] = build_participant,
) -> FastAPI:
    """The service; ``participant`` builds its participant kit (another build: a variant
    of its handlers, as a drill's deliberately broken one)."""
    holder = Holder()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with running_service("payments", ddl=DDL, seed=seed, participant=participant) as svc:
            holder.set(svc)
            try:
                yield
            finally:
                holder.set(None)

    app = FastAPI(
        title="payments",
        summary="Customer credit, reserved and released by checkout sagas (saga-engine demo).",
        lifespan=lifespan,
    )
    add_health(app, holder)
    observe(app, "payments")

    async def customer(customer_id: str) -> Customer | None:
        balance = await holder.pool.fetchval(
            "SELECT balance FROM customers WHERE customer_id = $1", customer_id
        )
        if balance is None:
            return None
        rows = await holder.pool.fetch(
            "SELECT order_id, amount, status FROM reservations WHERE customer_id = $1 "
            "ORDER BY created_at",
            customer_id,
        )
        reservations = [Reservation(**dict(r)) for r in rows]
        return Customer(
            customer_id=customer_id,
            balance=balance,
            reserved=sum(r.amount for r in reservations if r.status == "reserved"),
            reservations=reservations,
        )

    @app.get("/customers/{customer_id}", response_model=Customer, tags=["payments"])
    async def get_customer(customer_id: str) -> Customer:
        found = await customer(customer_id)
        if found is None:
            raise HTTPException(404, f"no customer {customer_id}")
        return found

    @app.get("/invoices/{order_id}", response_model=Invoice, tags=["invoices"])
    async def get_invoice(order_id: str) -> Invoice:
        row = await holder.pool.fetchrow(
            "SELECT order_id, invoice_id, customer_id, amount, pdf_sha256, status "
            "FROM invoices WHERE order_id = $1",
            order_id,
        )
        if row is None:
            raise HTTPException(404, f"no invoice for order {order_id}")
        return Invoice(**dict(row))

    @app.get("/customers", tags=["payments"])
    async def list_customers() -> dict[str, int]:
        """Every customer's balance."""
        rows = await holder.pool.fetch("SELECT customer_id, balance FROM customers ORDER BY 1")
        return {r["customer_id"]: r["balance"] for r in rows}

    return app


app = create_app()
