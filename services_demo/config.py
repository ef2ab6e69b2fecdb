"""The demo's own settings (``SAGA_DEMO_*``), its seed data and its prices.

The engine and participant settings are the engine's (``SAGA_*``, see
``saga_engine.settings``); these are the knobs of the demo's business rules.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Final

from pydantic_settings import BaseSettings, SettingsConfigDict

#: Service name -> offset from the base port (``SAGA_DEMO_BASE_PORT``, default 8100).
PORT_OFFSETS: Final = {"orders": 1, "payments": 2, "inventory": 3, "fraud": 4, "shipping": 5}
SERVICES: Final = tuple(PORT_OFFSETS)
DEFAULT_BASE_PORT: Final = 8100

#: The services the engine calls over HTTP itself (``SAGA_HTTP__ENDPOINTS``): the fraud
#: check, the orders service's notifications (the fulfilment's ``notify``), the payments'
#: balances (the nightly reconciliation).
HTTP_SERVICES: Final = ("fraud", "orders", "payments")

#: Orders at or above this total wait for a manual approval (the "approval" signal).
APPROVAL_THRESHOLD: Final = 1000

#: The orders service's price list (whole credits).
PRICES: Final = {"book": 12, "mug": 8, "lamp": 45, "chair": 150, "tv": 900}

#: Seeded once in the payments service: customer -> credit balance. Generous, so that
#: the scenario can run many times against a long-running stack.
CUSTOMERS: Final = {
    "alice": 10_000,
    "bob": 30,  # too little for almost anything: the insufficient-credit path
    "carol": 100_000,  # buys large orders, which need an approval
    "dave": 10_000,  # orders through Kafka; cannot be notified (SAGA_DEMO_UNREACHABLE)
    "erin": 10_000,  # lives outside the delivery area (SAGA_DEMO_UNSHIPPABLE)
    "mallory": 10_000,  # on the fraud service's block list (SAGA_DEMO_BLOCKED)
    "grace": 100_000,  # places a large order that nobody approves
    "heidi": 100_000,  # places two orders at once: the second waits for the first
    "ivan": 10_000,  # cancels a checkout while it waits for the payment (a race)
}

#: Seeded once in the inventory service: SKU -> units in stock.
STOCK: Final = {"book": 1_000, "mug": 500, "lamp": 200, "chair": 100, "tv": 100}


#: Flow control of the demo's engine (``SAGA_LIMITS__PARTICIPANTS``): the payments
#: service renders invoices (the fulfilment's heavy ``invoice`` node, ``Cost(cpu=4)``)
#: on a budget of 8 CPUs: two at once, while its other commands, which declare no cost,
#: are never held by it.
ENGINE_LIMITS: Final = {"payments": {"budget": {"cpu": 8}}}


#: Payloads by reference (docs/large-payloads.md): one of this many bytes or more goes
#: through Kafka and into the sagas' histories as a reference to a blob (``saga_blobs``).
BLOB_THRESHOLD_BYTES: Final = 256 * 1024
#: The invoice's document (``InvoiceIssued.pdf``): over the threshold, so the invoice
#: node's reply goes by reference.
INVOICE_PDF_BYTES: Final = 300 * 1024


def http_endpoints(url: Callable[[str], str]) -> dict[str, str]:
    """The engine's ``SAGA_HTTP__ENDPOINTS``: each of ``HTTP_SERVICES`` at ``url(name)``."""
    return {name: url(name) for name in HTTP_SERVICES}


def callback_env(key: str, base_url: str) -> dict[str, str]:
    """The engine's callback settings (docs/callbacks.md): ``key`` signs its callback URLs
    (the fraud check's), which name its admin API at ``base_url``."""
    return {
        "SAGA_CALLBACKS__KEYS": json.dumps({"demo": key}),
        "SAGA_CALLBACKS__BASE_URL": base_url,
    }


def _names(value: str) -> frozenset[str]:
    return frozenset(n.strip() for n in value.split(",") if n.strip())


class DemoSettings(BaseSettings):
    """``SAGA_DEMO_*`` environment variables."""

    model_config = SettingsConfigDict(env_prefix="SAGA_DEMO_", frozen=True, extra="ignore")

    base_port: int = DEFAULT_BASE_PORT
    #: How long a large order waits for its approval before it is rejected.
    approval_timeout_s: float = 30.0
    #: Customers the shipping service cannot deliver to (comma-separated).
    unshippable: str = "erin"
    #: Customers the fraud service blocks (comma-separated).
    blocked: str = "mallory"
    #: Customers the orders service cannot notify (no contact address on file): their
    #: fulfilment fails at its last node, ``notify``, and is undone.
    unreachable: str = "dave"
    #: The fraud service answers 503 to the first call of every Idempotency-Key, so
    #: the engine's retry under the same key shows in its table.
    fraud_flaky: bool = True
    #: The trigger topic; default ``{SAGA_KAFKA__TOPIC_PREFIX}.orders.requested``.
    orders_topic: str = ""
    #: How long a checkout waits for its order's ``payment-captured`` fact.
    payment_timeout_s: float = 120.0
    #: The orders service's facts; default ``{SAGA_KAFKA__TOPIC_PREFIX}.payment-captured``.
    payments_topic: str = ""

    def port(self, service: str) -> int:
        return self.base_port + PORT_OFFSETS[service]

    @property
    def unshippable_customers(self) -> frozenset[str]:
        return _names(self.unshippable)

    @property
    def blocked_customers(self) -> frozenset[str]:
        return _names(self.blocked)

    @property
    def unreachable_customers(self) -> frozenset[str]:
        return _names(self.unreachable)


def payments_topic(topic_prefix: str, demo: DemoSettings) -> str:
    """The topic of the orders service's ``payment-captured`` facts, which checkouts wait
    for (``demo.payment-captured``)."""
    return demo.payments_topic or f"{topic_prefix}.payment-captured"


def orders_topic(topic_prefix: str, demo: DemoSettings) -> str:
    """The Kafka topic whose messages start checkouts (``demo.orders.requested``)."""
    return demo.orders_topic or f"{topic_prefix}.orders.requested"
