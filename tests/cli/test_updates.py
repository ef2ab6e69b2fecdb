"""`saga update` and `saga query` against a real admin API over HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from saga_engine.testing import SagaTestEnv
from tests.admin.conftest import OPERATOR_TOKEN, admin_settings
from tests.admin.served import Served, served_in_thread
from tests.cli.conftest import as_json, invoke, one_line_error
from tests.internal.e2e.update_app import Cart, CartIn


async def seed(env: SagaTestEnv) -> dict[str, str]:
    saga_id = await env.engine.start(Cart, CartIn(customer="ada", limit=50))
    await env.settle()
    return {"cart": saga_id}


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with served_in_thread(admin_settings(port=0), seed, sagas=[Cart]) as running:
        yield running


def _env(served: Served) -> dict[str, str]:
    return {"SAGA_ADMIN_TOKEN": OPERATOR_TOKEN, "SAGA_ADMIN_URL": served.url}


def test_update_then_query(served: Served) -> None:
    cart = served.seeded["cart"]
    args = ["update", cart, "add_item", "--input", '{"sku": "tea", "price": 30}']
    added = invoke([*args, "--update-id", "u-1", "--reason", "phone"], _env(served))
    assert added.exit_code == 0, added.output
    assert 'by olivia: {"items":1,"total":30}' in added.stdout
    again = as_json(invoke([*args, "--update-id", "u-1", "--json"], _env(served)))
    assert again["result"] == {"items": 1, "total": 30}
    summary = as_json(invoke(["query", cart, "summary", "--json"], _env(served)))
    assert summary["result"] == {"items": ["tea"], "total": 30, "checked_out": False}
    priced = invoke(["query", cart, "price_with", "--args", '{"extra": 2}'], _env(served))
    assert priced.stdout.strip() == "32"


def test_refusals_are_one_line_errors(served: Served) -> None:
    cart = served.seeded["cart"]
    over = invoke(
        ["update", cart, "add_item", "--input", '{"sku": "tv", "price": 99}'], _env(served)
    )
    assert "limit is 50" in one_line_error(over, 4)
    unknown = invoke(["update", cart, "nope"], _env(served))
    assert "declares no update 'nope'" in one_line_error(unknown, 5)
    failed = invoke(
        ["update", cart, "add_item", "--input", '{"sku": "boom", "price": 1}'], _env(served)
    )
    assert "out of stock" in one_line_error(failed, 1)
    bad = invoke(["query", cart, "summary", "--args", "[1]"], _env(served))
    assert "must be a JSON object" in one_line_error(bad, 1)
