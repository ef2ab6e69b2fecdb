"""How the admin API's routes reach the engine: FastAPI dependencies over ``app.state``.

:func:`saga_engine.admin.create_admin_app` stores one :class:`AdminState` on its app
(:func:`install`); the providers here read it back from ``request.app``, so the routers
are module-level and one process may serve several apps over different engines.

No ``from __future__ import annotations``: FastAPI reads the providers' annotations
(``Request``) at runtime to know what to pass them.
"""

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, FastAPI, Request
from fastapi.security import HTTPBearer

from saga_engine.admin._auth import PRINCIPAL_KEY, Principal, auth_required
from saga_engine.admin._step_board import StepProgressBoard
from saga_engine.kernel._settings import AdminSettings
from saga_engine.runner._engine import Engine
from saga_engine.runner._parts import EngineParts
from saga_engine.store._batch_operation_store import BatchStore
from saga_engine.store._schedule_store import ScheduleStore
from saga_engine.telemetry._health import HealthBoard
from saga_engine.transport._dead_letter import DeadLetterReader

__all__ = [
    "AdminDep",
    "AdminState",
    "Caller",
    "EngineDep",
    "HealthDep",
    "PartsDep",
    "StartSaga",
    "StarterDep",
    "StepBoardDep",
    "StreamSlots",
    "StreamSlotsDep",
    "bearer",
    "current_principal",
    "install",
    "page_user",
]

#: ``start_saga(saga_type, input, *, idempotency_key=...) -> saga_id``: how the API
#: starts a saga. ``Engine.start`` by default; the worker passes one that goes through
#: the Kafka inbox (``SagaClient.start`` has this shape), so the partition owner starts it.
StartSaga = Callable[..., Awaitable[str]]

#: Declared on every router but /health's: it only documents the scheme in the OpenAPI
#: (auto_error=False); AuthMiddleware checks the token, before any body is read.
bearer = HTTPBearer(
    auto_error=False,
    description="A token from SAGA_ADMIN__READERS or SAGA_ADMIN__OPERATORS.",
)


class StreamSlots:
    """How many progress streams are open in this process, against ``limit``
    (``admin.max_streams``)."""

    __slots__ = ("limit", "open")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0

    def take(self) -> bool:
        """One more stream, if the limit allows: False when it does not."""
        if self.open >= self.limit:
            return False
        self.open += 1
        return True

    def give(self) -> None:
        self.open = max(0, self.open - 1)


@dataclass(frozen=True, slots=True)
class AdminState:
    """What the routes need from :func:`create_admin_app`'s arguments."""

    #: The engine acts (starts, operator actions); its collaborators (the store, the
    #: registry, the counters, flow control) are read where the worker built them.
    engine: Engine
    parts: EngineParts
    admin: AdminSettings
    start_saga: StartSaga
    #: The schedules' table (a worker's); None: the schedule routes answer 503.
    schedules: ScheduleStore | None = None
    #: What is wrong in the process now (see ``_health``); None: nothing is watched.
    health: HealthBoard | None = None
    #: The batch operations' table (a worker's); None: those routes answer 503.
    batches: BatchStore | None = None
    #: The dead-letter topic, read from Kafka; None: the dead-letter routes answer 503.
    dead_letters: DeadLetterReader | None = None
    #: Participants' reports on the steps they handle (``tx.progress``), as this
    #: process read them (the worker feeds it from Kafka; else it stays empty).
    step_progress: StepProgressBoard = field(default_factory=StepProgressBoard)
    #: The progress streams open now, against ``admin.max_streams``.
    streams: StreamSlots = field(default_factory=lambda: StreamSlots(200))


def install(app: FastAPI, state: AdminState) -> None:
    app.state.admin = state


def _state(request: Request) -> AdminState:
    state = getattr(request.app.state, "admin", None)
    if not isinstance(state, AdminState):  # pragma: no cover - create_admin_app sets it
        raise RuntimeError("the admin routers are served outside create_admin_app's app")
    return state


def _engine(request: Request) -> Engine:
    return _state(request).engine


def _parts(request: Request) -> EngineParts:
    return _state(request).parts


def _admin(request: Request) -> AdminSettings:
    return _state(request).admin


def _starter(request: Request) -> StartSaga:
    return _state(request).start_saga


def _health(request: Request) -> HealthBoard | None:
    return _state(request).health


def _step_progress(request: Request) -> StepProgressBoard:
    return _state(request).step_progress


def _streams(request: Request) -> StreamSlots:
    return _state(request).streams


HealthDep = Annotated[HealthBoard | None, Depends(_health)]


def current_principal(request: Request) -> Principal:
    principal = request.scope.get("state", {}).get(PRINCIPAL_KEY)
    if not isinstance(principal, Principal):  # pragma: no cover - the middleware sets it
        raise RuntimeError("the admin API is served without its AuthMiddleware")
    return principal


def page_user(request: Request) -> Principal | None:
    """Who is signed in to a page, shown in its header (None with auth off)."""
    principal = request.scope.get("state", {}).get(PRINCIPAL_KEY)
    auth_on = auth_required(_state(request).admin) is not None
    return principal if auth_on and isinstance(principal, Principal) else None


EngineDep = Annotated[Engine, Depends(_engine)]
PartsDep = Annotated[EngineParts, Depends(_parts)]
AdminDep = Annotated[AdminSettings, Depends(_admin)]
StarterDep = Annotated[StartSaga, Depends(_starter)]
Caller = Annotated[Principal, Depends(current_principal)]
StepBoardDep = Annotated[StepProgressBoard, Depends(_step_progress)]
StreamSlotsDep = Annotated[StreamSlots, Depends(_streams)]
