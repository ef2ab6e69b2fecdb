"""Replay checks: does the code deployed now still agree with recorded histories?

Use it in CI with histories exported from production (``saga history ID --json``
or ``GET /sagas/{id}/history``), or through ``saga replay``::

    from saga_engine.replay import load_history, replay

    def test_old_checkout_histories_still_replay():
        result = replay([Checkout], load_history(Path("histories/checkout-1.json")))
        assert result.deterministic, result.error
"""

from saga_engine.core.planning._replay import (
    FORMAT,
    HistoryExport,
    ReplayResult,
    export_history,
    load_event_sources,
    load_history,
    load_sagas,
    load_triggers,
    replay,
)

__all__ = [
    "FORMAT",
    "HistoryExport",
    "ReplayResult",
    "export_history",
    "load_event_sources",
    "load_history",
    "load_sagas",
    "load_triggers",
    "replay",
]
