"""Replay: each saga's stored history read back and the saga rebuilt from it, as an
engine does for a saga it does not hold. **Read**: each event's row as the Postgres
store's read path takes it (the jsonb column's bytes decoded by the store's type codec,
then ``_stored_events``: a ``StoredEvent`` of each, its event validated); **rebuild**:
``SagaRuntime.replay`` runs the saga's code against its events. The workload ``read``
does the first only and ``replay`` both, so rebuild is their difference. Unit: an event.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.ir import fixtures
from bench.ir.shape import definitions, saga_id
from saga_engine.core.runtime._runtime import SagaRuntime
from saga_engine.store._pgbase import _decode_jsonb, _stored_events


def rows(fixture: dict[str, Any], n: int) -> list[list[tuple[int, bytes]]]:
    """The first ``n`` sagas' rows: ``(seq, jsonb bytes)`` each, as Postgres sends them."""
    return [
        [(seq, b"\x01" + text.encode()) for seq, text in enumerate(history, 1)]
        for history in fixture["histories"][:n]
    ]


def _read(raw: list[tuple[int, bytes]]) -> list[Any]:
    pairs = [(seq, _decode_jsonb(data)) for seq, data in raw]
    return [s.event for s in _stored_events(pairs, None)]


def read(n: int, fixture_path: Path) -> int:
    events = 0
    for raw in rows(fixtures.read(fixture_path), n):
        events += len(_read(raw))
    return events


def replay(n: int, fixture_path: Path) -> int:
    defs = definitions()
    events = 0
    for k, raw in enumerate(rows(fixtures.read(fixture_path), n)):
        history = _read(raw)
        runtime, _ = SagaRuntime.replay(defs[k % 2], saga_id(k), history)
        if not runtime.status.is_terminal:
            raise RuntimeError(f"saga {k} replayed to {runtime.status.value}")
        runtime.close()
        events += len(history)
    return events
