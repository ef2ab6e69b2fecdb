"""The inventory service (port base+3): stock per SKU, reserved per order.

``ReserveStock`` takes every line of the order out of stock or, when one is short,
refuses the whole order (nothing is taken): a batch handler decides the orders of a
consumed batch together, in order; ``ReleaseStock`` puts an order's reserved
units back and is a no-op when nothing is reserved for it. ``GET /stock/{sku}`` shows
what is available, reserved and picked.

It also runs the warehouse floor for the ``fulfilment`` saga (``warehouse.py``: picking an
order's lines, gift wrapping, packing, and their undoing); ``GET /fulfilments/{order_id}``
shows an order there.

Run it with ``uvicorn services_demo.inventory:app --port 8103``.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import AsyncIterator

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

from saga_engine import Settings
from saga_engine.participant import CommandBatch, Participant, Rejected, Transaction
from services_demo import warehouse
from services_demo._service import Connection, Holder, add_health, observe, running_service
from services_demo.config import STOCK
from services_demo.contracts import Item, ReleaseStock, ReserveStock, StockReleased, StockReserved

DDL = (
    """
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
    + warehouse.DDL
)


async def seed(conn: Connection) -> None:
    await conn.executemany(
        "INSERT INTO stock (sku, available) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        list(STOCK.items()),
    )


def _take(
    order: ReserveStock,
    held: dict[str, list[Item]],
    available: dict[str, int],
    taken: list[tuple[str, str, int]],
) -> StockReserved | Rejected:
    """Decides one order against the stock left by the orders before it in the batch;
    what it takes is added to ``taken`` (and to ``held``), taken out of ``available``."""
    if order.order_id in held:  # the business key: one reservation per order
        return StockReserved(order_id=order.order_id, items=held[order.order_id])
    wanted: Counter[str] = Counter()
    for item in order.items:
        wanted[item.sku] += item.qty
    unknown = sorted(set(wanted) - set(available))
    if unknown:
        return Rejected(f"unknown SKU {', '.join(unknown)}")
    short = {sku: (available[sku], qty) for sku, qty in wanted.items() if available[sku] < qty}
    if short:
        detail = ", ".join(f"{s} has {a}, the order needs {q}" for s, (a, q) in short.items())
        return Rejected(f"out of stock: {detail}")
    items = [Item(sku=s, qty=q) for s, q in sorted(wanted.items())]
    for item in items:
        available[item.sku] -= item.qty
        taken.append((order.order_id, item.sku, item.qty))
    held[order.order_id] = items
    return StockReserved(order_id=order.order_id, items=items)


def build_participant(settings: Settings) -> Participant:
    inventory = Participant("inventory", settings)

    # A batch handler: the orders of a consumed batch are decided together, in order, with
    # one statement per table instead of a few per order. A refused order is answered
    # Rejected and nothing is written for it.
    @inventory.handles_batch(ReserveStock)
    async def reserve(batch: CommandBatch[ReserveStock]) -> list[StockReserved | Rejected]:
        orders = [c.command for c in batch]
        held: dict[str, list[Item]] = {}
        for r in await batch.fetch(
            "SELECT order_id, sku, qty FROM reservations "
            "WHERE order_id = ANY($1::text[]) AND status = 'reserved' ORDER BY order_id, sku",
            [o.order_id for o in orders],
        ):
            held.setdefault(r["order_id"], []).append(Item(sku=r["sku"], qty=r["qty"]))
        # Rows locked in a fixed order, so two batches for the same SKUs never deadlock.
        rows = await batch.fetch(
            "SELECT sku, available FROM stock WHERE sku = ANY($1::text[]) ORDER BY sku FOR UPDATE",
            sorted({item.sku for o in orders for item in o.items}),
        )
        available = {r["sku"]: r["available"] for r in rows}
        taken: list[tuple[str, str, int]] = []
        answers = [_take(order, held, available, taken) for order in orders]
        if taken:
            order_ids, skus, qtys = (list(column) for column in zip(*taken, strict=True))
            await batch.execute(
                "UPDATE stock AS s SET available = s.available - x.qty FROM (SELECT sku, "
                "sum(qty) AS qty FROM unnest($1::text[], $2::int[]) AS t(sku, qty) GROUP BY sku)"
                " AS x WHERE s.sku = x.sku",
                skus,
                qtys,
            )
            await batch.execute(
                "INSERT INTO reservations (order_id, sku, qty, status) SELECT o, s, q, "
                "'reserved' FROM unnest($1::text[], $2::text[], $3::int[]) AS x(o, s, q)",
                order_ids,
                skus,
                qtys,
            )
        return answers

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

    warehouse.register(inventory)
    return inventory


class StockLevel(BaseModel):
    sku: str
    available: int
    reserved: int
    #: Reserved units taken off the shelf by fulfilments (``PickLine``), not put back.
    picked: int


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
        " AS reserved, (SELECT coalesce(sum(p.qty), 0) FROM picks p WHERE p.sku = s.sku"
        " AND p.status = 'picked') AS picked"
        " FROM stock s LEFT JOIN reservations r ON r.sku = s.sku"
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

    @app.get("/fulfilments/{order_id}", response_model=warehouse.OnTheFloor, tags=["warehouse"])
    async def get_fulfilment(order_id: str) -> warehouse.OnTheFloor:
        """An order on the warehouse floor: its picked lines, its wrapping, its parcel."""
        return await warehouse.on_the_floor(holder.pool, order_id)

    return app


app = create_app()
