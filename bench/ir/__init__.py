"""The workloads ``bench/instructions.py`` counts the instructions of: one module per
figure, each ``run(n, ...)`` doing ``n`` units of its work and returning how many of
its own units (sagas, commands, events) that was. ``python -m bench.ir WORKLOAD N``
runs one in a fresh process (what callgrind measures); the unit test runs them in
process at a tiny N."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

#: Each workload: its module and function, and whether it reads the fixture
#: (``bench.ir.fixtures``). Imported only when run, so that a process measures its own.
WORKLOADS: dict[str, tuple[str, str, bool]] = {
    "decision_core": ("bench.ir.decision_core", "run", False),
    "coroutine_floor": ("bench.ir.coroutine_floor", "run", False),
    "engine_path": ("bench.ir.engine_path", "run", False),
    "participant": ("bench.ir.participant", "run", True),
    "read": ("bench.ir.replay", "read", True),
    "replay": ("bench.ir.replay", "replay", True),
    "insights": ("bench.ir.insights", "run", True),
    "wire": ("bench.ir.wire", "run", False),
    "reply_decode": ("bench.ir.reply_decode", "timed", False),
    "reply_decode_untimed": ("bench.ir.reply_decode", "untimed", False),
    "memory": ("bench.ir.memory", "run", False),
}


def run_workload(name: str, n: int, fixture: Path | None = None) -> dict[str, Any]:
    """Runs workload ``name`` at ``n``: ``{"units": ...}``, or the memory figures."""
    module, function, reads = WORKLOADS[name]
    fn = getattr(importlib.import_module(module), function)
    if reads:
        if fixture is None:
            raise ValueError(f"the {name} workload reads a fixture (bench.ir.fixtures.write)")
        result = fn(n, fixture)
    else:
        result = fn(n)
    return result if isinstance(result, dict) else {"units": result}
