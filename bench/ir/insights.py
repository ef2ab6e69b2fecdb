"""The insights' roll-up: each finished saga's marks (the fixture's, as the Postgres
store's roll-up selects them) made into ``Mark``s, summarised, and the summaries added
into aggregate rows, as ``_pginsights.add_insights`` does between its read and its
upsert (all ``n`` runs one batch: housekeeping takes up to 2,000). Unit: a saga.
"""

from __future__ import annotations

from pathlib import Path

from bench.ir import fixtures
from saga_engine.core.views._insights import Mark, aggregate, summarize


def run(n: int, fixture_path: Path) -> int:
    histories = fixtures.read(fixture_path)["marks"][:n]
    summaries = [summarize([Mark(*r) for r in marks]) for marks in histories]
    if not aggregate(s for s in summaries if s is not None):
        raise RuntimeError("the roll-up added no rows")
    return len(histories)
