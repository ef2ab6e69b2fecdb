"""A participant's progress on the step it is handling, on the wire (``{prefix}.progress``).

Not durable and not part of any saga's history: a participant tells how far its handler
got (``tx.progress(...)`` in the Python kit, ``cmd.Progress(...)`` in the Go kit) with
one record, fire and forget; each admin process reads the topic from its end and shows
the latest reports on the step while it runs (``GET /sagas/{id}``, the stream, the saga
page). PROTOCOL.md section 5b describes the record.

This module is pure: the record's model, its encoding (what a kit sends) and its
decoding (what a reader keeps or drops, and why).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from saga_engine.kernel._errors import UnreadableProgress

__all__ = [
    "STEP_PROGRESS_MAX_BYTES",
    "STEP_PROGRESS_TYPE",
    "StepProgressRecord",
    "UnreadableProgress",
    "decode_step_progress",
    "encode_step_progress",
]

#: The largest record value (the JSON object, ``body`` included), in bytes: a kit drops
#: a larger report without sending it, a reader drops a larger record.
STEP_PROGRESS_MAX_BYTES: Final = 8192
#: The record's ``ce_type`` header (informative: a reader decides on the value alone).
STEP_PROGRESS_TYPE: Final = "saga.progress"


class StepProgressRecord(BaseModel):
    """One report: which saga, command and attempt it is about, its number among the
    reports of that run of the handler (``seq``, from 1: a handler run again numbers from
    1 again), when it was made and what it says (``body``: any JSON value)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    saga_id: str = Field(min_length=1, max_length=200)
    command_id: str = Field(min_length=1, max_length=200)
    step: str = Field(default="", max_length=200)
    attempt: int = Field(ge=1, le=1_000_000)
    seq: int = Field(ge=1, le=2**53)
    at: datetime
    body: Any = None


def encode_step_progress(
    *, saga_id: str, command_id: str, step: str, attempt: int, seq: int, body: Any
) -> bytes:
    """The record value of one report. Raises TypeError (not JSON) or ValueError (over
    ``STEP_PROGRESS_MAX_BYTES``): the kits count those and send nothing."""
    at = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    value = {
        "saga_id": saga_id,
        "command_id": command_id,
        "step": step,
        "attempt": attempt,
        "seq": seq,
        "at": at,
        "body": body,
    }
    data = orjson.dumps(value, option=orjson.OPT_UTC_Z)
    if len(data) > STEP_PROGRESS_MAX_BYTES:
        msg = f"a progress report is {len(data)} bytes, over {STEP_PROGRESS_MAX_BYTES}"
        raise ValueError(msg)
    return data


def decode_step_progress(value: bytes | None) -> StepProgressRecord:
    """A record value read from ``{prefix}.progress``; raises UnreadableProgress."""
    if value is None:
        raise UnreadableProgress("malformed", "the record has no value")
    if len(value) > STEP_PROGRESS_MAX_BYTES:
        detail = f"{len(value)} bytes, over {STEP_PROGRESS_MAX_BYTES}"
        raise UnreadableProgress("oversized", detail)
    try:
        parsed = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        # (orjson refuses a value nested too deep as it refuses any other non-JSON.)
        raise UnreadableProgress("malformed", f"the value is not JSON: {exc}") from None
    try:
        return StepProgressRecord.model_validate(parsed)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "value"
        raise UnreadableProgress("malformed", f"{where}: {first['msg']}") from None
