"""``ctx.emit``: a numbered, durable progress item on one of the saga's topics.

The item is an intent (``progress_emitted``): recorded with the decision that made it,
so it is visible once that decision is committed, and matched (never recorded again) on
replay. Its number counts the saga's items from 1 with no gap: the n-th ``ctx.emit`` of
a run is item n on every replay, so a reader that saw item n resumes after it.
"""

from __future__ import annotations

import re
from typing import Any, Final

from pydantic import BaseModel

from saga_engine.core.history._events import ProgressEmitted
from saga_engine.core.runtime._intents import check_open, emit, next_id
from saga_engine.core.runtime._state import SagaState
from saga_engine.kernel._serde import check_storable, dumps, model_payload
from saga_engine.kernel._settings import KafkaSettings, check_message_size

#: The size rule's limit when the runtime was given none (a test's): Kafka's default.
DEFAULT_LIMIT: Final = KafkaSettings.model_fields["max_message_bytes"].default

#: A topic's name: what ``?topics=`` of the stream and ``SagaClient.stream`` filter on.
TOPIC_NAME: Final = re.compile(r"^[A-Za-z][A-Za-z0-9._-]{0,63}$")


def check_topic(topic: object) -> str | None:
    """Why ``topic`` cannot name a progress topic (None: it can)."""
    if isinstance(topic, str) and TOPIC_NAME.match(topic):
        return None
    return (
        f"a progress topic is 1 to 64 letters, digits, '.', '_' or '-', starting with a "
        f"letter (e.g. 'status'), got {topic!r}"
    )


async def emit_progress(
    s: SagaState, topic: str, payload: BaseModel | Any, limit: int = DEFAULT_LIMIT
) -> int:
    """Records item n+1 on ``topic`` and returns its number. A bad topic is a definition
    error (the saga parks); a payload that is not JSON, cannot be stored or is larger
    than ``limit`` (``kafka.max_message_bytes``, the one size rule) raises in the saga's
    code, recording nothing and using no number."""
    check_open(s)
    problem = check_topic(topic)
    if problem is not None:
        s.definition_error(f"ctx.emit: {problem}")
    value = model_payload(payload) if isinstance(payload, BaseModel) else payload
    if s.cursor >= len(s.history):
        # Refused in the saga's code, before anything is recorded (a recorded item was
        # checked when it was: replay does not look again).
        what = f"the progress item on {topic!r}"
        size = len(dumps(value))
        check_storable(value, what)
        check_message_size(size, limit, what)
    number = next_id(s, "progress")
    emit(s, ProgressEmitted(at=s.now, number=number, topic=topic, payload=value))
    return number
