"""bench/scheduler.py, run small: it prints its phases' figures and the adaptive limit's
samples as JSON, every command it started answered; and what it calls converged."""

from __future__ import annotations

import json

import pytest

from bench.scheduler import arrivals, converged_after, main, parse

_SMALL = {
    "phase-seconds": 1,
    "light-rate": 20,
    "light-ms": 2,
    "heavy-ms": 20,
    "burst": 4,
    "burst-every": 0.5,
    "cores": 4,
    "adaptive-seconds": 2,
    "adaptive-change-at": 1,
    "adaptive-cores": 4,
    "adaptive-ms": 10,
    "adaptive-in-flight": 12,
    "sample-ms": 50,
    "hold-s": 0.2,
}
TINY = [arg for name, value in _SMALL.items() for arg in (f"--{name}", str(value))]


def test_the_bench_prints_every_phase_and_the_limit_over_time(
    capsys: pytest.CaptureFixture[str],
) -> None:
    result = main(TINY)
    printed = json.loads(capsys.readouterr().out)
    assert printed == result
    plan = arrivals(parse(TINY))
    lights = sum(1 for _, kind in plan if kind == "light")
    heavies = len(plan) - lights
    budgets = printed["budgets"]
    assert list(budgets["phases"]) == [
        "light_alone",
        "mix_no_budget",
        "mix_budget",
        "mix_budget_fair",
        "mix_budget_headroom",
    ]
    for name, phase in budgets["phases"].items():
        # Every light step measured, and each of its parts.
        for part in ("step_ms", "held_ms", "participant_ms", "after_ms"):
            assert phase["light"][part]["n"] == lights, (name, part)
        assert ("heavy" in phase) is (name != "light_alone")
        if name != "light_alone":
            assert phase["heavy"]["step_ms"]["n"] == heavies
        assert budgets["light_p99_vs_alone"][name] == phase["light_p99_vs_alone"]
    assert budgets["light_p99_vs_alone"]["light_alone"] == 1.0
    config = budgets["phases"]["mix_budget_headroom"]["config"]
    assert config["limits"]["participants"]["encoder"]["budget"] == {"cpu": 4}
    assert config["limits"]["saga_types"]["transcode"]["budget"] == {"cpu": 2}
    # Both algorithms, side by side.
    assert list(printed["adaptive"]) == ["gradient", "aimd"]
    for algorithm, adaptive in printed["adaptive"].items():
        assert adaptive["status"] == "ran"
        assert adaptive["algorithm"] == algorithm
        assert adaptive["best_concurrency"] == {"before": 4, "after": 2}
        cores = [c for _, _, c in adaptive["limit_each_second"]]
        assert cores[0] == 4  # halved mid-run
        assert cores[-1] == 2
        assert all(1 <= limit <= 1000 for _, limit, _, _ in adaptive["samples"])


def _samples(limits: list[int], causes: dict[int, str] | None = None) -> list[dict[str, object]]:
    causes = causes or {}
    return [
        {"t": float(i), "limit": v, "cause": causes.get(i, "latency_held")}
        for i, v in enumerate(limits)
    ]


def test_converged_means_within_the_band_and_staying_there() -> None:
    # Within ±20 % of 10 from t=3 on, for the 2 s asked; a dip at t=2 does not count.
    assert converged_after(_samples([30, 20, 5, 11, 9, 10, 10]), 0, 10, hold_s=2) == 3.0
    # Measured from the change.
    assert converged_after(_samples([30, 20, 5, 11, 9, 10, 10]), 1, 10, hold_s=2) == 2.0
    # Leaving the band within the hold: the next entry counts.
    assert converged_after(_samples([10, 30, 10, 10, 10]), 0, 10, hold_s=2) == 2.0
    # A probe's dip is left out; too little run left to say it stays: None.
    assert converged_after(_samples([10, 4, 10, 10], {1: "probe"}), 0, 10, hold_s=2) == 0.0
    assert converged_after(_samples([30, 30, 10]), 0, 10, hold_s=2) is None
