"""The participant kit's reply pieces made once rather than per command: a success
reply's JSON (``success_body``) and a handler's body validation (``HandlerSpec.validate``)
give what the model's own methods give."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from saga_engine.kernel._serde import model_payload
from saga_engine.participant._handler import HandlerSpec, json_payload
from saga_engine.participant._sql import reply_record, success_body
from saga_engine.transport._wire import Envelope, MessageType, ReplyBody


class Booked(BaseModel):
    seat: str
    price: float


@pytest.mark.parametrize(
    "result",
    [None, {}, {"a": 1, "b": [1.5, "x", None, {"c": True}]}, Booked(seat="1A", price=9.5)],
)
def test_a_success_reply_is_written_as_its_model_would_be(result: Any) -> None:
    payload = json_payload(result)
    reply, dumped = success_body(payload)
    assert reply == ReplyBody(outcome="success", payload=payload)
    assert dumped == model_payload(reply)
    assert list(dumped) == list(model_payload(reply))  # the same keys in the same order
    command = Envelope(
        message_type=MessageType.COMMAND, source="/e", saga_id="s-1", command_id="c-1"
    )
    made = reply_record(command, reply, source="/p", topic="t", codec=None)
    given = reply_record(command, reply, source="/p", topic="t", codec=None, body=dumped)
    assert given.value == made.value


class Order(BaseModel):
    n: int


class Lenient(Order):
    @classmethod
    def model_validate(cls, obj: Any, **kw: Any) -> Lenient:
        return super().model_validate({"n": len(obj)})


async def _handler(cmd: Order, tx: object) -> None:
    return None


def test_a_handler_validates_bodies_as_its_model_does() -> None:
    spec = HandlerSpec("Order", Order, _handler, "read_committed")
    assert spec.validate({"n": 3}) == Order(n=3)
    with pytest.raises(ValueError, match="n"):
        spec.validate({"n": "three"})
    # A model with its own model_validate keeps it.
    own = HandlerSpec("Order", Lenient, _handler, "read_committed")
    assert own.validate({"x": 1, "y": 2}) == Lenient(n=2)
