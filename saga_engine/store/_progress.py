"""A saga's progress items (``ctx.emit``) read from the store, after a number.

What the admin API's stream (``GET /sagas/{id}/stream``) and the saga page read: the
items after the one a reader saw last, with the saga's record read in the same load, so
"the saga ended and every item before its end is here" is one consistent answer.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from saga_engine.core.history._codec import Undecodable
from saga_engine.core.history._events import (
    AttemptTimedOut,
    Event,
    ProgressEmitted,
    ReplyReceived,
    StepAbandoned,
)
from saga_engine.core.history._status import SagaStatus
from saga_engine.kernel._serde import JsonDict
from saga_engine.store._store import EventStore

_KIND: Final = ProgressEmitted.kind
#: The events that end a command: no participant reports on it any longer.
_ENDING: Final = (ReplyReceived.kind, AttemptTimedOut.kind, StepAbandoned.kind)


@dataclass(frozen=True, slots=True)
class ProgressItem:
    """One item: its number (the saga's, from 1, with no gap), topic, payload, time."""

    number: int
    topic: str
    payload: Any
    at: datetime

    def as_json(self) -> JsonDict:
        return {
            "number": self.number,
            "topic": self.topic,
            "payload": self.payload,
            "at": self.at.isoformat(),
        }


@dataclass(frozen=True, slots=True)
class ProgressPage:
    """The items after a number, as of the saga's ``last_seq`` and ``status``."""

    items: list[ProgressItem]
    last_seq: int
    status: SagaStatus
    #: The commands whose reply (or timeout, or abandonment) is among the events read,
    #: when asked for (``ended=True``).
    ended_commands: frozenset[str] = frozenset()


def progress_items(
    events: Sequence[Event], after: int = 0, topics: Collection[str] | None = None
) -> list[ProgressItem]:
    """The items of a history numbered above ``after``, on ``topics`` (None: every one)."""
    return [
        ProgressItem(e.number, e.topic, e.payload, e.at)
        for e in events
        if isinstance(e, ProgressEmitted)
        and e.number > after
        and (topics is None or e.topic in topics)
    ]


async def progress_after(
    store: EventStore,
    saga_id: str,
    after: int = 0,
    topics: Collection[str] | None = None,
    undecodable: Undecodable = Undecodable.RAISE,
    *,
    after_seq: int = 0,
    ended: bool = False,
) -> ProgressPage:
    """The saga's items numbered above ``after``, among its events after ``after_seq``
    (a reader passes the ``last_seq`` of its previous page: only new rows are read);
    with ``ended``, also the commands that ended among those events. Raises
    SagaNotFound."""
    kinds = (_KIND, *_ENDING) if ended else (_KIND,)
    loaded = await store.load_after(saga_id, after_seq, kinds=kinds, undecodable=undecodable)
    events = [stored.event for stored in loaded.events]
    record = loaded.record
    return ProgressPage(
        progress_items(events, after, topics),
        record.last_seq,
        record.status,
        ended_commands(events) if ended else frozenset(),
    )


def ended_commands(events: Sequence[Event]) -> frozenset[str]:
    """The command ids that ``events`` answer, time out or abandon."""
    ids: set[str] = set()
    for e in events:
        if isinstance(e, ReplyReceived | AttemptTimedOut):
            ids.add(e.command_id)
        elif isinstance(e, StepAbandoned):
            ids.update(e.command_ids)
    return frozenset(ids)
