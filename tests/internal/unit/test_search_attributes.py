"""Search attributes are checked when the saga class is defined, and read from its input."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

from saga_engine import DefinitionError, Saga, SagaContext
from saga_engine.core.authoring._definition import SagaDefinition


class Order(BaseModel):
    order_id: str
    qty: int = 1
    vip: bool = False
    customer: str | None = Field(default=None, alias="customerId")
    status: str = "new"


class Done(BaseModel):
    ok: bool = True


def _saga(attributes: object) -> type[Saga[Order, Done]]:
    class Checkout(Saga[Order, Done]):
        name = "checkout-attrs"
        search_attributes = attributes  # type: ignore[assignment]

        async def run(self, ctx: SagaContext, input: Order) -> Done:
            return Done()

    return Checkout


def test_values_are_strings_of_the_declared_input_fields() -> None:
    definition = SagaDefinition.of(_saga(("order_id", "qty", "vip", "customer")))
    assert definition.search_values(
        {"order_id": "o-1", "qty": 3, "vip": True, "customerId": "c-9"}
    ) == {"order_id": "o-1", "qty": "3", "vip": "true", "customer": "c-9"}
    # A field left empty is not stored (None would match nothing anyway).
    assert definition.search_values({"order_id": "o-2", "qty": 1, "vip": False}) == {
        "order_id": "o-2",
        "qty": "1",
        "vip": "false",
    }


def test_none_declared_stores_none() -> None:
    assert SagaDefinition.of(_saga(())).search_values({"order_id": "o-1"}) is None


@pytest.mark.parametrize(
    ("attributes", "message"),
    [
        (("order",), "search attribute 'order' is not a field of Order"),
        (("status",), "also a filter of the admin API's list"),
        ("order_id", "must be a tuple of input field names"),
    ],
)
def test_a_bad_declaration_is_refused_at_definition(attributes: object, message: str) -> None:
    with pytest.raises(DefinitionError, match=message):
        _saga(attributes)
