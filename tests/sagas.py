"""Sagas and messages shared by the tests (the README's PlaceOrder among them)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from pydantic import BaseModel

from saga_engine import CallbackTimeout, RetryPolicy, Saga, SagaContext, Signal, StepFailed, Winner


class OrderRequest(BaseModel):
    customer: str
    total: int
    needs_approval: bool = False


class OrderResult(BaseModel):
    status: str
    stock_reservation: str = ""
    shipping_quote: int = 0


class ReserveCredit(BaseModel):
    customer: str
    amount: int


class ReleaseCredit(BaseModel):
    customer: str
    amount: int


class ReserveStock(BaseModel):
    order_total: int


class ReleaseStock(BaseModel):
    order_total: int


class StockReserved(BaseModel):
    reservation: str


class QuoteShipping(BaseModel):
    customer: str


class ShippingQuote(BaseModel):
    price: int


class Approval(BaseModel):
    approved: bool
    by: str


class PlaceOrder(Saga[OrderRequest, OrderResult]):
    name = "place-order"
    approval = Signal(Approval)

    async def run(self, ctx: SagaContext, order: OrderRequest) -> OrderResult:
        await ctx.step(
            "reserve-credit",
            to="payments",
            command=ReserveCredit(customer=order.customer, amount=order.total),
            compensate=ReleaseCredit(customer=order.customer, amount=order.total),
            retry=RetryPolicy(max_attempts=5),
            timeout=30,
        )
        stock, quote = await asyncio.gather(
            ctx.step(
                "reserve-stock",
                to="inventory",
                command=ReserveStock(order_total=order.total),
                compensate=ReleaseStock(order_total=order.total),
                returns=StockReserved,
            ),
            ctx.step(
                "quote-shipping",
                to="shipping",
                command=QuoteShipping(customer=order.customer),
                returns=ShippingQuote,
            ),
        )
        if order.needs_approval:
            decision = await ctx.wait_signal(self.approval, timeout=timedelta(hours=4))
            if not decision.approved:
                raise StepFailed("approval", f"rejected by {decision.by}")
        await ctx.sleep(timedelta(minutes=1))
        return OrderResult(
            status="confirmed", stock_reservation=stock.reservation, shipping_quote=quote.price
        )


# --------------------------------------------------------------------------- races (issue 41)


class CheckoutRequest(BaseModel):
    order: str
    amount: int


class Capture(BaseModel):
    order: str
    amount: int


class Refund(BaseModel):
    order: str
    amount: int


class Captured(BaseModel):
    receipt: str


class CancelOrder(BaseModel):
    reason: str = ""


class Notify(BaseModel):
    order: str
    outcome: str


class CheckoutResult(BaseModel):
    outcome: str
    receipt: str = ""


def _capture(req: CheckoutRequest) -> tuple[Capture, Refund]:
    return Capture(order=req.order, amount=req.amount), Refund(order=req.order, amount=req.amount)


class RaceCheckout(Saga[CheckoutRequest, CheckoutResult]):
    """Captures the payment, unless the customer cancels or fifteen minutes pass first
    (a capture given up may have been applied: it is refunded at once); then tells the
    customer how it ended."""

    name = "race-checkout"
    cancel = Signal(CancelOrder)

    async def run(self, ctx: SagaContext, req: CheckoutRequest) -> CheckoutResult:
        capture, refund = _capture(req)
        won = await ctx.first(
            paid=ctx.step(
                "capture", to="payments", command=capture, compensate=refund, returns=Captured
            ),
            cancelled=ctx.wait_signal(self.cancel),
            expired=ctx.sleep(timedelta(minutes=15)),
        )
        match won:
            case Winner("paid", Captured() as captured):
                outcome, receipt = "paid", captured.receipt
            case Winner(name):
                outcome, receipt = name, ""
        await ctx.step("notify", to="mail", command=Notify(order=req.order, outcome=outcome))
        return CheckoutResult(outcome=outcome, receipt=receipt)


class WaitCheckout(Saga[CheckoutRequest, CheckoutResult]):
    """The same race written with ``asyncio.wait(..., FIRST_COMPLETED)``, its losers
    cancelled by the code (as sagas did before ``ctx.first``)."""

    name = "wait-checkout"
    cancel = Signal(CancelOrder)

    async def run(self, ctx: SagaContext, req: CheckoutRequest) -> CheckoutResult:
        capture, refund = _capture(req)
        racers = {
            "paid": asyncio.ensure_future(
                ctx.step("capture", to="payments", command=capture, compensate=refund)
            ),
            "cancelled": asyncio.ensure_future(ctx.wait_signal(self.cancel)),
            "expired": asyncio.ensure_future(ctx.sleep(timedelta(minutes=15))),
        }
        done, pending = await asyncio.wait(racers.values(), return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        outcome = next(name for name, task in racers.items() if task in done)
        await ctx.step("notify", to="mail", command=Notify(order=req.order, outcome=outcome))
        return CheckoutResult(outcome=outcome)


# --------------------------------------------------------------------------- callbacks


class KycRequest(BaseModel):
    applicant: str


class AskKyc(BaseModel):
    applicant: str
    callback_url: str


class KycVerdict(BaseModel):
    approved: bool
    score: int


class KycResult(BaseModel):
    outcome: str


class KycCheck(Saga[KycRequest, KycResult]):
    """Issue 41 section 2: a vendor's verdict on a callback URL, within two days."""

    name = "kyc-check"

    async def run(self, ctx: SagaContext, req: KycRequest) -> KycResult:
        cb = ctx.callback("kyc-verdict", model=KycVerdict, timeout=timedelta(days=2))
        await ctx.step(
            "ask", to="kyc", command=AskKyc(applicant=req.applicant, callback_url=cb.url)
        )
        try:
            verdict = await cb
        except CallbackTimeout:
            return KycResult(outcome="timed out")
        return KycResult(outcome=f"approved={verdict.approved} score={verdict.score}")


class BillingPeriod(BaseModel):
    customer: str
    period: int = 0
    periods: int = 3


class ChargePeriod(BaseModel):
    customer: str
    period: int


class RefundPeriod(BaseModel):
    customer: str
    period: int


class BillingDone(BaseModel):
    periods: int


class MonthlyBilling(Saga[BillingPeriod, BillingDone]):
    """Issue 41 section 4: one charge a run, a month's wait, then continue as new (the
    compensations carried); a refused charge undoes every run's, last first."""

    name = "monthly-billing"

    async def run(self, ctx: SagaContext, billing: BillingPeriod) -> BillingDone:
        await ctx.step(
            "charge",
            to="payments",
            command=ChargePeriod(customer=billing.customer, period=billing.period),
            compensate=RefundPeriod(customer=billing.customer, period=billing.period),
        )
        if billing.period + 1 >= billing.periods:
            return BillingDone(periods=billing.periods)
        await ctx.sleep(timedelta(days=30))
        return await ctx.continue_as_new(billing.model_copy(update={"period": billing.period + 1}))
