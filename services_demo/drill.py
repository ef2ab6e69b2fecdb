"""The checkout under ``saga drill``: the demo's services as the drill's participants, its
checkouts' inputs, and the payment captures they wait for::

    saga drill --sagas services_demo.sagas --participants services_demo.drill --scenario mix

- ``drill_participants()``: the five services, each as ``make demo-up`` runs it (the
  Python ones under uvicorn, shipping as the Go binary built here once per drill), on a
  block of free ports (``SAGA_DEMO_BASE_PORT`` if set). The drill gives each its schema
  and ``SAGA_PARTICIPANT__DRILL_LEDGER=1``: the participant kits of orders, payments,
  inventory and shipping (the Go kit's ``Config.DrillLedger``) then record each command
  they apply in ``drill_ledger``.
  Fraud is an HTTP service (the engine calls it): a process the drill kills too.
- ``drill_env()``: every process's ``SAGA_DEMO_BASE_PORT`` and the engines'
  ``SAGA_HTTP__ENDPOINTS`` (fraud, orders, payments), as ``services_demo/run.py`` sets them,
  and ``SAGA_CALLBACKS__KEYS``, a key made for the drill: the fraud service answers 202
  and posts its verdict to the check's callback URL, which names the admin API of the
  engine that handed it out (the drill gives each engine its own, kept across restarts).
- ``drill_inputs()``: checkouts of the seeded customers, most of which complete; some
  compensate: bob's credit is short, erin is outside the delivery area (the shipment
  child refuses), mallory is on the fraud block list, one order in ten is paid the wrong
  amount, and one large order waits for an approval nobody gives (a 2 s timeout).
- ``drill_events(input)``: the ``payment-captured`` fact of each order, as the orders
  service's payment webhook publishes it (the drill publishes it right after the start;
  the engine keeps it until the checkout reaches its wait).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel

from services_demo.config import (
    ENGINE_LIMITS,
    PORT_OFFSETS,
    PRICES,
    SERVICES,
    callback_env,
    http_endpoints,
)
from services_demo.contracts import CheckoutInput, Item, PaymentCaptured
from services_demo.run import SHIPPING_GO, free_base_port
from services_demo.sagas import payment_captured

__all__ = ["drill_env", "drill_events", "drill_inputs", "drill_participants", "service_args"]

#: (customer, items, how it ends) in turn; totals under the approval threshold but one.
_CASES: tuple[tuple[str, list[Item], str], ...] = (
    ("alice", [Item(sku="book", qty=2)], "completes"),
    ("dave", [Item(sku="mug", qty=1), Item(sku="lamp", qty=1)], "completes"),
    ("bob", [Item(sku="chair", qty=1)], "credit short"),
    ("heidi", [Item(sku="lamp", qty=2)], "completes"),
    ("erin", [Item(sku="book", qty=1)], "unshippable"),
    ("grace", [Item(sku="chair", qty=1)], "completes"),
    ("mallory", [Item(sku="mug", qty=3)], "fraud"),
    ("carol", [Item(sku="book", qty=1)], "wrong amount"),
    ("alice", [Item(sku="mug", qty=2)], "completes"),
    ("carol", [Item(sku="tv", qty=2)], "no approval"),
)


@functools.cache
def _base_port() -> int:
    return int(os.environ.get("SAGA_DEMO_BASE_PORT") or free_base_port())


def _url(service: str) -> str:
    return f"http://127.0.0.1:{_base_port() + PORT_OFFSETS[service]}"


@functools.cache
def _callback_key() -> str:
    return secrets.token_urlsafe(32)


def drill_env() -> dict[str, str]:
    # The callback key signs the fraud check's URLs (the drill's replay check reads it
    # too); the drill points each engine's URLs at its own admin API.
    keys = callback_env(_callback_key(), "http://127.0.0.1")
    return {
        "SAGA_DEMO_BASE_PORT": str(_base_port()),
        "SAGA_HTTP__ENDPOINTS": json.dumps(http_endpoints(_url)),
        "SAGA_LIMITS__PARTICIPANTS": json.dumps(ENGINE_LIMITS),
        "SAGA_HTTP__RETRY_WINDOW_S": "4",
        "SAGA_CALLBACKS__KEYS": keys["SAGA_CALLBACKS__KEYS"],
    }


def service_args(service: str, app: str = "") -> list[str]:
    """The Python arguments of one Python service under uvicorn (``app``: another ASGI
    app in its place, ``module:attribute``)."""
    port = str(_base_port() + PORT_OFFSETS[service])
    return [
        "-m",
        "uvicorn",
        app or f"services_demo.{service}:app",
        "--host",
        "127.0.0.1",
        "--port",
        port,
        "--log-level",
        "warning",
        "--no-access-log",
    ]


def drill_participants() -> dict[str, list[str]]:
    found = {s: service_args(s) for s in SERVICES if s != "shipping"}
    port = str(_base_port() + PORT_OFFSETS["shipping"])
    found["shipping"] = [
        "-m",
        "services_demo.drill",
        str(_shipping_binary()),
        "--host",
        "127.0.0.1",
        "--port",
        port,
    ]
    return found


@functools.cache
def _shipping_binary() -> Path:
    """``go build`` of the shipping service, once per drill, removed when the drill ends."""
    go = shutil.which("go")
    if go is None:
        raise SystemExit("the shipping service is written in Go: put `go` (1.26+) on the PATH")
    build_dir = Path(tempfile.mkdtemp(prefix="saga-drill-shipping-"))
    atexit.register(shutil.rmtree, build_dir, True)
    binary = build_dir / "shipping"
    done = subprocess.run(
        [go, "build", "-o", str(binary), "."],
        cwd=SHIPPING_GO,
        capture_output=True,
        text=True,
        env={**os.environ, "GOWORK": "off"},
        timeout=900,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"`go build` in {SHIPPING_GO} failed:\n{done.stdout}{done.stderr}")
    return binary


def _case(order_id: str) -> str:
    return _CASES[int(order_id.rsplit("-", 1)[1]) % len(_CASES)][2]


def drill_inputs() -> Iterator[CheckoutInput]:
    n = 0
    while True:
        customer, items, case = _CASES[n % len(_CASES)]
        yield CheckoutInput(
            order_id=f"drill-{n:05d}",
            customer=customer,
            items=items,
            approval_timeout_s=2.0 if case == "no approval" else 30.0,
            payment_timeout_s=60.0,
        )
        n += 1


def drill_events(order: CheckoutInput) -> list[tuple[object, BaseModel]]:
    total = sum(PRICES[i.sku] * i.qty for i in order.items)
    amount = total + 1 if _case(order.order_id) == "wrong amount" else total
    return [(payment_captured, PaymentCaptured(order_id=order.order_id, amount=amount))]


if __name__ == "__main__":
    # The shipping participant: the drill starts Python processes, this one becomes the
    # Go binary (same pid and process group, so the drill's signals reach it).
    os.execv(sys.argv[1], sys.argv[1:])
