"""One mapping of a failure to its dead-letter reason (``kernel._dead_letter_reason``) and one
publisher of dead letters with retries (``transport._dead_letter_sending``), used by the
inbox, the trigger and event-source consumers and the participant kit (issue 39, 3)."""

from __future__ import annotations

from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError, MessageSizeTooLargeError
from pydantic import BaseModel, ValidationError

from saga_engine.kernel._dead_letter_reason import dead_letter_detail, dead_letter_reason
from saga_engine.kernel._errors import (
    CodecError,
    CodecFailure,
    ConcurrencyError,
    DefinitionError,
    IdempotencyConflict,
    InvalidPayload,
    InvalidTransition,
    KafkaUnavailable,
    NewerEventError,
    NotParent,
    PoisonMessage,
    PoisonReason,
    SagaNotFound,
    SerializationError,
    StoreUnavailable,
    UnknownSagaType,
    UnstorableValue,
)
from saga_engine.kernel._retry import OUTAGE, Backoff
from saga_engine.transport._dead_letter_sending import publish_dead_letter

R = PoisonReason


class _Model(BaseModel):
    n: int


def _validation_error() -> ValidationError:
    try:
        _Model.model_validate({"n": "x"})
    except ValidationError as exc:
        return exc
    raise AssertionError("unreachable")


def _payload_error() -> InvalidPayload:
    return InvalidPayload("the input", [{"loc": ["n"], "msg": "not an int"}])


CASES: dict[str, tuple[BaseException, dict[str, Any], PoisonReason | None]] = {
    "a poison message keeps its reason": (PoisonMessage(R.OVERSIZED, "big"), {}, R.OVERSIZED),
    "unknown saga": (SagaNotFound("s"), {}, R.UNKNOWN_SAGA),
    "unknown saga type": (UnknownSagaType("T", []), {}, R.UNKNOWN_SAGA_TYPE),
    "unstorable": (
        UnstorableValue("the input", [{"loc": ["a"], "msg": "a NUL"}]),
        {},
        R.UNSTORABLE_VALUE,
    ),
    "key reused": (IdempotencyConflict("k", "s"), {}, R.IDEMPOTENCY_CONFLICT),
    "not the parent": (NotParent("c", "p", None), {}, R.NOT_PARENT),
    "newer engine": (NewerEventError("x", 9, 1), {}, R.NEWER_VERSION),
    "undecodable": (CodecError(CodecFailure.UNKNOWN_KEY, "no key k2"), {}, R.UNDECODABLE),
    "a signal's payload refused": (
        _payload_error(),
        {"message_type": "saga.signal"},
        R.INVALID_SIGNAL,
    ),
    "a start's input refused": (_payload_error(), {"message_type": "saga.start"}, R.INVALID_INPUT),
    "a signal the state refuses": (
        InvalidTransition("ended"),
        {"message_type": "saga.signal"},
        R.NOT_ACCEPTED,
    ),
    "a cancel the state refuses": (
        InvalidTransition("ended"),
        {"message_type": "saga.cancel"},
        R.NOT_ACCEPTED,
    ),
    "another action the state refuses": (
        InvalidTransition("ended"),
        {"message_type": "saga.reply"},
        R.REJECTED,
    ),
    "not json, reading": (SerializationError("not JSON"), {"reading": True}, R.MALFORMED_JSON),
    "not json, applying": (SerializationError("cannot store"), {}, R.REJECTED),
    "its model refuses it, reading": (_validation_error(), {"reading": True}, R.INVALID_BODY),
    "any other saga error": (DefinitionError("bad"), {}, R.REJECTED),
    "a bug": (ValueError("bug"), {}, R.ENGINE_ERROR),
    "a trigger's code raising": (
        ValueError("bug"),
        {"unexpected": R.REJECTED},
        R.REJECTED,
    ),
    "an outage is retried, not dead-lettered": (StoreUnavailable("away"), {}, None),
    "a lost race too": (ConcurrencyError("s", 1, 2), {}, None),
}


@pytest.mark.parametrize(("exc", "options", "reason"), list(CASES.values()), ids=list(CASES))
def test_each_failure_class_maps_to_its_reason(
    exc: BaseException, options: dict[str, Any], reason: PoisonReason | None
) -> None:
    assert dead_letter_reason(exc, **options) is reason


def test_the_detail_says_what_the_failure_says() -> None:
    assert dead_letter_detail(PoisonMessage(R.OVERSIZED, "2 MB over 1 MB")) == "2 MB over 1 MB"
    assert dead_letter_detail(SagaNotFound("s1")) == str(SagaNotFound("s1"))
    assert dead_letter_detail(ValueError("bug")) == "ValueError: bug"
    # Not the message's fault: the class says what failed.
    codec = CodecError(CodecFailure.NOT_CONFIGURED, "no codec")
    assert dead_letter_detail(codec, R.ENGINE_ERROR) == f"CodecError: {codec}"


# --------------------------------------------------------------------------- the publisher


class FlakyTopic:
    """A dead-letter topic that fails with ``failures`` in turn, then takes the record."""

    def __init__(self, *failures: Exception) -> None:
        self.failures = list(failures)
        self.calls = 0
        self.sent: list[tuple[Any, str, str, str]] = []

    async def publish_record(self, record: Any, *, reason: str, detail: str, consumer: str) -> None:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        self.sent.append((record, reason, detail, consumer))


async def test_a_transient_failure_is_retried_with_the_outage_back_off() -> None:
    topic = FlakyTopic(KafkaUnavailable("away"), KafkaConnectionError(), OSError("refused"))
    waits: list[float] = []

    async def pause(delay: float) -> None:
        waits.append(delay)

    await publish_dead_letter(
        topic,
        "record",
        reason="rejected",
        detail="d",
        consumer="c",
        pause=pause,
        backoff=OUTAGE.backoff(rng=lambda: 0.0),
    )

    assert topic.sent == [("record", "rejected", "d", "c")]
    assert topic.calls == 4
    # The OUTAGE profile's first three delays, at the lowest jitter (half the ceiling).
    expected = Backoff(OUTAGE.initial, OUTAGE.maximum, rng=lambda: 0.0)
    assert waits == [expected.next_delay() for _ in range(3)] == [0.05, 0.1, 0.2]


@pytest.mark.parametrize(
    "failure",
    [MessageSizeTooLargeError(), ValueError("bug")],
    ids=["too large for the topic", "a bug"],
)
async def test_a_permanent_failure_is_raised_at_once(failure: Exception) -> None:
    topic = FlakyTopic(failure)
    waits: list[float] = []

    async def pause(delay: float) -> None:
        waits.append(delay)

    with pytest.raises(type(failure)):
        await publish_dead_letter(
            topic, "record", reason="rejected", detail="d", consumer="c", pause=pause
        )
    assert topic.calls == 1
    assert waits == []


async def test_a_consumer_that_stops_gives_up_on_an_outage() -> None:
    topic = FlakyTopic(KafkaUnavailable("away"), KafkaUnavailable("away"))

    async def pause(delay: float) -> None:
        raise AssertionError("a stopping consumer does not wait")

    with pytest.raises(KafkaUnavailable):
        await publish_dead_letter(
            topic, "r", reason="x", detail="d", consumer="c", running=lambda: False, pause=pause
        )
    assert topic.calls == 1
