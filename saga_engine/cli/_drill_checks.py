"""The drill's verdict: invariants read back from the engine's tables and the
participants' ledgers (``drill_ledger``, written by the kit in each applying transaction),
and the timings the progress watch measured."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from pydantic import SecretStr

from saga_engine.core.history._codec import CodecChain
from saga_engine.core.history._events import (
    CompensationCompleted,
    CompensationStuck,
    SagaParked,
    StepAbandoned,
    StepParked,
)
from saga_engine.core.history._status import SagaStatus
from saga_engine.core.planning._replay import HistoryExport, replay
from saga_engine.kernel._settings import CallbackSettings, PostgresSettings, Settings
from saga_engine.store._store import LoadedSaga

__all__ = ["Check", "ProgressWatch", "check_all", "parked_reason", "saga_databases"]


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def saga_databases(settings: Settings) -> dict[str, str]:
    """Where the sagas' rows are: each shard's DSN by its name, or the one database's
    (named "")."""
    pg = settings.pg
    if not pg.shards:
        return {"": pg.dsn.get_secret_value()}
    return {s.name: s.dsn.get_secret_value() for s in pg.shards}


@dataclass
class ProgressWatch:
    """Samples the engine's ``sagas`` table (each shard's, past one database): progress
    is any new history event."""

    dsn: str
    schema: str
    saga_ids: list[str] = field(default_factory=list)
    #: The databases of the sagas' rows (``saga_databases``); ``dsn`` alone when empty.
    databases: list[str] = field(default_factory=list)
    #: When the drill sent each saga's start (wall time).
    sent_at: dict[str, float] = field(default_factory=dict)
    progress_at: list[float] = field(default_factory=list)  # monotonic times of progress
    faults: list[tuple[str, float, float]] = field(default_factory=list)  # kind, monotonic, wall
    settled_at: float | None = None
    open: int = 0  # the drill's sagas not yet terminal or parked, at the last sample
    _events: int = -1

    async def sample(self, conns: list[asyncpg.Connection]) -> int:
        """Records one sample (``conns``: one to each of ``databases``); returns how many
        of the drill's sagas are still open."""
        events = opened = known = 0
        for conn in conns:
            try:
                row = await conn.fetchrow(
                    f"SELECT coalesce(sum(last_seq), 0) AS events, count(*) FILTER (WHERE "
                    f"status IN ('running', 'compensating')) AS open, count(*) AS known "
                    f'FROM "{self.schema}".sagas WHERE saga_id = ANY($1)',
                    self.saga_ids,
                )
            except asyncpg.UndefinedTableError:  # the engines have not migrated yet
                return len(self.saga_ids)
            assert row is not None
            events, opened = events + row["events"], opened + int(row["open"])
            known += int(row["known"])
        now = time.monotonic()
        if events > self._events:
            if self._events >= 0:  # the first sample is the baseline
                self.progress_at.append(now)
            self._events = events
        still_open = opened + len(self.saga_ids) - known
        self.open = still_open
        if still_open == 0 and self.saga_ids and self.settled_at is None:
            self.settled_at = now
        elif still_open:
            self.settled_at = None
        return still_open

    def timings(self, takeovers: list[float]) -> dict[str, float | None]:
        """``takeovers``: the wall times at which an engine took partitions it did not
        hold (its log says so): a kill's takeover is the first one after it."""

        def after(t: float, times: list[float]) -> float | None:
            later = [p for p in times if p > t]
            return round(min(later) - t, 2) if later else None

        kills = [
            after(w, takeovers)
            for kind, _, w in self.faults
            if kind in ("engine-kill", "engine-freeze")
        ]
        firsts = [after(t, self.progress_at) for _, t, _ in self.faults]
        gaps = [b - a for a, b in zip(self.progress_at, self.progress_at[1:], strict=False)]
        last_fault = max((t for _, t, _ in self.faults), default=None)
        return {
            "takeover_s": _max(kills),
            "first_progress_after_fault_s": _max(firsts),
            "longest_stall_s": round(max(gaps), 2) if gaps else None,
            "drain_after_last_fault_s": (
                # Sagas that settled while the last fault still ran drained in no time.
                round(max(0.0, self.settled_at - last_fault), 2)
                if self.settled_at is not None and last_fault is not None
                else None
            ),
        }


def _max(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


async def check_all(
    settings: Settings,
    engine_schema: str,
    ledgers: dict[str, str],
    saga_ids: list[str],
    sagas: list[Any],
) -> list[Check]:
    """Every invariant, one :class:`Check` each (``ledgers``: participant -> schema)."""
    where: dict[str, str] = {}  # saga id -> the database of its rows
    rows: list[asyncpg.Record] = []
    for dsn in saga_databases(settings).values():
        conn = await asyncpg.connect(dsn)
        try:
            found = await conn.fetch(
                f'SELECT saga_id, status FROM "{engine_schema}".sagas WHERE saga_id = ANY($1)',
                saga_ids,
            )
        finally:
            await conn.close()
        rows += found
        where.update((r["saga_id"], dsn) for r in found)
    conn = await asyncpg.connect(settings.pg.dsn.get_secret_value())
    try:
        applied: list[asyncpg.Record] = []
        for schema in ledgers.values():
            try:
                applied += await conn.fetch(
                    f"SELECT command_id, command_type, saga_id, step, compensation, at, seq "
                    f'FROM "{schema}".drill_ledger'
                )
            except asyncpg.UndefinedTableError:  # a participant that never started
                continue
    finally:
        await conn.close()
    # One Postgres clock for every schema: the commit order across participants.
    applied.sort(key=lambda r: (r["at"], r["seq"]))
    histories = await _histories(settings, engine_schema, saga_ids, where)
    reasons = {i: parked_reason(h) for i, h in histories.items() if isinstance(h, LoadedSaga)}
    statuses = {r["saga_id"]: SagaStatus(r["status"]) for r in rows}
    checks = [_lost(saga_ids, statuses, reasons), _twice(applied), _compensations(applied)]
    checks.append(_replays(histories, sagas, settings.callbacks))
    given_up = _given_up(histories, applied)
    if given_up is not None:
        checks.append(given_up)
    return checks


_PARKING = (SagaParked, CompensationStuck, StepParked)


def parked_reason(loaded: LoadedSaga) -> str:
    """Why a saga is parked: the message of the last parking event in its history (the
    projection's error when the history has none), "" when neither says anything."""
    for stored in reversed(loaded.events):
        event = stored.event
        if isinstance(event, _PARKING) and event.error.message.strip():
            return f"{event.kind}: {event.error.message.strip()}"
    error = loaded.record.error or {}
    message = error.get("message")
    return message.strip() if isinstance(message, str) else ""


def _lost(saga_ids: list[str], statuses: dict[str, SagaStatus], reasons: dict[str, str]) -> Check:
    """Every saga terminal, or parked with a non-empty reason (printed in the detail)."""
    bad: list[str] = []
    parked: list[str] = []
    for saga_id in saga_ids:
        status = statuses.get(saga_id)
        if status is None:
            bad.append(f"{saga_id}: never started")
        elif status.is_parked:
            reason = reasons.get(saga_id, "").strip()
            if reason:
                parked.append(f"{saga_id} parked ({status.value}): {reason}")
            else:
                bad.append(f"{saga_id}: parked ({status.value}) without a reason")
        elif not status.is_terminal:
            bad.append(f"{saga_id}: still {status.value}")
    counts = Counter(s.value for s in statuses.values())
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no sagas"
    detail = "; ".join(bad[:5]) or "; ".join([summary, *parked[:5]])
    return Check("no saga lost", not bad, detail)


def _twice(applied: list[asyncpg.Record]) -> Check:
    counts = Counter(r["command_id"] for r in applied)
    twice = {c: n for c, n in counts.items() if n > 1}
    types = {r["command_id"]: (r["command_type"], r["saga_id"]) for r in applied}
    detail = "; ".join(
        f"command {c} ({types[c][0]} of saga {types[c][1]}) applied {n} times"
        for c, n in list(twice.items())[:5]
    )
    return Check(
        "no effect applied twice",
        not twice,
        detail or f"{len(counts)} commands applied once each",
    )


def _compensations(applied: list[asyncpg.Record]) -> Check:
    """A compensation only for an applied step, and the compensations of a saga in the
    reverse order of its steps (the ledger's commit times, one Postgres clock)."""
    per_saga: dict[str, list[asyncpg.Record]] = defaultdict(list)
    for r in applied:
        per_saga[r["saga_id"]].append(r)
    bad: list[str] = []
    compensated = 0
    for saga_id, records in per_saga.items():
        forward = [r["step"] for r in records if not r["compensation"]]
        undone = list(dict.fromkeys(r["step"] for r in records if r["compensation"]))
        compensated += bool(undone)
        stray = [s for s in undone if s not in forward]
        if stray:
            bad.append(f"saga {saga_id}: compensated {stray} that never applied")
            continue
        order = [s for s in reversed(list(dict.fromkeys(forward))) if s in undone]
        if undone != order:
            bad.append(f"saga {saga_id}: compensated in the order {undone}, not {order}")
    return Check(
        "compensations only for applied steps, in reverse order",
        not bad,
        "; ".join(bad[:5]) or f"{compensated} sagas compensated",
    )


def _given_up(
    histories: dict[str, LoadedSaga | str], applied: list[asyncpg.Record]
) -> Check | None:
    """A step its saga's code gave up in doubt (``step_abandoned``: a race's loser, a
    timeout scope's) is undone exactly once: once its saga ended, its compensation
    completed once in history, and the participant applied it at most once, and exactly
    once when it applied the step. None when no saga under drill gave a step up."""
    rows = Counter((r["saga_id"], r["step"], r["compensation"]) for r in applied)
    given_up = applied_too = 0
    bad: list[str] = []
    for saga_id, loaded in histories.items():
        if isinstance(loaded, str):
            continue  # the replay check says why
        events = [s.event for s in loaded.events]
        for step in {e.step for e in events if isinstance(e, StepAbandoned) and e.in_doubt}:
            given_up += 1
            done = sum(isinstance(e, CompensationCompleted) and e.step == step for e in events)
            forward, undone = rows[saga_id, step, False], rows[saga_id, step, True]
            applied_too += forward > 0
            ended = loaded.record.status.is_terminal
            # (Undone though never applied is allowed: a compensation is safe for that.)
            if undone > 1 or done > 1 or (ended and (done != 1 or (forward and not undone))):
                bad.append(
                    f"saga {saga_id}: step {step!r} given up, applied {forward} time(s), "
                    f"undone {undone} time(s), its compensation completed {done} time(s)"
                )
    if not given_up:
        return None
    return Check(
        "a step given up is undone once",
        not bad,
        "; ".join(bad[:5])
        or f"{given_up} steps given up in doubt ({applied_too} applied), each undone once",
    )


async def _histories(
    settings: Settings, engine_schema: str, saga_ids: list[str], where: dict[str, str]
) -> dict[str, LoadedSaga | str]:
    """Each saga's record and history, or why it cannot be loaded (``where``: the
    database of each saga's rows; one not found anywhere is looked for in the first)."""
    from saga_engine.store._pgstore import PostgresEventStore

    databases = list(saga_databases(settings).values())
    found: dict[str, LoadedSaga | str] = {}
    for dsn in databases:
        mine = [i for i in saga_ids if where.get(i, databases[0]) == dsn]
        pg = PostgresSettings(dsn=SecretStr(dsn), db_schema=engine_schema)
        codec = CodecChain.from_settings(settings.codec)
        store = await PostgresEventStore.connect(pg, codec=codec)
        try:
            for saga_id in mine:
                try:
                    found[saga_id] = await store.load(saga_id)
                except Exception as exc:  # a missing saga is the "lost" check's
                    found[saga_id] = f"cannot load ({type(exc).__name__})"
        finally:
            await store.close()
    return {i: found[i] for i in saga_ids}


def _replays(
    histories: dict[str, LoadedSaga | str], sagas: list[Any], callbacks: CallbackSettings
) -> Check:
    """Every history replays against the code, with the deployment's callback keys (the
    engines' ``callbacks``: code that reads a callback's URL derives it on replay)."""
    bad: list[str] = []
    for saga_id, loaded in histories.items():
        if isinstance(loaded, str):
            bad.append(f"{saga_id}: {loaded}")
            continue
        history = HistoryExport(saga_id, loaded.record.saga_type, [s.event for s in loaded.events])
        result = replay(sagas, history, callbacks=callbacks)
        if not result.deterministic:
            bad.append(f"{saga_id}: {result.error}")
    return Check(
        "every history replays",
        not bad,
        "; ".join(bad[:5]) or f"{len(histories)} histories replayed",
    )
