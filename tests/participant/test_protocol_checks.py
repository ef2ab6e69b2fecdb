"""proto/PROTOCOL.md section 7.5, held to the Python kit: a participant's checks of a
command, in their order, each with its outcome (a dead letter with its reason, or a
failure reply stored and sent); and the rules the document states beside them (the last
of duplicate headers wins, what "is JSON" means, an unknown command type is answered
and not dead-lettered, a stored reply sent again answers the copy it answers).

Every record carries an ``x-case`` header naming its case: readers ignore headers they
do not know, and a dead letter keeps the record's headers, so each dead letter is
matched to its case whatever partition it went through."""

from __future__ import annotations

import pytest

from saga_engine.protocol import Envelope, encode
from tests.participant import test_participant
from tests.participant.helpers import command, resent
from tests.participant.test_participant import World, body_of

pytestmark = pytest.mark.integration

world = test_participant.world

SAGA = "saga-checks"
Headers = list[tuple[str, bytes]]


def _record(case: str, body: object = None) -> tuple[bytes, bytes, Headers]:
    """A valid Reserve command of its own command id, tagged with its case."""
    envelope = command("Reserve", {"amount": 1} if body is None else body, saga_id=SAGA)
    envelope = envelope.model_copy(update={"command_id": f"{SAGA}:{case}"})
    key, value, headers = encode(envelope)
    return key, value, [*headers, ("x-case", case.encode())]


def _edit(headers: Headers, **changes: bytes | None) -> Headers:
    """``headers`` with each named header replaced (None: removed)."""
    names = {k.replace("__", "-") for k in changes}
    kept = [(k, v) for k, v in headers if k not in names]
    return kept + [(k.replace("__", "-"), v) for k, v in changes.items() if v is not None]


#: case -> (how the record differs from a valid command, the dead letter's reason).
#: Where a record fails two checks, the first in section 7.5's order must decide.
DEAD: dict[str, tuple[str, str]] = {
    "c01-oversized-and-no-id": ("oversized", "check 1 before 3"),
    "c02-not-utf8-and-schema-2": ("missing_header", "check 2 before 6"),
    "c03-no-source": ("missing_header", "check 3"),
    "c04-specversion-and-content-type": ("wrong_schema_version", "check 4 before 5"),
    "c05-content-type-and-schema-2": ("invalid_body", "check 5 before 6"),
    "c06-schema-2-and-bad-type": ("wrong_schema_version", "check 6 before 7"),
    "c07-bad-type-and-not-json": ("unknown_type", "check 7 before 9"),
    "c08-encoded-without-codec": ("undecodable", "check 8 before 9"),
    "c09-kafka-null-value": ("malformed_json", "check 9"),
    "c09-empty-value": ("malformed_json", "check 9"),
    "c09-nan": ("malformed_json", "check 9"),
    "c10-long-saga-id": ("missing_header", "check 10"),
    "c10-bad-time-and-key-mismatch": ("missing_header", "check 10 before 11"),
    "c11-key-mismatch-and-a-reply": ("key_mismatch", "check 11 before 12"),
    "c12-a-reply": ("unknown_type", "check 12"),
    "c13-no-command-id": ("missing_header", "check 13"),
    "c14-reply-to-not-a-topic": ("missing_header", "check 14"),
    "c15-nul-in-subject": ("unstorable_value", "check 15"),
}


def _dead_record(case: str) -> tuple[bytes | None, bytes | None, Headers]:
    key, value, headers = _record(case)
    if case == "c01-oversized-and-no-id":
        big = b'{"amount": 1, "pad": "' + b"x" * 9000 + b'"}'
        return key, big, _edit(headers, ce_id=None)
    if case == "c02-not-utf8-and-schema-2":
        return key, value, _edit(headers, ce_step=b"\xff\xfe", ce_schemaversion=b"2")
    if case == "c03-no-source":
        return key, value, _edit(headers, ce_source=None)
    if case == "c04-specversion-and-content-type":
        return key, value, _edit(headers, ce_specversion=b"0.3", content__type=b"text/plain")
    if case == "c05-content-type-and-schema-2":
        return key, value, _edit(headers, content__type=b"text/plain", ce_schemaversion=b"2")
    if case == "c06-schema-2-and-bad-type":
        return key, value, _edit(headers, ce_schemaversion=b"2", ce_type=b"saga.bogus")
    if case == "c07-bad-type-and-not-json":
        return key, b"{not json", _edit(headers, ce_type=b"saga.bogus")
    if case == "c08-encoded-without-codec":
        marker = b'{"$codec": "aes-gcm", "data": "AAAA"}'
        return key, marker, _edit(headers, saga__codec=b"aes-gcm")
    if case == "c09-kafka-null-value":
        return key, None, headers
    if case == "c09-empty-value":
        return key, b"", headers
    if case == "c09-nan":
        return key, b'{"amount": NaN}', headers
    if case == "c10-long-saga-id":
        long_id = b"s" * 201
        return long_id, value, _edit(headers, ce_sagaid=long_id)
    if case == "c10-bad-time-and-key-mismatch":
        return b"other", value, _edit(headers, ce_time=b"yesterday")
    if case == "c11-key-mismatch-and-a-reply":
        return b"other", value, _edit(headers, ce_type=b"saga.reply")
    if case == "c12-a-reply":
        return key, value, _edit(headers, ce_type=b"saga.reply")
    if case == "c13-no-command-id":
        return key, value, _edit(headers, ce_commandid=None)
    if case == "c14-reply-to-not-a-topic":
        return key, value, _edit(headers, ce_replyto=b"not a topic!")
    if case == "c15-nul-in-subject":
        return key, value, _edit(headers, ce_subject="Reserve\u0000".encode())
    raise AssertionError(case)


async def test_each_check_dead_letters_with_its_reason_and_the_first_failing_check_decides(
    world: World,
) -> None:
    participant = await world.participant()
    for case in DEAD:
        await world.bus.send_raw(*_dead_record(case))
    valid = command("Reserve", {"amount": 7}, saga_id=SAGA, command_id=f"{SAGA}:valid")
    await world.bus.send(valid)

    dead = await world.bus.wait_dead_letters(len(DEAD))
    [reply] = await world.bus.wait_replies(1)

    got = {dict(d.headers)["x-case"].decode(): dict(d.headers) for d in dead}
    assert set(got) == set(DEAD)
    wrong = {
        case: (got[case]["dlq_reason"].decode(), want, why)
        for case, (want, why) in DEAD.items()
        if got[case]["dlq_reason"].decode() != want
    }
    assert not wrong, wrong
    for headers in got.values():
        assert headers["dlq_consumer"].decode().startswith("participant:ledger:")
        assert headers["dlq_topic"].decode() == world.bus.command_topic
    # None of them was answered or applied; the valid command behind them was.
    assert reply.command_id == valid.command_id
    assert body_of(reply).outcome == "success"
    assert await world.ledger() == [(valid.command_id, 7)]
    assert participant.stats["dead_lettered"] == len(DEAD)


#: case -> (the body, the error the failure reply starts with, the dead letter's reason
#: or None when the check answers without one).
ANSWERED: dict[str, tuple[object, str, str | None]] = {
    "c16-nul-in-body": (
        {"amount": 1, "memo": "a\u0000b"},
        "Reserve body: memo:",
        "unstorable_value",
    ),
    "c18-array-body": ([1, 2], "invalid Reserve body", "invalid_body"),
    "c18-null-body": (None, "invalid Reserve body", "invalid_body"),
}


async def test_checks_16_to_18_are_answered_and_16_and_18_also_dead_lettered(
    world: World,
) -> None:
    participant = await world.participant()
    sent: dict[str, str] = {}
    for case, (body, _, _) in ANSWERED.items():
        key, _, headers = _record(case)
        value = b"null" if body is None else encode(command("Reserve", body))[1]
        await world.bus.send_raw(key, value, headers)
        sent[f"{SAGA}:{case}"] = case
    for case, subject in (("c17-unknown-type", b"Nope"), ("c17-no-subject", None)):
        key, value, headers = _record(case)
        await world.bus.send_raw(key, value, _edit(headers, ce_subject=subject))
        sent[f"{SAGA}:{case}"] = case

    replies = await world.bus.wait_replies(len(sent))
    dead = await world.bus.wait_dead_letters(len(ANSWERED))

    answers = {sent[r.command_id]: body_of(r) for r in replies}
    assert set(answers) == set(sent.values())
    for case, answer in answers.items():
        assert answer.outcome == "failure", (case, answer)
        stored = await world.processed(f"{SAGA}:{case}")
        assert stored is not None, case
        assert stored["outcome"] == "failure", case
    for case, (_, error, _) in ANSWERED.items():
        assert (answers[case].error or "").startswith(error), (case, answers[case].error)
    for case in ("c17-unknown-type", "c17-no-subject"):
        assert "cannot handle" in (answers[case].error or ""), answers[case].error
    reasons = {
        dict(d.headers)["x-case"].decode(): dict(d.headers)["dlq_reason"].decode() for d in dead
    }
    assert reasons == {case: reason for case, (_, _, reason) in ANSWERED.items()}
    assert await world.ledger() == []
    assert participant.stats["dead_lettered"] == len(ANSWERED)  # none for check 17


async def test_the_last_of_duplicate_headers_wins(world: World) -> None:
    await world.participant()
    key, value, headers = _record("dup-subject-last-valid")
    first_bad = [(k, b"Nope" if k == "ce_subject" else v) for k, v in headers]
    await world.bus.send_raw(key, value, [*first_bad, ("ce_subject", b"Reserve")])
    key, value, headers = _record("dup-subject-last-empty")
    await world.bus.send_raw(key, value, [*headers, ("ce_subject", b"")])

    replies = await world.bus.wait_replies(2)

    outcomes = {r.command_id.split(":")[-1]: body_of(r) for r in replies}
    assert outcomes["dup-subject-last-valid"].outcome == "success"
    # An empty last value counts as absent: no command type, answered as unknown.
    assert outcomes["dup-subject-last-empty"].outcome == "failure"
    assert await world.ledger() == [(f"{SAGA}:dup-subject-last-valid", 1)]


async def test_a_stored_reply_sent_again_answers_the_copy_it_answers(world: World) -> None:
    await world.participant()
    first = command("Reserve", {"amount": 2}, saga_id=SAGA, command_id=f"{SAGA}:again")
    again: Envelope = resent(first)
    assert again.id != first.id
    assert again.command_id == first.command_id
    await world.bus.send(first)
    await world.bus.wait_replies(1)
    await world.bus.send(again)
    replies = await world.bus.wait_replies(2)

    assert [r.causation_id for r in replies] == [first.id, again.id]
    assert replies[0].id != replies[1].id
    assert replies[0].body == replies[1].body
    assert await world.ledger() == [(first.command_id, 2)]
