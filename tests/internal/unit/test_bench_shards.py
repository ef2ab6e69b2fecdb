"""bench/shards.py without servers: its options (--quick and what overrides it), the
engine's sharded settings and the driver's routing agree with the store's, and the JSON
it prints: each mode's medians over the rounds, per cluster too, and two over one."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.e2e import Processes, Resources
from bench.shards import (
    FIGURES,
    SPLITS,
    Cluster,
    ShardedRun,
    figures,
    parse_args,
    run_config,
    summarize,
    with_application,
    with_database,
)
from saga_engine import Settings
from saga_engine.protocol import partition_for


def test_the_defaults_are_e2e_s_load_in_two_rounds() -> None:
    args = parse_args([])
    assert (args.in_flight, args.load_seconds, args.rounds, args.probe) == (512, 30.0, 2, 20)
    assert args.partitions == 8
    assert args.second_cluster is None


def test_quick_shortens_what_is_not_given() -> None:
    quick = parse_args(["--quick"])
    assert (quick.load_seconds, quick.rounds, quick.probe) == (5.0, 1, 5)
    given = parse_args(["--quick", "--rounds", "3", "--load-seconds", "8"])
    assert (given.load_seconds, given.rounds, given.probe) == (8.0, 3, 5)


@pytest.mark.parametrize(
    "argv",
    [["--rounds", "0"], ["--in-flight", "0"], ["--load-seconds", "0"], ["--partitions", "1"]],
)
def test_bad_options_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert argv[0] in capsys.readouterr().err


def _sharded_run(tmp_path: Path, partitions: int) -> ShardedRun:
    cfg = run_config(parse_args(["--partitions", str(partitions)]))
    res = Resources("postgresql://u@h1:5432/saga", "127.0.0.1:9092")
    clusters = [
        Cluster("1", "postgresql://u@h1:5432/saga", 10),
        Cluster("2", "postgresql://u@h2:5433/saga", 20),
    ]
    return ShardedRun(cfg, res, Processes(), tmp_path, "t1", clusters)


def test_the_engine_s_settings_shard_the_store_as_the_driver_routes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _sharded_run(tmp_path, partitions=6)
    for key, value in run._env().items():
        if key.startswith("SAGA_"):
            monkeypatch.setenv(key, value)
    settings = Settings()
    shards = {s.name: s for s in settings.pg.shards}
    assert {n: s.partitions for n, s in shards.items()} == {"a": "0-2", "b": "3-5"}
    # Each process's connections named, so that each backend's CPU says whose it is.
    engine, participants = "application_name=bench-engine", "application_name=bench-participants"
    assert shards["a"].dsn.get_secret_value() == f"postgresql://u@h1:5432/bench_t1?{engine}"
    assert shards["b"].dsn.get_secret_value() == f"postgresql://u@h2:5433/bench_t1?{engine}"
    assert settings.pg.control_dsn is not None
    assert settings.pg.control_dsn.get_secret_value() == f"postgresql://u@h1:5432/saga?{engine}"
    assert (
        settings.participant.dsn.get_secret_value() == f"postgresql://u@h1:5432/saga?{participants}"
    )
    shard_map = settings.shard_map()
    assert shard_map is not None
    ids = [f"saga-{i}" for i in range(200)]
    routed = run._by_shard(ids)
    assert sorted(routed) == ["a", "b"]
    for name, group in routed.items():
        for saga_id in group:
            assert shard_map.shard_of_saga(saga_id) == name
            assert partition_for(saga_id, 6) in run.shards[name].partitions


def test_with_database_and_application_keep_the_server_and_its_options() -> None:
    dsn = "postgresql://u:p@h:5/saga?sslmode=disable"
    assert with_database(dsn, "postgres") == "postgresql://u:p@h:5/postgres?sslmode=disable"
    assert (
        with_application(dsn, "x") == "postgresql://u:p@h:5/saga?sslmode=disable&application_name=x"
    )
    assert with_application("postgresql://h/saga", "x") == "postgresql://h/saga?application_name=x"


def _run(sagas_per_s: float, pg: dict[str, float], wal: dict[str, float]) -> dict[str, object]:
    total = sum(pg.values())
    return {
        "sagas": 1000,
        "sagas_per_s": sagas_per_s,
        "engine_cpu_ms_per_saga": 1.0,
        "participant_cpu_ms_per_saga": 0.5,
        "postgres_cpu_ms_per_saga": total,
        "postgres_cpu_ms_per_saga_by_cluster": pg,
        "postgres_cpu_ms_per_saga_by_role": {"engine": total - 0.1, "driver": 0.1},
        "pg_wal_records_per_saga": sum(wal.values()),
        "pg_wal_records_per_saga_by_cluster": wal,
        "latency_ms": {"p50": 700.0},
        "not_a_figure": 1,
    }


def test_the_json_has_each_mode_s_medians_per_cluster_and_two_over_one() -> None:
    one = [
        figures(_run(600, {"1": 0.4, "2": 0.0}, {"1": 50, "2": 0})),
        figures(_run(800, {"1": 0.6, "2": 0.0}, {"1": 52, "2": 0})),
    ]
    two = [
        figures(_run(500, {"1": 0.3, "2": 0.2}, {"1": 34, "2": 17})),
        figures(_run(700, {"1": 0.4, "2": 0.2}, {"1": 36, "2": 17})),
    ]
    out = summarize([{"one": a, "two": b} for a, b in zip(one, two, strict=True)])
    assert set(out) == {"one", "two", "ratio_two_vs_one", "rounds"}
    for mode in ("one", "two"):
        assert set(out[mode]) == {*FIGURES, *SPLITS, "sagas"}
        assert out[mode]["sagas"] == 2000
    assert "not_a_figure" not in one[0]
    assert out["one"]["sagas_per_s"] == 700
    assert out["two"]["sagas_per_s"] == 600
    assert out["one"]["latency_p50_ms"] == 700
    assert out["two"]["postgres_cpu_ms_per_saga_by_cluster"] == {"1": 0.35, "2": 0.2}
    assert out["two"]["pg_wal_records_per_saga_by_cluster"] == {"1": 35, "2": 17}
    assert out["two"]["postgres_cpu_ms_per_saga_by_role"] == {"engine": 0.45, "driver": 0.1}
    ratios = out["ratio_two_vs_one"]
    assert set(ratios) == {*FIGURES, "postgres_cpu_ms_per_saga_by_role"}
    assert ratios["postgres_cpu_ms_per_saga_by_role"] == {"engine": 1.125, "driver": 1.0}
    assert ratios["sagas_per_s"] == round(600 / 700, 4)
    assert ratios["postgres_cpu_ms_per_saga"] == round(0.55 / 0.5, 4)
    assert ratios["kafka_cpu_ms_per_saga"] is None  # not measured: no ratio
    assert [r["ratio_two_vs_one"]["sagas_per_s"] for r in out["rounds"]] == [
        round(500 / 600, 4),
        round(700 / 800, 4),
    ]
