"""The records the suite sends: a valid command of each conformance type, and records
that fail one check of PROTOCOL.md section 7.5 (or two, so that the first in order must
decide). Pure: bytes in, bytes out, no I/O."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from saga_engine.transport._timings import wire_time
from saga_engine.transport._wire import Envelope, MessageType, encode

Headers = list[tuple[str, bytes]]
Record = tuple[bytes | None, bytes | None, Headers]

#: ``{run}/{case}``: kept on a dead letter with the record's other headers, and ignored by
#: readers. Each dead letter is matched to its run and case whatever partition it went
#: through, so a run never counts the dead letters of an earlier one still draining.
CASE_HEADER: Final = "x-conformance-case"
APPLY, REFUSE, UNDO = "ConformanceApply", "ConformanceRefuse", "ConformanceUndo"
TRACEPARENT: Final = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@dataclass(frozen=True, slots=True)
class Sender:
    """Makes the suite's commands for one run: saga ids under the run's prefix."""

    run: str
    reply_to: str
    #: ``ce_senttime`` on its commands, as the engine stamps it (PROTOCOL.md 7.4a): the
    #: run's start (a reply echoes it).
    sent_time: str = field(default_factory=lambda: wire_time(time.time()))

    def command(
        self, case: str, subject: str, body: object, *, compensates: tuple[str, ...] = ()
    ) -> Envelope:
        saga = f"{self.run}-{case}"
        return Envelope(
            message_type=MessageType.COMMAND,
            source="/saga-conformance",
            subject=subject,
            saga_id=saga,
            saga_type="conformance",
            command_id=f"{saga}:{len(compensates)}",
            step=case,
            correlation_id=saga,
            reply_to=self.reply_to,
            traceparent=TRACEPARENT,
            compensation=bool(compensates),
            compensates=",".join(compensates),
            # As the engine stamps it (PROTOCOL.md 7.4a): a reply echoes it.
            sent_time=self.sent_time,
            body=body,
        )

    def key(self, name: str) -> str:
        """An effect key of this run only: a participant's database may hold earlier runs'."""
        return f"{self.run}-{name}"

    def record(self, case: str, subject: str = APPLY, body: object = None) -> Record:
        envelope = self.command(case, subject, {"key": self.key(case)} if body is None else body)
        key, value, headers = encode(envelope)
        return key, value, [*headers, (CASE_HEADER, case_tag(self.run, case))]


def case_tag(run: str, case: str) -> bytes:
    """The value of :data:`CASE_HEADER` on a record of ``case`` in ``run``."""
    return f"{run}/{case}".encode()


def edit(headers: Headers, changes: dict[str, bytes | None]) -> Headers:
    """``headers`` with each named header replaced (None: removed)."""
    kept = [(k, v) for k, v in headers if k not in changes]
    return kept + [(k, v) for k, v in changes.items() if v is not None]


@dataclass(frozen=True, slots=True)
class DeadCase:
    """A record failing ``check`` (and maybe a later one too): a dead letter ``reason``."""

    name: str
    check: str
    reason: str
    change: Callable[[Record, int], Record] = field(repr=False)


def _headers(**changes: bytes | None) -> Callable[[Record, int], Record]:
    def change(record: Record, _: int) -> Record:
        named = {k.replace("__", "-"): v for k, v in changes.items()}
        return record[0], record[1], edit(record[2], named)

    return change


def _value(value: bytes | None, **changes: bytes | None) -> Callable[[Record, int], Record]:
    def change(record: Record, limit: int) -> Record:
        return record[0], value, _headers(**changes)(record, limit)[2]

    return change


def _oversized(record: Record, limit: int) -> Record:
    big = b'{"key": "x", "pad": "' + b"x" * limit + b'"}'
    return record[0], big, edit(record[2], {"ce_id": None})


def _long_saga_id(record: Record, _: int) -> Record:
    long_id = b"s" * 201
    return long_id, record[1], edit(record[2], {"ce_sagaid": long_id})


def _key(key: bytes, **changes: bytes | None) -> Callable[[Record, int], Record]:
    def change(record: Record, limit: int) -> Record:
        return key, record[1], _headers(**changes)(record, limit)[2]

    return change


def _both(
    first: Callable[[Record, int], Record], then: Callable[[Record, int], Record]
) -> Callable[[Record, int], Record]:
    return lambda record, limit: then(first(record, limit), limit)


NUL_SUBJECT: Final = "ConformanceApply\u0000".encode()
ENCODED: Final = b'{"$codec": "aes-gcm", "data": "AAAA"}'


#: Each check failing alone, and each pair of neighbouring checks whose reasons differ
#: failing together (the first in order decides; checks 2 and 3, and 13 and 14, give the
#: same reason, so 2 is paired with 6 and 13 with 15).
DEAD_CASES: Final = (
    DeadCase(
        "oversized-and-not-utf8",
        "1 before 2",
        "oversized",
        _both(_oversized, _headers(ce_step=b"\xff\xfe")),
    ),
    DeadCase("oversized-and-no-id", "1 before 3", "oversized", _oversized),
    DeadCase(
        "not-utf8-and-schema-2",
        "2 before 6",
        "missing_header",
        _headers(ce_step=b"\xff\xfe", ce_schemaversion=b"2"),
    ),
    DeadCase("no-source", "3", "missing_header", _headers(ce_source=None)),
    DeadCase(
        "no-source-and-specversion",
        "3 before 4",
        "missing_header",
        _headers(ce_source=None, ce_specversion=b"0.3"),
    ),
    DeadCase(
        "specversion-and-content-type",
        "4 before 5",
        "wrong_schema_version",
        _headers(ce_specversion=b"0.3", content__type=b"text/plain"),
    ),
    DeadCase(
        "content-type-and-schema-2",
        "5 before 6",
        "invalid_body",
        _headers(content__type=b"text/plain", ce_schemaversion=b"2"),
    ),
    DeadCase(
        "schema-2-and-bad-type",
        "6 before 7",
        "wrong_schema_version",
        _headers(ce_schemaversion=b"2", ce_type=b"saga.bogus"),
    ),
    DeadCase(
        "bad-type-and-encoded",
        "7 before 8",
        "unknown_type",
        _value(ENCODED, saga__codec=b"aes-gcm", ce_type=b"saga.bogus"),
    ),
    DeadCase(
        "bad-type-and-not-json",
        "7 before 9",
        "unknown_type",
        _value(b"{not json", ce_type=b"saga.bogus"),
    ),
    DeadCase("encoded-without-codec", "8", "undecodable", _value(ENCODED, saga__codec=b"aes-gcm")),
    DeadCase(
        "encoded-and-not-json",
        "8 before 9",
        "undecodable",
        _value(b"{not json", saga__codec=b"aes-gcm"),
    ),
    DeadCase("kafka-null-value", "9", "malformed_json", _value(None)),
    DeadCase("empty-value", "9", "malformed_json", _value(b"")),
    DeadCase("nan", "9", "malformed_json", _value(b'{"key": NaN}')),
    DeadCase(
        "not-json-and-bad-time",
        "9 before 10",
        "malformed_json",
        _value(b"{not json", ce_time=b"yesterday"),
    ),
    DeadCase("long-saga-id", "10", "missing_header", _long_saga_id),
    DeadCase(
        "bad-time-and-key-mismatch",
        "10 before 11",
        "missing_header",
        _key(b"other", ce_time=b"yesterday"),
    ),
    DeadCase("empty-key", "11", "key_mismatch", _key(b"")),
    DeadCase(
        "key-mismatch-and-a-reply",
        "11 before 12",
        "key_mismatch",
        _key(b"other", ce_type=b"saga.reply"),
    ),
    DeadCase("a-reply", "12", "unknown_type", _headers(ce_type=b"saga.reply")),
    DeadCase(
        "a-reply-without-command-id",
        "12 before 13",
        "unknown_type",
        _headers(ce_type=b"saga.reply", ce_commandid=None),
    ),
    DeadCase("no-command-id", "13", "missing_header", _headers(ce_commandid=None)),
    DeadCase("long-command-id", "13", "missing_header", _headers(ce_commandid=b"c" * 201)),
    DeadCase(
        "no-command-id-and-nul-in-subject",
        "13 before 15",
        "missing_header",
        _headers(ce_commandid=None, ce_subject=NUL_SUBJECT),
    ),
    DeadCase("reply-to-not-a-topic", "14", "missing_header", _headers(ce_replyto=b"not a topic!")),
    DeadCase(
        "reply-to-not-a-topic-and-nul-in-subject",
        "14 before 15",
        "missing_header",
        _headers(ce_replyto=b"not a topic!", ce_subject=NUL_SUBJECT),
    ),
    DeadCase("nul-in-subject", "15", "unstorable_value", _headers(ce_subject=NUL_SUBJECT)),
    DeadCase(
        "nul-in-subject-and-in-body",
        "15 before 16",
        "unstorable_value",
        _value(b'{"key": "a\\u0000b"}', ce_subject=NUL_SUBJECT),
    ),
)


@dataclass(frozen=True, slots=True)
class AnsweredCase:
    """A command failing ``check``: answered ``failure``, and dead-lettered as
    ``reason`` unless that is None."""

    name: str
    check: str
    reason: str | None
    subject: str | None
    value: bytes


ANSWERED_CASES: Final = (
    AnsweredCase("nul-in-body", "16", "unstorable_value", APPLY, b'{"key": "a\\u0000b"}'),
    AnsweredCase(
        "nul-in-body-and-unknown-type",
        "16 before 17",
        "unstorable_value",
        "ConformanceNope",
        b'{"key": "a\\u0000b"}',
    ),
    AnsweredCase("unknown-type", "17", None, "ConformanceNope", b'{"key": "k"}'),
    AnsweredCase("unknown-type-and-array-body", "17 before 18", None, "ConformanceNope", b"[1, 2]"),
    AnsweredCase("no-subject", "17", None, None, b'{"key": "k"}'),
    AnsweredCase("array-body", "18", "invalid_body", APPLY, b"[1, 2]"),
    AnsweredCase("null-body", "18", "invalid_body", APPLY, b"null"),
    AnsweredCase("wrong-field-type", "18", "invalid_body", APPLY, b'{"key": 5}'),
)
