"""The messages between the checkout saga and the services: commands, replies, inputs.

A command's type on the wire is its class name; the participant kit routes it to the
handler registered for that model.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

ORDER_ID_PATTERN = r"^[A-Za-z0-9._-]{1,64}$"
NAME_PATTERN = r"^[A-Za-z0-9._-]{1,64}$"


class Item(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    sku: str = Field(pattern=NAME_PATTERN)
    qty: int = Field(ge=1, le=1000)


Items = list[Item]


# --------------------------------------------------------------------------- saga input/output


class CheckoutInput(BaseModel):
    order_id: str = Field(pattern=ORDER_ID_PATTERN)
    customer: str = Field(pattern=NAME_PATTERN)
    items: Items = Field(min_length=1, max_length=50)
    #: Recorded in the saga's input, so a replay waits exactly as the first run did.
    approval_timeout_s: float = Field(default=30.0, gt=0)
    payment_timeout_s: float = Field(default=120.0, gt=0)


class CheckoutResult(BaseModel):
    order_id: str
    total: int
    shipment_id: str
    fraud_score: int
    approved_by: str | None = None


class OrderRequested(BaseModel):
    """A message on the trigger topic (``demo.orders.requested``)."""

    model_config = ConfigDict(extra="forbid")

    order_id: str = Field(pattern=ORDER_ID_PATTERN)
    customer: str = Field(pattern=NAME_PATTERN)
    items: Items = Field(min_length=1, max_length=50)


class Approval(BaseModel):
    """The payload of the ``approval`` signal."""

    approved: bool
    by: str = "operator"
    note: str = ""


class CancelCheckout(BaseModel):
    """The payload of the ``cancel`` signal: the customer cancels while the checkout
    waits for the payment."""

    reason: str = Field(default="", max_length=500)


# --------------------------------------------------------------------------- orders


class CreateOrder(BaseModel):
    """Creates the order (priced by the orders service) unless it exists already."""

    order_id: str
    customer: str
    items: Items


class OrderCreated(BaseModel):
    order_id: str
    total: int


class ConfirmOrder(BaseModel):
    order_id: str
    shipment_id: str


class RejectOrder(BaseModel):
    """Marks a pending order rejected (creating it if it never was); the first reason wins."""

    order_id: str
    customer: str
    items: Items
    reason: str


class OrderState(BaseModel):
    order_id: str
    status: str
    reason: str | None = None


# --------------------------------------------------------------------------- payments


class ReserveCredit(BaseModel):
    order_id: str
    customer: str
    amount: int = Field(ge=0)


class CreditReserved(BaseModel):
    order_id: str
    amount: int
    balance: int


class ReleaseCredit(BaseModel):
    order_id: str


class CreditReleased(BaseModel):
    order_id: str
    released: int


# --------------------------------------------------------------------------- inventory


class ReserveStock(BaseModel):
    order_id: str
    items: Items


class StockReserved(BaseModel):
    order_id: str
    items: Items


class ReleaseStock(BaseModel):
    order_id: str


class StockReleased(BaseModel):
    order_id: str
    items: Items


# --------------------------------------------------------------------------- shipping


class ScheduleShipment(BaseModel):
    order_id: str
    customer: str
    items: Items


class ShipmentScheduled(BaseModel):
    order_id: str
    shipment_id: str


class CancelShipment(BaseModel):
    order_id: str


class ShipmentCancelled(BaseModel):
    order_id: str
    cancelled: bool


# --------------------------------------------------------------------------- fraud (HTTP)


class FraudCheck(BaseModel):
    """The body of ``POST /check`` on the fraud service."""

    order_id: str
    customer: str
    total: int


class FraudVerdict(BaseModel):
    approved: bool
    score: int


# --------------------------------------------------------------------------- reconciliation


class ReconcileInput(BaseModel):
    """The nightly reconciliation's input: which ledger it checks."""

    ledger: str = "payments"


class ReconciliationReport(BaseModel):
    """What the nightly reconciliation read: every customer's balance, summed."""

    customers: int
    total_balance: int


class PaymentCaptured(BaseModel):
    """The orders service's fact: the customer's payment for an order was captured. The
    checkout waits for it (``ctx.wait_event``), correlated by ``order_id``."""

    order_id: str = Field(pattern=ORDER_ID_PATTERN)
    amount: int = Field(gt=0)


# --------------------------------------------------------------------------- fulfilment (a graph)


class FulfilmentInput(BaseModel):
    """The ``fulfilment`` graph saga's input: a confirmed order to pick, invoice, pack,
    label and announce (``gift``: wrap it first)."""

    order_id: str = Field(pattern=ORDER_ID_PATTERN)
    customer: str = Field(pattern=NAME_PATTERN)
    items: Items = Field(min_length=1, max_length=50)
    total: int = Field(ge=0)
    gift: bool = False


class PickLine(BaseModel):
    """Takes one line of an order off the shelf (inventory); the order's stock must be
    reserved (its checkout did that). One pick per ``(order_id, line)``."""

    order_id: str
    line: int = Field(ge=0)
    sku: str
    qty: int = Field(ge=1)


class LinePicked(BaseModel):
    order_id: str
    line: int
    sku: str
    qty: int


class PutBackLine(BaseModel):
    """Undoes ``PickLine``: the line goes back on the shelf (a no-op if it was not picked)."""

    order_id: str
    line: int


class LinePutBack(BaseModel):
    order_id: str
    line: int
    put_back: bool


class IssueInvoice(BaseModel):
    """Issues the order's invoice and renders its PDF (payments): the heavy step."""

    order_id: str
    customer: str
    amount: int = Field(ge=0)


class InvoiceIssued(BaseModel):
    order_id: str
    invoice_id: str
    amount: int
    #: The rendered PDF's digest (the demo keeps no file).
    pdf_sha256: str
    #: The invoice's document, base64: over 256 KiB, so the reply carrying it goes by
    #: reference (docs/large-payloads.md), and so does the saga's history.
    pdf: str = ""


class VoidInvoice(BaseModel):
    """Undoes ``IssueInvoice``: the invoice is voided (a no-op if none was issued)."""

    order_id: str


class InvoiceVoided(BaseModel):
    order_id: str
    voided: bool


class WrapGift(BaseModel):
    """Gift-wraps an order's picked units (inventory); only for a gift."""

    order_id: str
    units: int = Field(ge=1)


class GiftWrapped(BaseModel):
    order_id: str
    units: int


class UnwrapGift(BaseModel):
    order_id: str


class GiftUnwrapped(BaseModel):
    order_id: str
    unwrapped: bool


class PackParcel(BaseModel):
    """Packs an order's picked units into one parcel (inventory)."""

    order_id: str
    units: int = Field(ge=1)
    gift: bool = False


class ParcelPacked(BaseModel):
    order_id: str
    parcel_id: str
    units: int


class UnpackParcel(BaseModel):
    order_id: str


class ParcelUnpacked(BaseModel):
    order_id: str
    unpacked: bool


class PrintLabel(BaseModel):
    """Prints the parcel's shipping label (shipping, the Go service); the invoice goes
    with it."""

    order_id: str
    customer: str
    parcel_id: str
    invoice_id: str


class LabelPrinted(BaseModel):
    order_id: str
    tracking: str


class VoidLabel(BaseModel):
    order_id: str


class LabelVoided(BaseModel):
    order_id: str
    voided: bool


class Notify(BaseModel):
    """The body of ``POST /notifications`` on the orders service (an HTTP node): tells
    the customer their parcel is on its way."""

    order_id: str
    customer: str
    tracking: str
    invoice_id: str


class Notified(BaseModel):
    order_id: str
    notification_id: str
    channel: str


class Fulfilled(BaseModel):
    """The ``fulfilment`` saga's output: each node's result, by the node's name (a
    skipped node's is None)."""

    pick: list[LinePicked]
    invoice: InvoiceIssued
    gift_wrap: GiftWrapped | None = None
    pack: ParcelPacked
    label: LabelPrinted
    notify: Notified
