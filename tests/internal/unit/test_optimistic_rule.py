"""Which runs of a batch the participant claims optimistically (by its outcomes' insert
alone) and which go the locked way; and the registration's ``effects`` checked."""

from __future__ import annotations

from typing import Any

import pytest
from aiokafka import TopicPartition
from pydantic import BaseModel

from saga_engine import Settings
from saga_engine.kernel._errors import DefinitionError
from saga_engine.participant import Participant, Transaction
from saga_engine.participant._handler import HandlerSpec
from saga_engine.participant._reading import Item
from saga_engine.participant._transaction import optimistic
from tests.participant.helpers import command


class Book(BaseModel):
    amount: int


async def _book(cmd: Book, tx: Transaction) -> None:
    return None


IN_TX = HandlerSpec("Book", Book, _book, "read_committed")
OUTSIDE = HandlerSpec("Call", Book, _book, "read_committed", effects="outside")


def _item(handler: HandlerSpec | None = IN_TX, **command_fields: Any) -> Item:
    envelope = command("Book", {"amount": 1}, saga_id="saga-1", command_id="saga-1:book:0")
    envelope = envelope.model_copy(update=command_fields)
    return Item(TopicPartition("t", 0), None, command=envelope, handler=handler)


def test_a_run_of_handlers_with_effects_in_their_transaction_is_optimistic() -> None:
    assert optimistic([_item(), _item(command_id="saga-1:book:1"), _item(handler=None)])


def test_a_handler_acting_outside_its_transaction_takes_its_run_the_locked_way() -> None:
    assert not optimistic([_item(), _item(handler=OUTSIDE, command_id="saga-1:call:0")])


def test_a_compensation_takes_its_run_the_locked_way() -> None:
    undo = _item(command_id="saga-1:undo:0", compensation=True, compensates="saga-1:book:0")
    assert not optimistic([_item(command_id="saga-2:book:0"), undo])


def test_a_command_retried_after_its_handler_raised_goes_the_locked_way() -> None:
    retried = _item()
    retried.attempt = 2
    assert not optimistic([retried])


def test_effects_names_a_place_or_the_registration_says_which() -> None:
    participant = Participant("shop", Settings())
    with pytest.raises(DefinitionError, match=r'effects=\'nowhere\'.*"transaction".*"outside"'):
        participant.handles(Book, effects="nowhere")  # type: ignore[arg-type]
    assert participant.handles(Book, effects="outside")(_book) is _book
