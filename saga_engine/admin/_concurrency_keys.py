"""The admin API's per-key concurrency view (``GET /concurrency-keys``): who holds each
key's slots and who waits for one, FIFO (docs/concurrency-keys.md).

No ``from __future__ import annotations``: FastAPI reads the endpoints' annotations at
runtime.
"""

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from saga_engine.admin._deps import PartsDep
from saga_engine.admin._route_helpers import READ_ERRORS, errors
from saga_engine.kernel._input_types import StorableText
from saga_engine.store._keyslots import KeySlotStore, with_positions

__all__ = ["KeySlotView", "KeysBody", "router"]

router = APIRouter()

_Text = Annotated[str, StorableText(min_length=1, max_length=200)]


class KeySlotView(BaseModel):
    saga_id: str
    saga_type: str
    key: str = Field(description="The value of the saga's concurrency key field.")
    held: bool = Field(description="It holds a slot (its run may go on); false: it waits.")
    position: int = Field(description="Its place among those waiting (1: next); 0 if held.")
    limit: int = Field(description="The type's limit per key, as the code that queued it said.")
    queued_at: datetime
    acquired_at: datetime | None = None


class KeysBody(BaseModel):
    slots: list[KeySlotView] = Field(
        description="By type and key: the holders first, then the queue in FIFO order."
    )


@router.get(
    "/concurrency-keys", response_model=KeysBody, responses=errors(*READ_ERRORS), tags=["keys"]
)
async def concurrency_keys(
    parts: PartsDep,
    saga_type: Annotated[_Text | None, Query(description="Only this saga type.")] = None,
    key: Annotated[_Text | None, Query(description="Only this key value.")] = None,
) -> KeysBody:
    """The slots of per-key concurrency (``Saga.concurrency``): for each saga type and
    key, the sagas holding a slot and those queued for one."""
    store = parts.store
    if not isinstance(store, KeySlotStore):
        return KeysBody(slots=[])
    return KeysBody(
        slots=[
            KeySlotView(
                saga_id=slot.saga_id,
                saga_type=slot.saga_type,
                key=slot.key,
                held=slot.held,
                position=position,
                limit=slot.limit,
                queued_at=slot.queued_at,
                acquired_at=slot.acquired_at,
            )
            for slot, position in with_positions(await store.key_slots(saga_type, key))
        ]
    )
