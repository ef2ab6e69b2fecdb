"""The shipping service (port base+5): schedules shipments; a participant only.

``ScheduleShipment`` refuses customers outside the delivery area (``SAGA_DEMO_UNSHIPPABLE``,
default ``erin``), which is how the demo fails a checkout at its last business step;
``CancelShipment`` (the compensation) is a no-op when nothing was scheduled. HTTP:
``/health`` and ``GET /shipments/{order_id}``, for a look.

Run it with ``uvicorn services_demo.shipping:app --port 8105``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, HTTPException

from saga_engine import Settings
from saga_engine.participant import Participant, Rejected, Transaction
from services_demo._service import Holder, add_health, observe, running_service
from services_demo.config import DemoSettings
from services_demo.contracts import (
    CancelShipment,
    ScheduleShipment,
    ShipmentCancelled,
    ShipmentScheduled,
)

DDL = """
CREATE TABLE IF NOT EXISTS shipments (
    order_id    text PRIMARY KEY,
    shipment_id text NOT NULL UNIQUE,
    customer    text NOT NULL,
    status      text NOT NULL CHECK (status IN ('scheduled', 'cancelled')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
"""


def build_participant(settings: Settings) -> Participant:
    shipping = Participant("shipping", settings)
    unshippable = DemoSettings().unshippable_customers

    @shipping.handles(ScheduleShipment)
    async def schedule(cmd: ScheduleShipment, tx: Transaction) -> ShipmentScheduled:
        if cmd.customer in unshippable:
            raise Rejected(f"cannot ship to {cmd.customer}: the address is outside our area")
        shipment_id = await tx.fetchval(
            "INSERT INTO shipments (order_id, shipment_id, customer, status) "
            "VALUES ($1, $2, $3, 'scheduled') "
            "ON CONFLICT (order_id) DO UPDATE SET updated_at = now() RETURNING shipment_id",
            cmd.order_id, f"shp-{tx.command_id[:12]}", cmd.customer,
        )  # fmt: skip
        return ShipmentScheduled(order_id=cmd.order_id, shipment_id=shipment_id)

    @shipping.handles(CancelShipment)
    async def cancel(cmd: CancelShipment, tx: Transaction) -> ShipmentCancelled:
        done = await tx.execute(
            "UPDATE shipments SET status = 'cancelled', updated_at = now() "
            "WHERE order_id = $1 AND status = 'scheduled'",
            cmd.order_id,
        )
        return ShipmentCancelled(order_id=cmd.order_id, cancelled=done.endswith(" 1"))

    return shipping


def create_app() -> FastAPI:
    holder = Holder()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with running_service("shipping", ddl=DDL, participant=build_participant) as svc:
            holder.set(svc)
            try:
                yield
            finally:
                holder.set(None)

    app = FastAPI(
        title="shipping",
        summary="Schedules shipments for checkout sagas (saga-engine demo).",
        lifespan=lifespan,
    )
    add_health(app, holder)
    observe(app, "shipping")

    @app.get("/shipments/{order_id}", tags=["shipping"])
    async def get_shipment(order_id: str) -> dict[str, Any]:
        row = await holder.pool.fetchrow(
            "SELECT order_id, shipment_id, customer, status FROM shipments WHERE order_id = $1",
            order_id,
        )
        if row is None:
            raise HTTPException(404, f"no shipment for order {order_id}")
        return dict(row)

    return app


app = create_app()
