"""Replay: each saga's stored history read back and the saga rebuilt from it, as an
engine does for a saga it does not hold. **Read**: each event's row as the Postgres
store's history reads take it (``events::json``: the row's events as their text, which
the connection's ``json`` codec hands over undecoded), then ``unnest_rows`` and
``_stored_events``: each event read from its text into its type, validated); **rebuild**:
``SagaRuntime.replay`` runs the saga's code against its events. The workload ``read``
does the first only and ``replay`` both, so rebuild is their difference. Unit: an event.

Each row here holds one event (the store's rows hold a decision's events: one or more),
so the split of a row's text is paid per event.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.ir import fixtures
from bench.ir.shape import definitions, saga_id
from saga_engine.core.runtime._runtime import SagaRuntime
from saga_engine.store._pgbase import _json_text, _stored_events, unnest_rows


def rows(fixture: dict[str, Any], n: int) -> list[list[dict[str, Any]]]:
    """The first ``n`` sagas' history rows (``seq``, ``events`` as Postgres sends the
    ``json`` text), one event each."""
    return [
        [
            {"seq": seq, "events": _json_text(b"[" + text.encode() + b"]")}
            for seq, text in enumerate(history, 1)
        ]
        for history in fixture["histories"][:n]
    ]


def _read(raw: list[Any]) -> list[Any]:
    """A saga's history rows as the store reads them (each row a mapping, as an
    ``asyncpg.Record`` is)."""
    return [s.event for s in _stored_events(unnest_rows(raw), None)]


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
