"""The saga's deterministic loop makes asyncio's handles itself (``call_soon``: without
``Handle.__init__``'s call per callback) and runs them without ``Handle._run``. Pinned
here: the slots it sets are asyncio's, a handle it makes behaves as asyncio's (runs,
cancels, reports an error to the loop's handler), so a Python whose ``Handle`` changes
fails here rather than in a saga."""

from __future__ import annotations

import asyncio
from typing import Any

from saga_engine.core.runtime._loop import DeterministicLoop

SET_BY_THE_LOOP = {"_callback", "_args", "_loop", "_context", "_cancelled", "_repr"}


def test_the_slots_the_loop_sets_are_asyncios() -> None:
    assert SET_BY_THE_LOOP | {"_source_traceback"} <= set(asyncio.Handle.__slots__)


def test_a_handle_runs_cancels_and_reports_as_asyncios_does() -> None:
    loop = DeterministicLoop()  # type: ignore[abstract]
    ran: list[str] = []

    def boom() -> None:
        raise ValueError("boom")

    first = loop.call_soon(ran.append, "first")
    skipped = loop.call_soon(ran.append, "skipped")
    failing = loop.call_soon(boom)
    loop.call_soon(ran.append, "after the error")
    assert isinstance(first, asyncio.Handle)
    skipped.cancel()
    assert skipped.cancelled()
    assert not first.cancelled()

    loop.run_until_quiescent()

    assert ran == ["first", "after the error"]
    errors: list[dict[str, Any]] = loop.errors or []
    assert [type(e["exception"]) for e in errors] == [ValueError]
    assert errors[0]["handle"] is failing
    assert errors[0]["message"].startswith("Exception in callback")
