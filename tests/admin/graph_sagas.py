"""A graph saga for the admin API, page and CLI tests: two independent steps, one after
both, a conditional node, a bounded fan-out and an HTTP-free notification."""

from __future__ import annotations

from pydantic import BaseModel, Field

from saga_engine import Cost
from saga_engine.graph import GraphSaga, each, node, step


class OrderIn(BaseModel):
    order: str = Field(min_length=1, max_length=50)
    gift: bool = False
    lines: list[str] = Field(default_factory=lambda: ["a", "b"], max_length=5)


class OrderOut(BaseModel):
    pass


class Do(BaseModel):
    what: str


class Undo(BaseModel):
    what: str


class Fulfil(GraphSaga[OrderIn, OrderOut]):
    name = "fulfil"
    reserve = node(
        step("inventory", lambda o: Do(what="reserve"), compensate=lambda o: Undo(what="reserve"))
    )
    charge = node(
        step(
            "payments",
            lambda o: Do(what="charge"),
            compensate=lambda o: Undo(what="charge"),
            cost=Cost(cpu=2),
        )
    )
    label = node(
        step("shipping", lambda o: Do(what="label"), compensate=lambda o: Undo(what="label")),
        after=[reserve, charge],
    )
    gift = node(step("wrapping", lambda o: Do(what="wrap")), after=[reserve], when=lambda o: o.gift)
    lines = node(
        each(
            lambda o: o.lines,
            step(
                "warehouse",
                lambda o, item: Do(what=item),
                compensate=lambda o, item: Undo(what=item),
            ),
            max_items=5,
        ),
        after=[reserve],
    )
    notify = node(step("mailer", lambda o: Do(what="mail")), after=[label, lines])
