"""The admin's board of participants' step reports (``tx.progress``, issue 41 §5): the
latest reports per running step, bounded in items, steps, sagas and age; and the
record's decoding, which drops what is oversized or malformed."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from saga_engine.admin._step_board import StepProgressBoard
from saga_engine.kernel._settings import KafkaSettings
from saga_engine.transport._step_progress import (
    STEP_PROGRESS_MAX_BYTES,
    StepProgressRecord,
    UnreadableProgress,
    decode_step_progress,
    encode_step_progress,
)
from saga_engine.transport._step_progress_feed import StepProgressFeed


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def rec(
    seq: int, *, saga: str = "s-1", command: str = "c-1", attempt: int = 1, body: Any = None
) -> StepProgressRecord:
    return StepProgressRecord(
        saga_id=saga,
        command_id=command,
        step="reserve",
        attempt=attempt,
        seq=seq,
        at=datetime(2026, 1, 1, tzinfo=UTC),
        body={"done": seq} if body is None else body,
    )


def seqs(board: StepProgressBoard, saga: str = "s-1") -> list[tuple[str, int, int]]:
    return [(r.command_id, r.attempt, r.seq) for r in board.reports(saga)]


def test_it_keeps_the_latest_items_per_step_in_order() -> None:
    board = StepProgressBoard(items_per_step=3)
    for seq in range(1, 6):
        assert board.add(rec(seq))
    assert seqs(board) == [("c-1", 1, 3), ("c-1", 1, 4), ("c-1", 1, 5)]
    assert board.reports("s-1")[-1].body == {"done": 5}


def test_a_duplicate_or_older_report_is_stale_and_a_new_run_starts_afresh() -> None:
    board = StepProgressBoard()
    assert board.add(rec(1))
    assert board.add(rec(2))
    assert board.add(rec(3))
    assert not board.add(rec(3))  # the same again
    assert not board.add(rec(2))  # an earlier one
    assert board.add(rec(1, attempt=2))  # the handler ran again: its reports replace
    assert not board.add(rec(9, attempt=1))  # a late report of the earlier attempt
    assert seqs(board) == [("c-1", 2, 1)]
    assert board.add(rec(2, attempt=2))
    # Numbered from 1 again: the same attempt run again (a crash, an outage retried; a
    # redelivery elsewhere counts attempts from 1 again): a new run.
    assert board.add(rec(1, attempt=1))
    assert seqs(board) == [("c-1", 1, 1)]
    assert board.stats["step_progress_stale"] == 3


def test_steps_per_saga_and_sagas_are_bounded_oldest_out() -> None:
    board = StepProgressBoard(steps_per_saga=2, max_sagas=2)
    for command in ("a", "b", "c"):
        board.add(rec(1, command=command))
    assert [c for c, _, _ in seqs(board)] == ["b", "c"]
    board.add(rec(1, saga="s-2"))
    board.add(rec(2, command="b"))  # s-1 reported on last: s-2 is the oldest now
    board.add(rec(1, saga="s-3"))
    assert board.reports("s-2") == []
    assert len(board) == 2
    assert board.stats["step_progress_evicted"] == 2


def test_a_step_not_reported_on_for_the_ttl_is_gone() -> None:
    clock = Clock()
    board = StepProgressBoard(ttl_s=10, clock=clock)
    board.add(rec(1, command="old"))
    clock.now = 8
    board.add(rec(1, command="new"))
    clock.now = 12
    assert [c for c, _, _ in seqs(board)] == ["new"]
    clock.now = 30
    assert board.reports("s-1") == []
    assert len(board) == 0
    board.add(rec(1, command="old"))  # an expired step's numbers start again
    assert seqs(board) == [("old", 1, 1)]


def test_retain_and_drop_forget_what_no_longer_runs() -> None:
    board = StepProgressBoard()
    for command in ("a", "b", "c"):
        board.add(rec(1, command=command))
    board.retain("s-1", {"b", "c"})
    assert [c for c, _, _ in seqs(board)] == ["b", "c"]
    board.drop("s-1", ["b", "unknown"])
    assert [c for c, _, _ in seqs(board)] == ["c"]
    board.retain("s-1", set())
    assert len(board) == 0
    board.retain("no-such-saga", set())
    board.drop("no-such-saga", ["x"])


async def test_a_reader_waiting_for_a_saga_wakes_on_its_report_only() -> None:
    board = StepProgressBoard()
    assert not await board.changed("s-1", 0.01)  # nothing came
    waiting = asyncio.create_task(board.changed("s-1", 30))
    other = asyncio.create_task(board.changed("s-2", 0.05))
    await asyncio.sleep(0)
    board.add(rec(1, saga="s-2"))
    assert await other
    assert not waiting.done()
    board.add(rec(1))
    assert await waiting
    assert board._waiters == {}


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        StepProgressBoard(items_per_step=0)
    with pytest.raises(ValueError, match="ttl_s"):
        StepProgressBoard(ttl_s=0)


# --------------------------------------------------------------------------- the record


def test_a_record_round_trips() -> None:
    value = encode_step_progress(
        saga_id="s-1", command_id="c-1", step="reserve", attempt=2, seq=3, body={"pct": 40}
    )
    record = decode_step_progress(value)
    assert (record.saga_id, record.command_id, record.step) == ("s-1", "c-1", "reserve")
    assert (record.attempt, record.seq, record.body) == (2, 3, {"pct": 40})
    assert orjson.loads(value)["at"].endswith("Z")


def test_a_report_over_the_limit_or_not_json_is_refused_when_encoded() -> None:
    with pytest.raises(ValueError, match="over 8192"):
        encode_step_progress(
            saga_id="s", command_id="c", step="", attempt=1, seq=1, body="x" * 9000
        )
    with pytest.raises(TypeError):
        encode_step_progress(saga_id="s", command_id="c", step="", attempt=1, seq=1, body={1j})


GOOD: dict[str, Any] = {
    "saga_id": "s-1",
    "command_id": "c-1",
    "step": "reserve",
    "attempt": 1,
    "seq": 1,
    "at": "2026-01-01T00:00:00Z",
    "body": {"pct": 1},
}


@pytest.mark.parametrize(
    ("value", "reason", "says"),
    [
        (None, "malformed", "no value"),
        (b"", "malformed", "not JSON"),
        (b"{not json", "malformed", "not JSON"),
        (b"[" * 2000 + b"]" * 2000, "malformed", "not JSON"),
        (b"[1, 2]", "malformed", "value"),
        (orjson.dumps({**GOOD, "extra": 1}), "malformed", "extra"),
        (orjson.dumps({**GOOD, "seq": 0}), "malformed", "seq"),
        (orjson.dumps({**GOOD, "attempt": "one"}), "malformed", "attempt"),
        (orjson.dumps({**GOOD, "saga_id": ""}), "malformed", "saga_id"),
        (orjson.dumps({**GOOD, "saga_id": "s" * 201}), "malformed", "saga_id"),
        (orjson.dumps({**GOOD, "at": "yesterday"}), "malformed", "at"),
        (
            orjson.dumps({k: v for k, v in GOOD.items() if k != "command_id"}),
            "malformed",
            "command_id",
        ),
        (b" " * (STEP_PROGRESS_MAX_BYTES + 1), "oversized", "over 8192"),
        (orjson.dumps({**GOOD, "body": "x" * STEP_PROGRESS_MAX_BYTES}), "oversized", "bytes"),
    ],
)
def test_a_hostile_record_is_unreadable_with_its_reason(
    value: bytes | None, reason: str, says: str
) -> None:
    with pytest.raises(UnreadableProgress, match=says) as caught:
        decode_step_progress(value)
    assert caught.value.reason == reason


def test_the_feed_drops_and_counts_hostile_records_and_keeps_reading(
    caplog: pytest.LogCaptureFixture,
) -> None:
    board = StepProgressBoard()
    feed = StepProgressFeed(KafkaSettings(), board.add)
    for value in (None, b"junk", b"x" * (STEP_PROGRESS_MAX_BYTES + 1), b"{}", orjson.dumps(GOOD)):
        feed.take(value)
    assert feed.stats == {
        "step_progress_dropped_malformed": 3,
        "step_progress_dropped_oversized": 1,
        "step_progress_read": 1,
    }
    assert seqs(board) == [("c-1", 1, 1)]
    # Logged once per reason a minute, not once per record.
    assert len([r for r in caplog.records if "dropped" in r.getMessage()]) == 2

    def broken(record: StepProgressRecord) -> None:
        raise RuntimeError("a bug in the sink")

    failing = StepProgressFeed(KafkaSettings(), broken)
    failing.take(orjson.dumps(GOOD))
    assert failing.stats == {"step_progress_dropped_sink": 1}


def test_the_protocols_example_record_is_read_and_its_limit_is_the_codes() -> None:
    text = (Path(__file__).resolve().parents[3] / "proto" / "PROTOCOL.md").read_text()
    example = text.split("<!-- schema: progress.schema.json -->\n```json\n", 1)[1].split(
        "\n```", 1
    )[0]
    record = decode_step_progress(example.encode())
    assert (record.attempt, record.seq, record.body) == (1, 3, {"reserved": 12, "of": 40})
    assert f"**{STEP_PROGRESS_MAX_BYTES} bytes**" in text
    assert (
        "const ProgressMaxBytes = 8192"
        in (Path(__file__).resolve().parents[3] / "kits" / "go" / "progress.go").read_text()
    )


def test_the_bytes_kept_are_bounded_and_counted_back_as_reports_go() -> None:
    board = StepProgressBoard(max_bytes=4000, items_per_step=2)
    big = "x" * 1000  # about 1,258 bytes a report
    board.add(rec(1, saga="old", body=big))
    board.add(rec(1, saga="s-1", body=big))
    board.add(rec(2, saga="s-1", body=big))
    assert len(board) == 2
    board.add(rec(1, saga="new", body=big))  # over the budget: the oldest saga goes
    assert board.reports("old") == []
    assert len(board) == 2
    board.add(rec(3, saga="s-1", body="small"))  # its first report leaves (2 a step)
    board.add(rec(1, saga="s-1", command="c-2", body="small"))
    before = board.bytes
    board.drop("s-1", ["c-2"])
    assert board.bytes < before
    board.retain("s-1", set())
    board.retain("new", set())
    assert (len(board), board.bytes) == (0, 0)  # every byte counted back


def test_a_new_attempt_and_an_expired_step_give_their_bytes_back() -> None:
    clock = Clock()
    board = StepProgressBoard(ttl_s=10, clock=clock)
    board.add(rec(1, body="x" * 500))
    board.add(rec(1, attempt=2, body="y"))
    clock.now = 30
    board.add(rec(1, attempt=2, command="c-2", body="z"))  # c-1 expired meanwhile
    assert [c for c, _, _ in seqs(board)] == ["c-2"]
    board.retain("s-1", set())
    assert board.bytes == 0
