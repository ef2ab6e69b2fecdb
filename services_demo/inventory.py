"""The inventory service (port base+3): stock per SKU, reserved per order.

``ReserveStock`` takes every line of the order out of stock or, when one is short,
refuses the whole order (nothing is taken); ``ReleaseStock`` puts an order's reserved
units back and is a no-op when nothing is reserved for it. ``GET /stock/{sku}`` shows
what is available and reserved.

Run it with ``uvicorn services_demo.inventory:app --port 8103``.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import AsyncIterator

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

from saga_engine import Settings
from saga_engine.participant import Participant, Rejected, Transaction
from services_demo._service import Connection, Holder, add_health, observe, running_service
from services_demo.config import STOCK
from services_demo.contracts import Item, ReleaseStock, ReserveStock, StockReleased, StockReserved

DDL = """
CREATE TABLE IF NOT EXISTS stock (
    sku       text PRIMARY KEY,
    available int NOT NULL CHECK (available >= 0)
);
CREATE TABLE IF NOT EXISTS reservations (
    order_id    text NOT NULL,
    sku         text NOT NULL REFERENCES stock,
    qty         int NOT NULL CHECK (qty > 0),
    status      text NOT NULL CHECK (status IN ('reserved', 'released')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    released_at timestamptz,
    PRIMARY KEY (order_id, sku)
);
CREATE INDEX IF NOT EXISTS reservations_sku_idx ON reservations (sku);
"""


async def seed(conn: Connection) -> None:
    await conn.executemany(
        "INSERT INTO stock (sku, available) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        list(STOCK.items()),
    )


def build_participant(settings: Settings) -> Participant:
    inventory = Participant("inventory", settings)

    @inventory.handles(ReserveStock)
    async def reserve(cmd: ReserveStock, tx: Transaction) -> StockReserved:
        held = await tx.fetch(
            "SELECT sku, qty FROM reservations WHERE order_id = $1 AND status = 'reserved'",
            cmd.order_id,
        )
        if held:  # the business key: one reservation per order
            items = [Item(sku=r["sku"], qty=r["qty"]) for r in held]
            return StockReserved(order_id=cmd.order_id, items=items)
        wanted: Counter[str] = Counter()
        for item in cmd.items:
            wanted[item.sku] += item.qty
        # Rows locked in a fixed order, so two orders for the same SKUs never deadlock.
        rows = await tx.fetch(
            "SELECT sku, available FROM stock WHERE sku = ANY($1::text[]) ORDER BY sku FOR UPDATE",
            sorted(wanted),
        )
        available = {r["sku"]: r["available"] for r in rows}
        unknown = sorted(set(wanted) - set(available))
        if unknown:
            raise Rejected(f"unknown SKU {', '.join(unknown)}")
        short = {sku: (available[sku], qty) for sku, qty in wanted.items() if available[sku] < qty}
        if short:
            detail = ", ".join(f"{s} has {a}, the order needs {q}" for s, (a, q) in short.items())
            raise Rejected(f"out of stock: {detail}")
        for sku, qty in sorted(wanted.items()):
            await tx.execute("UPDATE stock SET available = available - $2 WHERE sku = $1", sku, qty)
            await tx.execute(
                "INSERT INTO reservations (order_id, sku, qty, status) "
                "VALUES ($1, $2, $3, 'reserved')",
                cmd.order_id, sku, qty,
            )  # fmt: skip
        items = [Item(sku=s, qty=q) for s, q in sorted(wanted.items())]
        return StockReserved(order_id=cmd.order_id, items=items)

    @inventory.handles(ReleaseStock)
    async def release(cmd: ReleaseStock, tx: Transaction) -> StockReleased:
        rows = await tx.fetch(
            "UPDATE reservations SET status = 'released', released_at = now() "
            "WHERE order_id = $1 AND status = 'reserved' RETURNING sku, qty",
            cmd.order_id,
        )
        # Nothing reserved (refused, or released before): nothing to do.
        for r in sorted(rows, key=lambda r: str(r["sku"])):
            await tx.execute(
                "UPDATE stock SET available = available + $2 WHERE sku = $1", r["sku"], r["qty"]
            )
        items = [Item(sku=r["sku"], qty=r["qty"]) for r in rows]
        return StockReleased(order_id=cmd.order_id, items=items)

    return inventory


class StockLevel(BaseModel):
    sku: str
    available: int
    reserved: int


def create_app() -> FastAPI:
    holder = Holder()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with running_service(
            "inventory", ddl=DDL, seed=seed, participant=build_participant
        ) as svc:
            holder.set(svc)
            try:
                yield
            finally:
                holder.set(None)

    app = FastAPI(
        title="inventory",
        summary="Stock per SKU, reserved and released by checkout sagas (saga-engine demo).",
        lifespan=lifespan,
    )
    add_health(app, holder)
    observe(app, "inventory")

    query = (
        "SELECT s.sku, s.available, COALESCE(SUM(r.qty) FILTER (WHERE r.status = 'reserved'), 0)"
        " AS reserved FROM stock s LEFT JOIN reservations r ON r.sku = s.sku"
    )

    @app.get("/stock/{sku}", response_model=StockLevel, tags=["inventory"])
    async def get_stock(sku: str) -> StockLevel:
        row = await holder.pool.fetchrow(f"{query} WHERE s.sku = $1 GROUP BY s.sku", sku)
        if row is None:
            raise HTTPException(404, f"no SKU {sku}")
        return StockLevel(**dict(row))

    @app.get("/stock", response_model=list[StockLevel], tags=["inventory"])
    async def list_stock() -> list[StockLevel]:
        rows = await holder.pool.fetch(f"{query} GROUP BY s.sku ORDER BY s.sku")
        return [StockLevel(**dict(r)) for r in rows]

    return app


app = create_app()
