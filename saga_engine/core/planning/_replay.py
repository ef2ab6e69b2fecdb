"""The code behind :mod:`saga_engine.replay`, whose docstring says what it is for."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from saga_engine.core.authoring._definition import Saga, SagaRegistry
from saga_engine.core.history._events import Event, event_to_dict, events_from_list
from saga_engine.core.history._status import SagaStatus
from saga_engine.core.runtime._runtime import SagaRuntime
from saga_engine.kernel._errors import DefinitionError, PermanentError, SerializationError
from saga_engine.kernel._serde import JsonDict, loads
from saga_engine.kernel._settings import CallbackSettings

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

FORMAT = "saga-engine/history@1"


@dataclass(frozen=True, slots=True)
class HistoryExport:
    saga_id: str
    saga_type: str
    events: list[Event]


@dataclass(frozen=True, slots=True)
class ReplayResult:
    saga_id: str
    saga_type: str
    events: int
    status: SagaStatus
    error: PermanentError | None

    @property
    def deterministic(self) -> bool:
        return self.error is None


def export_history(saga_id: str, saga_type: str, events: Sequence[Event]) -> JsonDict:
    """The JSON document that ``saga replay`` and :func:`load_history` read."""
    return {
        "format": FORMAT,
        "saga_id": saga_id,
        "saga_type": saga_type,
        "events": [{"seq": i + 1, **event_to_dict(e)} for i, e in enumerate(events)],
    }


def load_history(source: JsonDict | str | bytes | Path) -> HistoryExport:
    """Reads an exported history from a dict, JSON text or a file path."""
    if isinstance(source, Path):
        try:
            source = source.read_bytes()
        except OSError as exc:
            raise SerializationError(f"cannot read history file: {exc}") from exc
    data: Any = loads(source) if isinstance(source, str | bytes) else source
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise SerializationError(
            f'not a saga history export (expected "format": "{FORMAT}"); export one with '
            "`saga history ID --json`"
        )
    try:
        raw = [{k: v for k, v in e.items() if k != "seq"} for e in data["events"]]
        seqs = [e.get("seq") for e in data["events"]]
        events = events_from_list(raw)
        saga_id, saga_type = str(data["saga_id"]), str(data["saga_type"])
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise SerializationError(f"malformed history export: {exc}") from exc
    if seqs != list(range(1, len(seqs) + 1)):
        raise SerializationError("malformed history export: sequence numbers must be 1..n")
    return HistoryExport(saga_id, saga_type, events)


def replay(
    sagas: Iterable[type[Saga[Any, Any]]] | SagaRegistry,
    history: HistoryExport,
    *,
    callbacks: CallbackSettings | None = None,
) -> ReplayResult:
    """Re-runs the saga's current code against the history; reports the first divergence.
    ``callbacks``: the keys its callback URLs were signed with (``Settings.callbacks``),
    for code that reads a URL (``cb.url``); without them, that code cannot run."""
    registry = sagas if isinstance(sagas, SagaRegistry) else SagaRegistry(sagas)
    # The class of the version the history's start recorded, not the newest deployed.
    definition = registry.for_history(history.saga_type, history.events)
    runtime, decision = SagaRuntime.replay(
        definition, history.saga_id, history.events, callbacks=callbacks
    )
    try:
        return ReplayResult(
            saga_id=history.saga_id,
            saga_type=history.saga_type,
            events=len(history.events),
            status=runtime.status,
            error=decision.nondeterminism,
        )
    finally:
        runtime.close()


def _cwd_importable() -> None:
    """As uvicorn and celery do: the app module may live in the current directory,
    which a console script (unlike ``python -m``) does not put on sys.path."""
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)


def load_triggers(spec: str) -> list[Any]:
    """Every ``KafkaTrigger`` defined at the top level of the module named by ``spec``."""
    from saga_engine.core.planning._triggers import KafkaTrigger

    module = importlib.import_module(spec.partition(":")[0])
    return [v for v in vars(module).values() if isinstance(v, KafkaTrigger)]


def load_event_sources(spec: str) -> list[Any]:
    """Every ``EventSource`` defined at the top level of the module named by ``spec``."""
    from saga_engine.core.authoring._domain_events import EventSource

    module = importlib.import_module(spec.partition(":")[0])
    return [v for v in vars(module).values() if isinstance(v, EventSource)]


def load_sagas(spec: str) -> list[type[Saga[Any, Any]]]:
    """``package.module`` (every named Saga class defined there) or ``module:attribute``
    (a Saga class or a list of them)."""
    module_name, _, attr = spec.partition(":")
    _cwd_importable()
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise DefinitionError(f"cannot import saga module {module_name!r}: {exc}") from exc
    if attr:
        try:
            value = getattr(module, attr)
        except AttributeError:
            raise DefinitionError(f"module {module_name!r} has no attribute {attr!r}") from None
        found = list(value) if isinstance(value, list | tuple) else [value]
    else:
        found = [
            obj
            for _, obj in inspect.getmembers(module, inspect.isclass)
            if issubclass(obj, Saga)
            and obj.__module__ == module.__name__
            and "name" in obj.__dict__
        ]
    sagas = [s for s in found if isinstance(s, type) and issubclass(s, Saga)]
    if not sagas:
        raise DefinitionError(f"no saga classes found in {spec!r}")
    return sagas
