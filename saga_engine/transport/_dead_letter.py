"""A dead letter as an operator sees it, and the port the admin API reads them through
(``DeadLetterReader``; the Kafka adapter is ``transport._dlq.DeadLetterTopic``, handed to the
admin app by the worker, as the other adapters are)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

__all__ = ["PREVIEW_CHARS", "DeadLetter", "DeadLetterReader", "Replayed"]

#: How much of a payload a list shows; :attr:`DeadLetter.payload` has all of it.
PREVIEW_CHARS = 200


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One record of the dead-letter topic, with what its ``dlq_*`` headers say."""

    partition: int
    offset: int
    timestamp: datetime
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]

    def header(self, name: str) -> str:
        """The header's value as text ("" when absent)."""
        for key, value in self.headers:
            if key == name:
                return value.decode(errors="replace")
        return ""

    @property
    def reason(self) -> str:
        return self.header("dlq_reason")

    @property
    def detail(self) -> str:
        return self.header("dlq_detail")

    @property
    def origin_topic(self) -> str:
        return self.header("dlq_topic")

    @property
    def origin_partition(self) -> str:
        return self.header("dlq_partition")

    @property
    def origin_offset(self) -> str:
        return self.header("dlq_offset")

    @property
    def saga_id(self) -> str:
        return self.header("ce_sagaid")

    @property
    def payload(self) -> str:
        """The whole value as text (undecodable bytes replaced)."""
        return (self.value or b"").decode(errors="replace")

    @property
    def size(self) -> int:
        return len(self.value or b"")

    def preview(self, chars: int = PREVIEW_CHARS) -> str:
        """The payload cut to ``chars`` characters (with an ellipsis when cut)."""
        text = self.payload
        return text if len(text) <= chars else text[:chars] + "…"

    def text_headers(self) -> list[tuple[str, str]]:
        return [(k, v.decode(errors="replace")) for k, v in self.headers]


@dataclass(frozen=True, slots=True)
class Replayed:
    """Where a replayed dead letter went."""

    partition_from: int
    offset_from: int
    topic: str
    partition: int
    offset: int
    saga_id: str


class DeadLetterReader(Protocol):
    """The dead-letter topic, for an operator's reads and replays (see ``DeadLetterTopic``
    for what each call does and raises)."""

    @property
    def topic(self) -> str: ...

    async def newest(
        self,
        limit: int | None,
        seconds: float,
        *,
        match: Callable[[DeadLetter], bool] | None = None,
        scan: int | None = None,
    ) -> list[DeadLetter]: ...

    async def get(self, partition: int, offset: int, seconds: float) -> DeadLetter: ...

    async def replay(
        self, letter: DeadLetter, seconds: float, *, to_saga: str | None = None
    ) -> Replayed: ...
