"""bench/instructions.py's workloads (bench/ir), run here at a tiny N without valgrind, so
that they cannot rot: each does its work on today's code and counts its units as the
figures divide by them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.instructions import FIGURES, per_unit, total_ir
from bench.ir import WORKLOADS, fixtures, run_workload

#: Events of a saga that completes (start, 3 x command and reply, completed) and of one
#: that fails at its third step and compensates its first two.
COMPLETES, FAILS = 8, 15


@pytest.fixture(scope="module")
def fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fixtures.write(tmp_path_factory.mktemp("ir") / "fixture.json", 6, batch=2)


def test_every_figure_has_a_workload() -> None:
    assert {f.workload for f in FIGURES} | {"memory"} == set(WORKLOADS)


@pytest.mark.parametrize("name", ["decision_core", "coroutine_floor", "engine_path"])
def test_the_saga_workloads_drive_each_saga_to_its_end(name: str) -> None:
    # Each raises if a saga does not end completed or compensated.
    assert run_workload(name, 3) == {"units": 3}


def test_the_participant_answers_every_command_of_the_waves(fixture: Path) -> None:
    # 2 sagas that complete (3 commands) and 2 that fail (3 and 2 compensations); the
    # workload raises unless every command got its reply.
    assert run_workload("participant", 4, fixture) == {"units": 2 * 3 + 2 * 5}


def test_the_waves_are_what_a_participant_reads_of_sagas_in_flight() -> None:
    waves = fixtures.command_batches(4, batch=2)

    def steps(wave: list[list[Any]]) -> set[tuple[str, str]]:
        return {(dict(r[3])["ce_step"], dict(r[3]).get("ce_compensation", "")) for r in wave}

    forward, undo = "", "true"
    assert [steps(w) for w in waves] == [
        {("a", forward)},
        {("b", forward)},
        {("c", forward)},
        {("b", undo)},
        {("a", undo)},
    ] * 2
    assert [len(w) for w in waves] == [2, 2, 2, 1, 1] * 2


def test_read_and_replay_count_the_same_events(fixture: Path) -> None:
    events = 2 * COMPLETES + 2 * FAILS
    assert run_workload("read", 4, fixture) == {"units": events}
    assert run_workload("replay", 4, fixture) == {"units": events}


def test_a_workload_that_reads_the_fixture_says_so_without_it() -> None:
    with pytest.raises(ValueError, match="reads a fixture"):
        run_workload("replay", 1)


def test_memory_counts_what_the_resident_sagas_hold() -> None:
    result = run_workload("memory", 20)
    assert result["sagas"] == 20
    assert 0 < result["bytes_per_resident_saga"] < result["with_history_bytes_per_saga"]
    # The bare coroutine holds the saga's models and its wait, and nothing of the runtime.
    assert 0 < result["floor_bytes_per_resident_saga"] < result["bytes_per_resident_saga"]


def test_a_figure_is_the_difference_of_two_run_lengths(tmp_path: Path) -> None:
    out = tmp_path / "callgrind.out"
    out.write_text("version: 1\ncmd: python\nevents: Ir\nfn=x\n0 5\ntotals: 1234567\n")
    assert total_ir(out) == 1_234_567
    small = {"n": 10, "units": 40, "instructions": 1_000_000}
    large = {"n": 30, "units": 120, "instructions": 1_800_000}
    assert per_unit(small, large) == 10_000
    with pytest.raises(RuntimeError, match="no more work"):
        per_unit(large, large)


def test_the_wire_encodes_and_decodes_each_record() -> None:
    # Raises unless each reply read back answers the command read back.
    assert run_workload("wire", 5) == {"units": 5}


def test_the_reply_decodes_differ_only_by_the_timing_headers() -> None:
    from bench.ir.reply_decode import reply

    _, _, timed = reply(timed=True)
    _, _, untimed = reply(timed=False)
    extra = {name for name, _ in timed} - {name for name, _ in untimed}
    assert extra == {
        "ce_receivedtime",
        "ce_handlerstarttime",
        "ce_handlerendtime",
        "ce_committime",
        "ce_handlercpums",
    }
    assert len(untimed) == len(timed) - len(extra)
    assert run_workload("reply_decode", 3) == {"units": 3}
    assert run_workload("reply_decode_untimed", 3) == {"units": 3}
