"""What the participant and replay workloads read, made before they are measured (so
that making it is not counted): the commands of ``n`` sagas as the engine's records, in
waves (``shape.waves``), and each saga's history as the store keeps it (one JSON value
per event). Written once by ``bench/instructions.py`` for the largest run; a run of
``n`` reads the first ``n`` sagas' worth."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from bench.ir.shape import definitions, reply_to, started, waves
from saga_engine.core.history._events import event_to_json
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
    path.write_bytes(
        orjson.dumps({"histories": histories(n), "batches": command_batches(n, batch)})
    )
    return path


def read(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = orjson.loads(path.read_bytes())
    return data
