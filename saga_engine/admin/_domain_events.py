"""The admin API's view of the domain events sagas wait for (``GET /domain-events``): the
facts kept for a saga that has not waited for them yet (or that some saga received).

A saga's own waits are in its view (``waiting_for``, kind ``event``), its timeline and its
history. No ``from __future__ import annotations``: FastAPI reads the endpoints'
annotations at runtime.
"""

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from saga_engine.admin._deps import PartsDep
from saga_engine.admin._route_helpers import READ_ERRORS, errors
from saga_engine.admin._schemas import MissingShard
from saga_engine.kernel._input_types import StorableText
from saga_engine.store._coverage import coverage

__all__ = ["router"]

router = APIRouter()


class DomainEventOut(BaseModel):
    source: str = Field(description="The EventSource's name (its model's, by default).")
    key: str = Field(description="The correlation key, as text.")
    event_id: str = Field(description="The record's ce_id header, else topic/partition/offset.")
    received_at: datetime
    expires_at: datetime = Field(description="Kept until then for a saga that waits later.")
    matched: bool = Field(description="Some saga received it.")
    topic: str = ""
    partition: int = -1
    offset: int = -1
    payload: dict[str, Any] = Field(default_factory=dict)


class DomainEventsBody(BaseModel):
    enabled: bool = Field(description="This engine keeps domain events (a worker always does).")
    events: list[DomainEventOut]
    missing_shards: list[MissingShard] = Field(
        default_factory=list,
        description="Past one database: the shards that did not answer; their facts are "
        "not listed.",
    )


@router.get(
    "/domain-events",
    response_model=DomainEventsBody,
    responses=errors(*READ_ERRORS),
    tags=["events"],
)
async def domain_events(
    parts: PartsDep,
    source: Annotated[
        Annotated[str, StorableText(max_length=200)] | None,
        Query(description="One source only."),
    ] = None,
    unmatched: Annotated[bool, Query(description="Only those no saga received.")] = False,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> DomainEventsBody:
    """The domain events kept (newest first): what arrived for sagas to wait for, until
    its source's retention passes. ``unmatched``: only those no saga has received."""
    if parts.matcher is None:
        return DomainEventsBody(enabled=False, events=[])
    with coverage() as seen:
        facts = await parts.matcher.store.recent(source=source, unmatched=unmatched, limit=limit)
    events = [DomainEventOut.model_validate(f, from_attributes=True) for f in facts]
    return DomainEventsBody(
        enabled=True,
        events=events,
        missing_shards=MissingShard.of(seen),
    )
