"""The admin API's dead letters: the records of ``{prefix}.dlq`` the engine or a
participant could not process, listed newest first, shown whole, and replayed.

They are read straight from Kafka (``transport._dlq``, as ``saga dlq`` reads them),
without a consumer group and within :data:`READ_TIMEOUT_S`: an app made without a
``DeadLetterReader`` (one over an in-memory engine) answers 503. An unknown partition or
offset is a 404; a record with nowhere to go back to a 409. A replay is an operator's
action: it needs a reason and is logged to ``saga_engine.admin.audit`` with the
principal, like the other operator actions.

No ``from __future__ import annotations``: FastAPI reads the endpoints' annotations at
runtime.
"""

import logging
from datetime import datetime
from typing import Annotated
from urllib.parse import quote

from fastapi import Depends, HTTPException, Path, Query, Request
from pydantic import BaseModel, Field

from saga_engine.admin._deps import Caller, _state
from saga_engine.admin._http_errors import api_router
from saga_engine.admin._route_helpers import READ_ERRORS, errors
from saga_engine.admin._schemas import Reason, _Body
from saga_engine.kernel._input_types import StorableText
from saga_engine.transport._dead_letter import DeadLetter, DeadLetterReader

__all__ = ["DeadLetterDetail", "DeadLetterOut", "DeadLetterReplayResult", "ReplayRequest", "router"]

audit = logging.getLogger("saga_engine.admin.audit")

router = api_router()

#: How long one request may spend reading the topic (or sending a replay).
READ_TIMEOUT_S = 10.0
#: With a filter, how far back each partition is searched (its newest records).
SCAN_PER_PARTITION = 10_000

_PARTITION = Path(ge=0, description="The record's partition of the dead-letter topic.")
_OFFSET = Path(ge=0, description="The record's offset in that partition.")


class DeadLetterOut(BaseModel):
    """A dead letter as listed: why, from where, for which saga, and its payload's start."""

    partition: int
    offset: int
    timestamp: datetime
    reason: str = Field(description="The `dlq_reason` header: malformed_json, oversized, ...")
    detail: str
    origin_topic: str = Field(description="The topic it was read from (`` if unknown).")
    origin_partition: str
    origin_offset: str
    saga_id: str = Field(description="Its `ce_sagaid` header (`` if none).")
    saga_url: str | None
    size: int = Field(description="The payload's size in bytes.")
    payload_preview: str = Field(description="The payload as text, cut for display.")


class Header(BaseModel):
    name: str
    value: str


class DeadLetterDetail(DeadLetterOut):
    """A dead letter whole: its key, every header, the whole payload."""

    key: str | None
    headers: list[Header]
    payload: str = Field(description="The whole payload as text (bad UTF-8 replaced).")


SagaIdField = Annotated[
    str,
    StorableText(min_length=1, max_length=200),
]


class ReplayRequest(_Body):
    reason: Reason
    saga_id: SagaIdField | None = Field(
        default=None,
        description="Send it to the inbox addressed to this saga (its key and `ce_sagaid`) "
        "instead of back to its origin topic.",
    )


class DeadLetterReplayResult(BaseModel):
    partition_from: int
    offset_from: int
    topic: str = Field(description="Where it was re-published.")
    partition: int
    offset: int
    saga_id: str
    principal: str
    reason: str


def _topic(request: Request) -> DeadLetterReader:
    topic = _state(request).dead_letters
    if topic is None:
        raise HTTPException(
            503, "dead letters are read from Kafka: served by a worker's admin API (SagaWorker)"
        )
    return topic


TopicDep = Annotated[DeadLetterReader, Depends(_topic)]


def _saga_url(request: Request, saga_id: str) -> str | None:
    if not saga_id:
        return None
    return f"{request.scope.get('root_path', '')}/sagas/{quote(saga_id, safe='')}"


def out(request: Request, letter: DeadLetter) -> DeadLetterOut:
    return DeadLetterOut(
        partition=letter.partition,
        offset=letter.offset,
        timestamp=letter.timestamp,
        reason=letter.reason,
        detail=letter.detail,
        origin_topic=letter.origin_topic,
        origin_partition=letter.origin_partition,
        origin_offset=letter.origin_offset,
        saga_id=letter.saga_id,
        saga_url=_saga_url(request, letter.saga_id),
        size=letter.size,
        payload_preview=letter.preview(),
    )


@router.get("/dead-letters", response_model=list[DeadLetterOut], responses=errors(*READ_ERRORS))
async def list_dead_letters(
    request: Request,
    topic: TopicDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    reason: Annotated[
        Annotated[str, StorableText(max_length=100)] | None,
        Query(description="Only this dlq_reason."),
    ] = None,
    saga_id: Annotated[
        Annotated[str, StorableText(max_length=200)] | None,
        Query(description="Only this saga's."),
    ] = None,
) -> list[DeadLetterOut]:
    """The newest dead letters, newest first (a filter searches each partition's newest
    10,000 records)."""

    def wanted(letter: DeadLetter) -> bool:
        return (reason is None or letter.reason == reason) and (
            saga_id is None or letter.saga_id == saga_id
        )

    filtered = reason is not None or saga_id is not None
    letters = await topic.newest(
        limit,
        READ_TIMEOUT_S,
        match=wanted if filtered else None,
        scan=SCAN_PER_PARTITION if filtered else None,
    )
    return [out(request, letter) for letter in reversed(letters)]


@router.get(
    "/dead-letters/{partition}/{offset}",
    response_model=DeadLetterDetail,
    responses=errors(404, *READ_ERRORS),
)
async def get_dead_letter(
    partition: Annotated[int, _PARTITION],
    offset: Annotated[int, _OFFSET],
    request: Request,
    topic: TopicDep,
) -> DeadLetterDetail:
    """One dead letter whole: payload, key and headers."""
    letter = await topic.get(partition, offset, READ_TIMEOUT_S)
    return DeadLetterDetail(
        **out(request, letter).model_dump(),
        key=letter.key.decode(errors="replace") if letter.key is not None else None,
        headers=[Header(name=k, value=v) for k, v in letter.text_headers()],
        payload=letter.payload,
    )


@router.post(
    "/dead-letters/{partition}/{offset}/replay",
    response_model=DeadLetterReplayResult,
    responses=errors(400, 401, 403, 404, 409, 413, 422, 503),
)
async def replay_dead_letter(
    partition: Annotated[int, _PARTITION],
    offset: Annotated[int, _OFFSET],
    body: ReplayRequest,
    caller: Caller,
    topic: TopicDep,
) -> DeadLetterReplayResult:
    """Re-publishes the record, without its `dlq_*` headers, to its origin topic (409 if
    it names none), or with `saga_id` to the inbox addressed to that saga. The record
    stays in the dead-letter topic; replaying it twice sends it twice."""
    letter = await topic.get(partition, offset, READ_TIMEOUT_S)
    sent = await topic.replay(letter, READ_TIMEOUT_S, to_saga=body.saga_id)
    audit.info(
        "dead letter %s[%d]@%d (%s) replayed to %s[%d]@%d for saga %r by %s: %r",
        topic.topic,
        partition,
        offset,
        letter.reason,
        sent.topic,
        sent.partition,
        sent.offset,
        sent.saga_id,
        caller.name,
        body.reason,
    )
    return DeadLetterReplayResult(
        partition_from=partition,
        offset_from=offset,
        topic=sent.topic,
        partition=sent.partition,
        offset=sent.offset,
        saga_id=sent.saga_id,
        principal=caller.name,
        reason=body.reason,
    )
