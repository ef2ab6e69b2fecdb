"""What the participant, replay and insights workloads read, made before they are
measured (so that making it is not counted): the commands of ``n`` sagas as the engine's
records, in waves (``shape.waves``), each saga's history as the store keeps it (one JSON
value per event), and each history's marks as the Postgres store's roll-up reads them
(``insight_marks``). Written once by ``bench/instructions.py`` for the largest run; a run of
``n`` reads the first ``n`` sagas' worth."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import orjson

from bench.ir.shape import definitions, reply_to, started, waves
from saga_engine.core.history._events import event_from_json, event_to_json
from saga_engine.core.views._insights import MARK_KINDS, Mark, mark_of
from saga_engine.kernel._settings import Settings
from saga_engine.transport._command_records import CommandRecords
from saga_engine.transport._topics import Topics

#: Sagas in flight together: each wave of commands is one batch a participant reads.
BATCH = 32


def histories(n: int) -> list[list[str]]:
    """Each of ``n`` finished sagas' events, as JSON text."""
    defs = definitions()
    out = []
    for k in range(n):
        runtime, decision = started(defs[k % 2], k)
        while decision.commands:
            decision = runtime.handle(reply_to(decision.commands[0]))
        out.append([event_to_json(e).decode() for e in runtime.history])
        runtime.close()
    return out


def insight_marks(histories: list[list[str]]) -> list[list[list[Any]]]:
    """Each history's marks as the Postgres store's roll-up selects them (``Mark``'s
    fields in their order, ``_pginsights._MARKS``), spread over time and with a reply's
    timings (``ReplyTimings``, as the e2e's participants send them): the fixture's events
    are all at one instant, with none. Deterministic: the k-th saga's gaps are a function
    of k, so the histograms' buckets vary."""
    out = []
    for k, history in enumerate(histories):
        at = 1_765_000_000_000.0 + 17.0 * k
        rows = []
        for i, text in enumerate(history):
            m = mark_of(event_from_json(text))
            if m.kind not in MARK_KINDS:
                continue
            at += (k % 7 + 1) * 1.7 * (i + 1)
            m.at = at
            if m.kind == "reply_received":
                m.recorded = at + 0.8
                m.committed = at - 1.1
                m.handler_end = m.committed - 0.4
                m.handler_start = m.handler_end - 0.3 * (k % 11 + i)
                m.received = m.handler_start - 0.6
                m.sent = m.received - 0.9
                m.cpu_ms = 0.7 * (k % 13)
            rows.append([getattr(m, f.name) for f in dataclasses.fields(Mark)])
        out.append(rows)
    return out


def command_batches(n: int, batch: int = BATCH) -> list[list[list[Any]]]:
    """The records of ``n`` sagas' commands, one list per wave: ``[saga index, key,
    value, headers]`` each (text; the headers as ``[name, value]`` pairs)."""
    records = CommandRecords(Topics.of(Settings().kafka), "/saga-engine/bench")
    out = []
    for wave in waves(n, batch):
        rows = []
        for command in wave:
            _, key, value, headers = records.record(command)
            k = int(command.saga_id.replace("-", ""), 16) - 1
            rows.append([k, key.decode(), value.decode(), [[h, v.decode()] for h, v in headers]])
        out.append(rows)
    return out


def write(path: Path, n: int, batch: int = BATCH) -> Path:
    texts = histories(n)
    path.write_bytes(
        orjson.dumps(
            {
                "histories": texts,
                "batches": command_batches(n, batch),
                "marks": insight_marks(texts),
            }
        )
    )
    return path


def read(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = orjson.loads(path.read_bytes())
    return data
