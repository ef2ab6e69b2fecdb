"""The inventory service's warehouse floor: what the ``fulfilment`` saga asks of it.

- ``PickLine`` takes one line of an order off the shelf: the order's stock must be
  reserved (its checkout reserved it), and the order's lines may not pick more of a SKU
  than it reserved. ``PutBackLine`` puts the line back (a no-op when it is not picked).
- ``WrapGift`` wraps an order's picked units; ``UnwrapGift`` undoes it.
- ``PackParcel`` packs every picked unit of an order into one parcel (a gift must be
  wrapped first); ``UnpackParcel`` undoes it.

Each is keyed by its business key (the order and line; the order), so the same command
again answers what it did the first time; an undo followed by the same work again (a
re-run of the fulfilment) does it again. The tables live in the inventory's schema
beside its stock (``DDL``); ``GET /fulfilments/{order_id}`` (``inventory.py``) shows them.
"""

from __future__ import annotations

from pydantic import BaseModel

from saga_engine.participant import Participant, Rejected, Transaction
from services_demo._service import Pool
from services_demo.contracts import (
    GiftUnwrapped,
    GiftWrapped,
    LinePicked,
    LinePutBack,
    PackParcel,
    ParcelPacked,
    ParcelUnpacked,
    PickLine,
    PutBackLine,
    UnpackParcel,
    UnwrapGift,
    WrapGift,
)

DDL = """
CREATE TABLE IF NOT EXISTS picks (
    order_id   text NOT NULL,
    line       int NOT NULL CHECK (line >= 0),
    sku        text NOT NULL REFERENCES stock,
    qty        int NOT NULL CHECK (qty > 0),
    status     text NOT NULL CHECK (status IN ('picked', 'put_back')),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (order_id, line)
);
CREATE INDEX IF NOT EXISTS picks_sku_idx ON picks (sku);
CREATE TABLE IF NOT EXISTS gift_wraps (
    order_id   text PRIMARY KEY,
    units      int NOT NULL CHECK (units > 0),
    status     text NOT NULL CHECK (status IN ('wrapped', 'unwrapped')),
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS parcels (
    order_id   text PRIMARY KEY,
    parcel_id  text NOT NULL UNIQUE,
    units      int NOT NULL CHECK (units > 0),
    gift       boolean NOT NULL,
    status     text NOT NULL CHECK (status IN ('packed', 'unpacked')),
    updated_at timestamptz NOT NULL DEFAULT now()
);
"""


async def _picked_units(tx: Transaction, order_id: str) -> int:
    units: int = await tx.fetchval(
        "SELECT coalesce(sum(qty), 0) FROM picks WHERE order_id = $1 AND status = 'picked'",
        order_id,
    )
    return units


async def _undo(tx: Transaction, table: str, order_id: str, done: str, undone: str) -> bool:
    """An order's row of ``table`` (one of ours) from ``done`` to ``undone``: False, and
    nothing changed, when it is not ``done`` (never done, refused, or undone before)."""
    changed = await tx.fetchval(
        f"UPDATE {table} SET status = $3, updated_at = now() "
        "WHERE order_id = $1 AND status = $2 RETURNING order_id",
        order_id,
        done,
        undone,
    )
    return changed is not None


async def pick_line(cmd: PickLine, tx: Transaction) -> LinePicked:
    picked = LinePicked(order_id=cmd.order_id, line=cmd.line, sku=cmd.sku, qty=cmd.qty)
    row = await tx.fetchrow(
        "SELECT sku, qty, status FROM picks WHERE order_id = $1 AND line = $2",
        cmd.order_id,
        cmd.line,
    )
    if row is not None and row["status"] == "picked":  # the business key: one pick per line
        if (row["sku"], row["qty"]) != (cmd.sku, cmd.qty):
            raise Rejected(
                f"line {cmd.line} of order {cmd.order_id} was picked as {row['qty']} x "
                f"{row['sku']}, not {cmd.qty} x {cmd.sku}"
            )
        return picked
    # The reservation's row is locked: the order's lines of one SKU are picked one at a time.
    reserved = await tx.fetchval(
        "SELECT qty FROM reservations WHERE order_id = $1 AND sku = $2 AND status = 'reserved' "
        "FOR UPDATE",
        cmd.order_id,
        cmd.sku,
    )
    others = await tx.fetchval(
        "SELECT coalesce(sum(qty), 0) FROM picks "
        "WHERE order_id = $1 AND sku = $2 AND status = 'picked' AND line <> $3",
        cmd.order_id,
        cmd.sku,
        cmd.line,
    )
    if reserved is None or others + cmd.qty > reserved:
        raise Rejected(
            f"cannot pick line {cmd.line} of order {cmd.order_id}: {reserved or 0} x {cmd.sku} "
            f"reserved for the order, {others} picked by its other lines, the line needs "
            f"{cmd.qty}",
            details={"reserved": reserved or 0, "picked": others, "needed": cmd.qty},
        )
    await tx.execute(
        "INSERT INTO picks (order_id, line, sku, qty, status) VALUES ($1, $2, $3, $4, 'picked') "
        "ON CONFLICT (order_id, line) DO UPDATE SET sku = $3, qty = $4, status = 'picked', "
        "updated_at = now()",
        cmd.order_id,
        cmd.line,
        cmd.sku,
        cmd.qty,
    )
    return picked


async def put_back_line(cmd: PutBackLine, tx: Transaction) -> LinePutBack:
    done = await tx.fetchval(
        "UPDATE picks SET status = 'put_back', updated_at = now() "
        "WHERE order_id = $1 AND line = $2 AND status = 'picked' RETURNING line",
        cmd.order_id,
        cmd.line,
    )
    # Nothing picked (refused, or put back before): nothing to do.
    return LinePutBack(order_id=cmd.order_id, line=cmd.line, put_back=done is not None)


async def wrap_gift(cmd: WrapGift, tx: Transaction) -> GiftWrapped:
    picked = await _picked_units(tx, cmd.order_id)
    if picked != cmd.units:
        raise Rejected(
            f"cannot wrap {cmd.units} unit(s) of order {cmd.order_id}: {picked} are picked"
        )
    await tx.execute(
        "INSERT INTO gift_wraps (order_id, units, status) VALUES ($1, $2, 'wrapped') "
        "ON CONFLICT (order_id) DO UPDATE SET units = $2, status = 'wrapped', updated_at = now()",
        cmd.order_id,
        cmd.units,
    )
    return GiftWrapped(order_id=cmd.order_id, units=cmd.units)


async def unwrap_gift(cmd: UnwrapGift, tx: Transaction) -> GiftUnwrapped:
    unwrapped = await _undo(tx, "gift_wraps", cmd.order_id, "wrapped", "unwrapped")
    return GiftUnwrapped(order_id=cmd.order_id, unwrapped=unwrapped)


async def pack_parcel(cmd: PackParcel, tx: Transaction) -> ParcelPacked:
    picked = await _picked_units(tx, cmd.order_id)
    if picked != cmd.units:
        raise Rejected(
            f"cannot pack {cmd.units} unit(s) of order {cmd.order_id}: {picked} are picked"
        )
    if cmd.gift:
        wrapped = await tx.fetchval(
            "SELECT status FROM gift_wraps WHERE order_id = $1", cmd.order_id
        )
        if wrapped != "wrapped":
            raise Rejected(f"order {cmd.order_id} is a gift and is not wrapped")
    # A parcel's id is its first packing's; packed again after an unpacking, it keeps it.
    parcel_id = await tx.fetchval(
        "INSERT INTO parcels (order_id, parcel_id, units, gift, status) "
        "VALUES ($1, $2, $3, $4, 'packed') ON CONFLICT (order_id) DO UPDATE "
        "SET units = $3, gift = $4, status = 'packed', updated_at = now() RETURNING parcel_id",
        cmd.order_id,
        f"pcl-{tx.command_id[:12]}",
        cmd.units,
        cmd.gift,
    )
    return ParcelPacked(order_id=cmd.order_id, parcel_id=parcel_id, units=cmd.units)


async def unpack_parcel(cmd: UnpackParcel, tx: Transaction) -> ParcelUnpacked:
    unpacked = await _undo(tx, "parcels", cmd.order_id, "packed", "unpacked")
    return ParcelUnpacked(order_id=cmd.order_id, unpacked=unpacked)


def register(participant: Participant) -> None:
    """Adds the warehouse's handlers to the inventory's participant."""
    participant.handles(PickLine)(pick_line)
    participant.handles(PutBackLine)(put_back_line)
    participant.handles(WrapGift)(wrap_gift)
    participant.handles(UnwrapGift)(unwrap_gift)
    participant.handles(PackParcel)(pack_parcel)
    participant.handles(UnpackParcel)(unpack_parcel)


class PickedLine(BaseModel):
    line: int
    sku: str
    qty: int
    status: str


class Wrapping(BaseModel):
    units: int
    status: str


class Parcel(BaseModel):
    parcel_id: str
    units: int
    gift: bool
    status: str


class OnTheFloor(BaseModel):
    """An order on the warehouse floor: its picked lines, its wrapping, its parcel."""

    order_id: str
    lines: list[PickedLine]
    gift_wrap: Wrapping | None
    parcel: Parcel | None


async def on_the_floor(pool: Pool, order_id: str) -> OnTheFloor:
    lines = await pool.fetch(
        "SELECT line, sku, qty, status FROM picks WHERE order_id = $1 ORDER BY line", order_id
    )
    wrap = await pool.fetchrow("SELECT units, status FROM gift_wraps WHERE order_id = $1", order_id)
    parcel = await pool.fetchrow(
        "SELECT parcel_id, units, gift, status FROM parcels WHERE order_id = $1", order_id
    )
    return OnTheFloor(
        order_id=order_id,
        lines=[PickedLine(**dict(r)) for r in lines],
        gift_wrap=None if wrap is None else Wrapping(**dict(wrap)),
        parcel=None if parcel is None else Parcel(**dict(parcel)),
    )
