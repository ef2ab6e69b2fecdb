"""The shard map (kernel/_shards): its text, its checks, a move, its stored form, and the
settings that describe it."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from saga_engine.kernel._errors import ShardMapError
from saga_engine.kernel._partitioning import partition_for
from saga_engine.kernel._settings import Settings
from saga_engine.kernel._shards import ShardMap, format_partitions, parse_partitions


@given(st.sets(st.integers(min_value=0, max_value=63)))
def test_partitions_text_reads_back_as_written(partitions: set[int]) -> None:
    text = format_partitions(partitions)
    assert parse_partitions(text, 64) == partitions
    assert text == format_partitions(parse_partitions(text, 64))


def test_partitions_text_is_ranges_and_singles() -> None:
    assert format_partitions([0, 1, 2, 3, 7, 9, 10]) == "0-3,7,9-10"
    assert parse_partitions(" 0-2 , 5 ", 8) == {0, 1, 2, 5}
    assert parse_partitions("", 8) == frozenset()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("0-x", "cannot read '0-x'"),
        ("3-1", "ends before it starts"),
        ("0-8", "partition 8 does not exist: the inbox has 8 partitions"),
        ("0,,2", "empty range"),
    ],
)
def test_unreadable_partitions_are_named(text: str, says: str) -> None:
    with pytest.raises(ShardMapError, match=says):
        parse_partitions(text, 8, shard="a")


def test_a_map_routes_each_saga_by_its_inbox_partition() -> None:
    shard_map = ShardMap.build({"a": "0-3", "b": "4-7"}, 8)
    for saga_id in (f"saga-{i}" for i in range(200)):
        expected = "a" if partition_for(saga_id, 8) < 4 else "b"
        assert shard_map.shard_of_saga(saga_id) == expected
    assert shard_map.by_shard([1, 5, 6]) == {"a": {1}, "b": {5, 6}}
    assert shard_map.partitions_of("b") == {4, 5, 6, 7}


@pytest.mark.parametrize(
    ("ranges", "says"),
    [
        ({"a": "0-3", "b": "3-7"}, "partition 3 is given to two shards, 'a' and 'b'"),
        ({"a": "0-3", "b": "5-6"}, "partitions 4,7 belong to no shard"),
        ({"A": "0-7"}, "shard name 'A' is not valid"),
        ({}, "at least one shard"),
    ],
)
def test_a_map_that_cannot_work_is_refused_naming_the_fault(
    ranges: dict[str, str], says: str
) -> None:
    with pytest.raises(ShardMapError, match=says):
        ShardMap.build(ranges, 8)


def test_a_shard_may_hold_nothing_until_a_range_moves_to_it() -> None:
    shard_map = ShardMap.build({"a": "0-7", "c": ""}, 8)
    moved = shard_map.moved(range(6, 8), "c")
    assert moved.epoch == 2
    assert moved.ranges() == {"a": "0-5", "c": "6-7"}
    assert shard_map.ranges() == {"a": "0-7", "c": ""}  # the old map is untouched


@pytest.mark.parametrize(
    ("partitions", "to", "says"),
    [
        ([6, 7], "z", "no shard is named 'z'"),
        ([8], "c", "partitions 8 do not exist"),
        ([0, 1], "a", "already on shard 'a'"),
        ([], "c", "already on shard 'c'"),
    ],
)
def test_a_move_that_cannot_happen_is_refused(partitions: list[int], to: str, says: str) -> None:
    with pytest.raises(ShardMapError, match=says):
        ShardMap.build({"a": "0-7", "c": ""}, 8).moved(partitions, to)


@given(
    st.lists(st.integers(min_value=0, max_value=2), min_size=16, max_size=16),
    st.sets(st.integers(min_value=0, max_value=15), min_size=1),
    st.sampled_from(["a", "b", "c"]),
)
def test_every_partition_keeps_one_shard_through_moves(
    owners: list[int], moving: set[int], to: str
) -> None:
    names = ["a", "b", "c"]
    ranges = {n: format_partitions(p for p, o in enumerate(owners) if names[o] == n) for n in names}
    shard_map = ShardMap.build(ranges, 16)
    if all(shard_map.shard_of_partition(p) == to for p in moving):
        return
    moved = shard_map.moved(moving, to)
    assert ShardMap.from_data(json.loads(json.dumps(moved.to_data()))) == moved
    for p in range(16):
        assert moved.shard_of_partition(p) == (
            to if p in moving else shard_map.shard_of_partition(p)
        )


def test_a_stored_map_that_is_not_readable_is_refused() -> None:
    with pytest.raises(ShardMapError, match="not readable"):
        ShardMap.from_data({"epoch": 3})
    with pytest.raises(ShardMapError, match="belong to no shard"):
        ShardMap.from_data({"epoch": 3, "partitions": 8, "shards": {"a": "0-6"}})


def _shards(*specs: tuple[str, str]) -> str:
    return json.dumps(
        [{"name": n, "partitions": p, "dsn": f"postgresql://db/{n}"} for n, p in specs]
    )


def test_settings_describe_the_map_and_keep_the_addresses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SAGA_PG__SHARDS", _shards(("a", "0-3"), ("b", "4-7")))
    monkeypatch.setenv("SAGA_PG__CONTROL_DSN", "postgresql://db/control")
    settings = Settings()
    assert settings.shard_map() == ShardMap.build({"a": "0-3", "b": "4-7"}, 8)
    assert settings.pg.shard_dsn("b") == "postgresql://db/b"
    with pytest.raises(ShardMapError, match="no shard is named 'z'"):
        settings.pg.shard_dsn("z")
    assert "postgresql://db/b" not in repr(settings)  # addresses are secrets


def test_one_database_has_no_map() -> None:
    assert Settings().shard_map() is None


@pytest.mark.parametrize(
    ("shards", "control", "says"),
    [
        (_shards(("a", "0-3"), ("b", "4-7")), None, "needs SAGA_PG__CONTROL_DSN"),
        (_shards(("a", "0-3"), ("b", "3-7")), "postgresql://c", "given to two shards"),
        (_shards(("a", "0-3"), ("a", "4-7")), "postgresql://c", "names a shard twice"),
        (_shards(("a", "0-3")), "postgresql://c", "partitions 4-7 belong to no shard"),
        (_shards(("A", "0-7")), "postgresql://c", "String should match pattern"),
    ],
)
def test_settings_that_cannot_make_a_map_are_refused(
    monkeypatch: pytest.MonkeyPatch, shards: str, control: str | None, says: str
) -> None:
    monkeypatch.setenv("SAGA_PG__SHARDS", shards)
    if control is not None:
        monkeypatch.setenv("SAGA_PG__CONTROL_DSN", control)
    else:
        monkeypatch.delenv("SAGA_PG__CONTROL_DSN", raising=False)
    with pytest.raises(ValidationError, match=says):
        Settings()


def test_settings_point_at_the_control_database_and_at_each_shard(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings().pg.control() == Settings().pg  # one database: the same settings
    monkeypatch.setenv("SAGA_PG__SHARDS", _shards(("a", "0-3"), ("b", "4-7")))
    monkeypatch.setenv("SAGA_PG__CONTROL_DSN", "postgresql://db/control")
    monkeypatch.setenv("SAGA_PG__POOL_MAX_SIZE", "7")
    pg = Settings().pg
    control, shard_b = pg.control(), pg.of_shard("b")
    assert control.dsn.get_secret_value() == "postgresql://db/control"
    assert shard_b.dsn.get_secret_value() == "postgresql://db/b"
    assert control.shards == shard_b.shards == ()
    assert control.pool_max_size == shard_b.pool_max_size == 7
