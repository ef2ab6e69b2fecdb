"""bench/shard_move.py without servers: its options (--quick and what overrides it), the
sagas it writes (in the range or not, their decision rows), the deployment it moves in,
and the phases it reads from the mover's progress lines."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from bench.shard_move import (
    MARKS,
    STEPS,
    MoveRun,
    decisions,
    deployment,
    moving_range,
    parse_args,
    phases,
    saga_ids,
)
from saga_engine.events import SagaCompleted, SagaStarted
from saga_engine.kernel._partitioning import partition_for


def test_the_defaults_move_100_000_sagas_in_batches_of_2000() -> None:
    args = parse_args([])
    assert (args.sagas, args.others, args.batch, args.partitions) == (100_000, 10_000, [2000], 8)
    assert args.second_cluster is None


def test_quick_shortens_what_is_not_given() -> None:
    quick = parse_args(["--quick"])
    assert (quick.sagas, quick.others, quick.batch) == (5000, 500, [2000])
    given = parse_args(["--quick", "--sagas", "300", "--others", "0", "--batch", "100", "50"])
    assert (given.sagas, given.others, given.batch) == (300, 0, [100, 50])


@pytest.mark.parametrize(
    "argv",
    [["--sagas", "0"], ["--others", "-1"], ["--batch", "0"], ["--partitions", "1"]],
)
def test_bad_options_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert argv[0] in capsys.readouterr().err


def test_the_ids_fall_in_the_range_or_out_of_it_as_asked() -> None:
    moving = moving_range(8)
    assert moving == frozenset({4, 5, 6, 7})
    inside, outside = saga_ids("r", 50, 7, moving, 8)
    assert (len(inside), len(outside), len(set(inside) | set(outside))) == (50, 7, 57)
    assert all(partition_for(i, 8) in moving for i in inside)
    assert not any(partition_for(i, 8) in moving for i in outside)


def test_two_thirds_finish_the_rest_stay_open_at_a_step() -> None:
    at = datetime.now(UTC)
    shapes = [decisions(f"s{n}", n, at) for n in range(30)]
    finished = [rows for rows in shapes if isinstance(rows[-1][-1], SagaCompleted)]
    assert len(finished) == 20
    assert all(len(rows) == len(STEPS) + 1 for rows in finished)
    assert {len(rows) for rows in shapes if rows not in finished} == {1, 2, 3}
    assert all(isinstance(rows[0][0], SagaStarted) for rows in shapes)
    assert all(len(row) == 2 for rows in shapes for row in rows)  # one row per decision


def test_the_deployment_puts_every_partition_on_a_and_none_on_b() -> None:
    settings = deployment("postgresql://u@h1/x", "postgresql://u@h2/x", 8)
    shard_map = settings.shard_map()
    assert shard_map is not None
    assert shard_map.ranges() == {"a": "0-7", "b": ""}
    assert settings.pg.control_dsn is not None
    assert settings.pg.control_dsn.get_secret_value() == "postgresql://u@h1/x"


def test_the_phases_run_from_mark_to_mark_the_copy_to_its_last_batch() -> None:
    lines = [
        "recorded the move of partitions 4-7",
        "paused partitions 4-7 on a",
        "copied 2000/4000 sagas (5000 decision rows)",
        "copied 4000/4000 sagas (10000 decision rows)",
        "verified 4000 sagas on 'b'",
        "committed: the shard map is at epoch 2",
        "released partitions 4-7 on a",
        "deleted 4000 sagas' rows of partitions 4-7",
        "done: partitions 4-7 are on 'b'",
    ]
    run = MoveRun(2000, "a", "b")
    run.marks = [(10.0 + i, line) for i, line in enumerate(lines)]
    assert phases(run.marks, 9.5) == {
        "record_s": 0.5,
        "pause_s": 1.0,
        "copy_s": 2.0,
        "verify_s": 1.0,
        "commit_s": 1.0,
        "release_s": 1.0,
        "delete_s": 1.0,
        "clear_s": 1.0,
    }
    assert phases(run.marks[:2], 9.5)["copy_s"] is None
    assert [phase for _, phase in MARKS][-1] == "clear_s"
