"""Runs the conformance suite against a live participant: :func:`run_suite`.

Each part sends its records, waits (polling, with a deadline) for the replies and dead
letters it expects, and judges them; a part that waits in vain fails with what is
missing. Parts run one after another, so a later one never races an earlier one. Every
run gives the same rows, :data:`CASE_NAMES`, in that order."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from saga_engine.conformance._cases import (
    ANSWERED_CASES,
    APPLY,
    DEAD_CASES,
    REFUSE,
    UNDO,
    Sender,
    edit,
)
from saga_engine.conformance._probe import Probe
from saga_engine.kernel._serde import dumps
from saga_engine.transport._wire import encode

CODECS = ("gzip", "snappy", "lz4", "zstd")
#: Section 12: a participant MUST accept every integer from -2^63 to 2^64-1.
INTEGERS = (-(2**63), 2**63, 2**64 - 1)
NEW_TOPIC_CASE = "a reply to a topic that does not exist yet"

#: Every row of a report, in its order: the same on every run, pass or fail.
CASE_NAMES: tuple[str, ...] = (
    *(f"dead letter: {c.name}" for c in DEAD_CASES),
    *(f"answered: {a.name}" for a in ANSWERED_CASES),
    "everything arrived",
    "duplicate headers: last-subject-wins",
    "duplicate headers: empty-last-subject",
    "three copies applied once, answered alike",
    "reply headers, each answering its copy",
    "timing headers, if sent, well-formed",
    "a refusal applies nothing",
    *(f"a {codec} batch" for codec in CODECS),
    "answered on the inbox without ce_replyto",
    "answered without ce_step",
    "integers from -2^63 to 2^64-1 accepted",
    "a compensation before its forward command",
    "a compensation after its forward command",
    NEW_TOPIC_CASE,
)


@dataclass(frozen=True, slots=True)
class CaseResult:
    name: str
    #: Where PROTOCOL.md says it.
    section: str
    passed: bool
    detail: str = ""


@dataclass
class Report:
    participant: str
    command_topic: str
    results: list[CaseResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.results) and all(r.passed for r in self.results)

    def as_dict(self) -> dict[str, Any]:
        return {
            "participant": self.participant,
            "command_topic": self.command_topic,
            "passed": self.passed,
            "cases": [asdict(r) for r in self.results],
        }


async def run_suite(
    bootstrap_servers: str,
    participant: str,
    *,
    prefix: str = "saga",
    max_message_bytes: int = 1_000_000,
    timeout_s: float = 30.0,
) -> Report:
    """Runs every part against ``participant`` (its command topic must exist and the
    participant be running); returns one result per case."""
    run = f"conf-{uuid.uuid4().hex[:10]}"
    async with Probe(bootstrap_servers, prefix, participant, timeout_s, run) as probe:
        sender = Sender(run, probe.inbox_topic)
        report = Report(participant, probe.command_topic)
        parts: list[Callable[[Probe, Sender, int], Awaitable[list[CaseResult]]]] = [
            _checks,
            _duplicate_headers,
            _applied_once,
            _refusal,
            _compressed,
            _accepted,
            _undo_never_applied,
            _undo_applied,
        ]
        for part in parts:
            report.results.extend(await part(probe, sender, max_message_bytes))
        report.results.append(await _new_reply_topic(probe, sender, f"{prefix}.{run}"))
    names = tuple(r.name for r in report.results)
    assert names == CASE_NAMES, f"the suite's rows {names} are not CASE_NAMES"
    return report


async def _checks(probe: Probe, sender: Sender, limit: int) -> list[CaseResult]:
    """Section 7.5: each check's outcome, the first failing check deciding."""
    for case in DEAD_CASES:
        await probe.send(*case.change(sender.record(case.name), limit))
    answered: dict[str, str] = {}
    for a in ANSWERED_CASES:
        key, _, headers = sender.record(a.name)
        subject = a.subject.encode() if a.subject else None
        await probe.send(key, a.value, edit(headers, {"ce_subject": subject}))
        answered[sender.command(a.name, APPLY, {}).command_id] = a.name
    dead_wanted = {c.name for c in DEAD_CASES} | {a.name for a in ANSWERED_CASES if a.reason}
    replies, missing = await probe.collect(set(answered), dead_wanted)
    # What a participant sends late (a dead letter after its reply) is still judged.
    await probe.settle(1.0)
    results = [
        _judge_dead(probe, sender, c.name, f"7.5 check {c.check}", c.reason) for c in DEAD_CASES
    ]
    for a in ANSWERED_CASES:
        cid = sender.command(a.name, APPLY, {}).command_id
        got = replies.get(cid)
        problems = [] if got else ["no reply"]
        if got and got[0].outcome != "failure":
            problems.append(f"outcome {got[0].outcome!r}, want 'failure'")
        dead = probe.dead_reasons(a.name)
        want = [a.reason] if a.reason else []
        if dead != want:
            problems.append(f"dead letters {dead}, want {want}")
        results.append(_result(f"answered: {a.name}", f"7.5 check {a.check}", problems))
    results.append(_result("everything arrived", "7.5", [f"missing: {missing}"] if missing else []))
    return results


def _judge_dead(probe: Probe, sender: Sender, case: str, section: str, reason: str) -> CaseResult:
    got = probe.dead_letters.get(case, [])
    problems = []
    if [h.get("dlq_reason") for h in got] != [reason]:
        problems.append(f"dead letters {[h.get('dlq_reason') for h in got]}, want [{reason!r}]")
    for h in got:
        consumer = h.get("dlq_consumer", "")
        if not consumer.startswith(f"participant:{probe.participant}:"):
            problems.append(f"dlq_consumer {consumer!r}, want 'participant:{probe.participant}:…'")
        if h.get("dlq_topic") != probe.command_topic:
            problems.append(f"dlq_topic {h.get('dlq_topic')!r}")
        if "dlq_truncated" in h:
            problems.append("truncated, though the dead-letter topic takes it whole (section 11)")
    if probe.answered(f"{sender.run}-{case}"):
        problems.append("it was answered; a record failing checks 1-15 gets no reply")
    return _result(f"dead letter: {case}", section, problems)


def _result(name: str, section: str, problems: list[str]) -> CaseResult:
    return CaseResult(name, section, not problems, "; ".join(problems))


async def _duplicate_headers(probe: Probe, sender: Sender, _limit: int) -> list[CaseResult]:
    """Section 3: the last of a header's occurrences wins; an empty last one is absent."""
    results = []
    for case, last, want in (
        ("last-subject-wins", APPLY.encode(), ["success"]),
        ("empty-last-subject", b"", ["failure"]),
    ):
        key, value, headers = sender.record(case)
        first = [(k, b"ConformanceNope" if k == "ce_subject" else v) for k, v in headers]
        if not last:
            first = headers
        await probe.send(key, value, [*first, ("ce_subject", last)])
        cid = sender.command(case, APPLY, {}).command_id
        replies, _missing = await probe.collect({cid}, set())
        got = [r.outcome for r in replies.get(cid, [])]
        problems = [] if got == want else [f"outcomes {got}, want {want}"]
        results.append(_result(f"duplicate headers: {case}", "3", problems))
    return results


async def _applied_once(probe: Probe, sender: Sender, _: int) -> list[CaseResult]:
    """Sections 7.2 and 10: three copies of one command id, applied once, answered
    alike; 7.4: each reply's headers, answering its own copy."""
    first = sender.command("applied-once", APPLY, {"key": sender.key("applied-once")})
    copies = [first, *(first.model_copy(update={"id": str(uuid.uuid4())}) for _ in range(2))]
    for copy in copies:
        await probe.send(*encode(copy))
    replies, missing = await probe.collect({first.command_id}, set(), count=3)
    got = replies.get(first.command_id, [])
    problems = [f"missing: {missing}"] if missing else []
    applied = [r.payload.get("applied") for r in got]
    if applied != [1] * len(copies):
        problems.append(f"'applied' in the replies is {applied}, want {[1] * len(copies)}")
    if len({dumps(r.body) for r in got}) > 1:
        problems.append("the copies' replies differ in their value")
    results = [_result("three copies applied once, answered alike", "7.2, 10", problems)]
    header_problems = [p for r in got for p in r.header_problems(first)]
    causes = sorted(r.headers.get("ce_causationid", "") for r in got)
    if causes != sorted(c.id for c in copies):
        header_problems.append(f"ce_causationid {causes}, want each copy's ce_id")
    results.append(_result("reply headers, each answering its copy", "7.4", header_problems))
    timing_problems = [p for r in got for p in r.timing_problems(first)]
    if missing:
        timing_problems.append(f"missing: {missing}")
    results.append(_result("timing headers, if sent, well-formed", "7.4a", timing_problems))
    return results


async def _refusal(probe: Probe, sender: Sender, _: int) -> list[CaseResult]:
    """Section 7.3: a refusal applies nothing."""
    refuse = sender.command("refused", REFUSE, {"key": sender.key("refused")})
    apply = sender.command("refused-then-applied", APPLY, {"key": sender.key("refused")})
    problems = await _exchange(probe, refuse, "failure")
    problems += await _exchange(probe, apply, "success", applied=1)
    return [_result("a refusal applies nothing", "7.3", problems)]


async def _compressed(probe: Probe, sender: Sender, _: int) -> list[CaseResult]:
    """Section 1: every batch codec is read."""
    results = []
    for codec in CODECS:
        command = sender.command(
            f"compressed-{codec}", APPLY, {"key": sender.key(f"compressed-{codec}")}
        )
        await probe.send(*encode(command), compression=codec)
        replies, missing = await probe.collect({command.command_id}, set())
        got = replies.get(command.command_id, [])
        problems = [f"no reply ({missing})"] if not got else got[0].expect("success", applied=1)
        results.append(_result(f"a {codec} batch", "1 (compression)", problems))
    return results


async def _undo_never_applied(probe: Probe, sender: Sender, _: int) -> list[CaseResult]:
    """Sections 7.2 step 3a and 7.3: a compensation whose forward command never came
    undoes nothing, and the forward command arriving after it is never applied."""
    forward = sender.command("never-applied", APPLY, {"key": sender.key("never-applied")})
    undo = sender.command(
        "never-applied",
        UNDO,
        {"key": sender.key("never-applied")},
        compensates=(forward.command_id,),
    )
    check = sender.command("never-applied-check", APPLY, {"key": sender.key("never-applied")})
    # Section 7.3: nothing was applied, so `{}` without running the handler is right too.
    problems = await _exchange(probe, undo, "success", or_empty=True, undone=0)
    problems += await _exchange(probe, forward, "failure")
    problems += await _exchange(probe, check, "success", applied=1)
    return [_result("a compensation before its forward command", "7.2 step 3a, 7.3", problems)]


async def _undo_applied(probe: Probe, sender: Sender, _: int) -> list[CaseResult]:
    forward = sender.command("undo-applied", APPLY, {"key": sender.key("undo-applied")})
    undo = sender.command(
        "undo-applied", UNDO, {"key": sender.key("undo-applied")}, compensates=(forward.command_id,)
    )
    problems = await _exchange(probe, forward, "success", applied=1)
    problems += await _exchange(probe, undo, "success", undone=1)
    return [_result("a compensation after its forward command", "7.3", problems)]


async def _accepted(probe: Probe, sender: Sender, _: int) -> list[CaseResult]:
    """Section 7.5's notes: a command without ``ce_replyto`` is answered on the inbox,
    one without ``ce_step`` is processed; section 12: every integer from -2^63 to
    2^64-1 in a body is accepted."""
    results = []
    for name, case, header in (
        ("answered on the inbox without ce_replyto", "no-reply-to", "ce_replyto"),
        ("answered without ce_step", "no-step", "ce_step"),
    ):
        key, value, headers = sender.record(case)
        await probe.send(key, value, edit(headers, {header: None}))
        cid = sender.command(case, APPLY, {}).command_id
        replies, missing = await probe.collect({cid}, set())
        got = replies.get(cid, [])
        problems = [f"no reply on the inbox ({missing})"] if not got else []
        problems += got[0].expect("success", applied=1) if got else []
        results.append(_result(name, "7.5 notes", problems))
    problems = []
    for n, amount in enumerate(INTEGERS):
        case = f"integer-{n}"
        command = sender.command(case, APPLY, {"key": sender.key(case), "amount": amount})
        problems += [f"amount {amount}: {p}" for p in await _exchange(probe, command, "success")]
    results.append(_result("integers from -2^63 to 2^64-1 accepted", "12", problems))
    return results


async def _new_reply_topic(probe: Probe, sender: Sender, topic: str) -> CaseResult:
    """Section 1: a participant creates a ``ce_replyto`` topic it has not seen, with the
    protocol's partition count, and goes on answering."""
    command = sender.command("new-topic", APPLY, {"key": sender.key("new-topic")})
    await probe.send(*encode(command.model_copy(update={"reply_to": topic})))
    reply, missing = await probe.reply_on_new_topic(topic, command.command_id)
    problems = [missing] if reply is None else reply.expect("success", applied=1)
    if reply is not None and reply.partitions != probe.partitions[probe.inbox_topic]:
        problems.append(
            f"{topic} has {reply.partitions} partitions, want the inbox's "
            f"{probe.partitions[probe.inbox_topic]}"
        )
    after = sender.command("after-new-topic", APPLY, {"key": sender.key("after-new-topic")})
    problems += [f"afterwards: {p}" for p in await _exchange(probe, after, "success", applied=1)]
    return _result(NEW_TOPIC_CASE, "1 (topic creation)", problems)


async def _exchange(
    probe: Probe, command: Any, outcome: str, *, or_empty: bool = False, **payload: int
) -> list[str]:
    """Sends ``command``, waits for its reply; the problems with it."""
    await probe.send(*encode(command))
    replies, _ = await probe.collect({command.command_id}, set())
    got = replies.get(command.command_id, [])
    if not got:
        return [f"{command.subject} {command.command_id}: no reply"]
    problems = got[0].expect(outcome, or_empty=or_empty, **payload)
    return [f"{command.subject}: {p}" for p in problems]
