"""The admin HTTP API, served inside the engine process on the engine's event loop.

::

    from saga_engine.admin import create_admin_app, serve_admin

    app = create_admin_app(engine, settings, parts=parts)  # parts: the engine's collaborators
    server = await serve_admin(app, settings)  # settings.admin: host, port, tokens
    ...
    await server.stop()

Endpoints (OpenAPI at ``/openapi.json``): ``GET /health``; ``GET /saga-types``;
``GET /saga-types/{name}`` (with a graph saga's declared graph);
``GET /sagas`` (filters, cursor pages); ``GET /sagas/{id}``; ``GET /sagas/{id}/history``;
``GET /sagas/{id}/graph`` (a graph saga's nodes' states);
``POST /sagas/{type}`` (start); ``POST /sagas/{id}/signal|cancel|resume``;
``GET /metrics`` (JSON or Prometheus text); ``GET /dead-letters``,
``GET /dead-letters/{partition}/{offset}`` and ``POST .../replay`` over the
``DeadLetterReader`` given to ``create_admin_app`` (a worker gives its Kafka topic,
``saga_engine.worker.DeadLetterTopic``; without one those routes answer 503).

Bearer tokens come from ``settings.admin.readers`` and ``settings.admin.operators``
(name -> token). Auth is off only on a loopback address with no token configured;
anywhere else without tokens the app refuses to be created (InsecureAdminBinding).

An edge: it is handed the engine and its collaborators by the worker (it names no
concrete adapter). May import ``saga_engine.runner`` and every layer below it.
"""

import warnings
from typing import Any

from saga_engine.admin._app import StartSaga, create_admin_app
from saga_engine.admin._auth import Principal, Role
from saga_engine.admin._server import AdminServer, serve_admin
from saga_engine.kernel._errors import AdminConfigError, InsecureAdminBinding
from saga_engine.transport._dead_letter import DeadLetter, DeadLetterReader

__all__ = [
    "AdminConfigError",
    "AdminServer",
    "DeadLetter",
    "DeadLetterReader",
    "InsecureAdminBinding",
    "Principal",
    "Role",
    "StartSaga",
    "create_admin_app",
    "serve_admin",
]

#: Names this module had before, and what to import instead.
_RENAMED = {"DeadLetters": "DeadLetterReader"}


def __getattr__(name: str) -> Any:
    """The old name of a renamed class still imports, with a DeprecationWarning."""
    if name in _RENAMED:
        new = _RENAMED[name]
        warnings.warn(
            f"saga_engine.admin.{name} is renamed {new}; import {new} instead",
            DeprecationWarning,
            stacklevel=2,
        )
        return globals()[new]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
