"""The saga page's updates and queries: a form for each ``@update`` the saga's type
declares (with an example input of its model), and the answers of its ``@query``
methods that take no arguments, from the saga's replayed state (nothing is written)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from saga_engine.core.authoring._definition import SagaRegistry
from saga_engine.core.authoring._update import queries_of, updates_of
from saga_engine.kernel._errors import SagaError, UnknownSagaType
from saga_engine.runner._parts import EngineParts
from saga_engine.runner._updates import ask

__all__ = ["query_answers", "update_forms"]


def update_forms(
    registry: SagaRegistry, saga_type: str, example: Callable[[dict[str, Any]], Any]
) -> list[tuple[str, str]]:
    """(name, an example input of its model) for each update the saga type declares."""
    try:
        cls = registry.get(saga_type).cls
    except UnknownSagaType:
        return []  # not deployed here: the API refuses its updates too
    return [
        (name, json.dumps(example(h.model.model_json_schema()) if h.model else {}, indent=1))
        for name, h in sorted(updates_of(cls).items())
    ]


async def query_answers(parts: EngineParts, saga_id: str, saga_type: str) -> list[tuple[str, str]]:
    """(name, its answer as JSON, or why there is none) for each query without arguments."""
    try:
        cls = parts.registry.get(saga_type).cls
    except UnknownSagaType:
        return []
    out = []
    for name, handler in sorted(queries_of(cls).items()):
        if handler.model is not None:
            continue  # it needs arguments: GET /sagas/{id}/queries/{name}?...
        try:
            answer = await ask(
                parts.store, parts.registry, parts.live, parts.clock, saga_id, name, {}
            )
            text = json.dumps(answer, indent=2, sort_keys=True, ensure_ascii=False)
        except SagaError as exc:
            text = f"({type(exc).__name__}: {exc})"
        out.append((name, text))
    return out
