"""The admin HTTP API: inspect sagas, start them, and act on them as an operator.

Build it with :func:`create_admin_app` and serve it on the engine's event loop with
:func:`saga_engine.admin.serve_admin`. Its OpenAPI description is at ``/openapi.json``.

The routes live in routers by concern (``_meta``: health, saga types, metrics;
``_reads``: list, detail, history; ``_starts``: the start; ``_actions``: operator
actions; ``_rollouts``: saga versions' rollouts; ``_flow``: flow control;
``_domain_events``: the domain events kept; ``_schedules``: durable schedules;
``_batches``: batch operations; ``_dead_letters``: the dead-letter topic; ``web``: the pages, ``_web_waits`` those of domain
events and concurrency keys). They reach the
engine, its collaborators (the store, the registry, the counters), the admin settings and
the start function through the dependencies in ``_deps``, which read what this function
stores on the app's state.
"""

from fastapi import Depends, FastAPI

from saga_engine.admin import (
    _actions,
    _batch_operations,
    _callbacks,
    _concurrency_keys,
    _dead_letters,
    _domain_events,
    _engine_info,
    _flow,
    _flow_policies,
    _insights,
    _progress_stream,
    _rerun,
    _rollouts,
    _saga_reads,
    _schedules,
    _updates,
)
from saga_engine.admin._auth import AuthMiddleware, auth_required
from saga_engine.admin._deps import AdminState, StartSaga, StreamSlots, bearer, install
from saga_engine.admin._http_errors import (
    BodyLimitMiddleware,
    CatchAllMiddleware,
    install_error_handlers,
)
from saga_engine.admin._starts import starts_router
from saga_engine.admin._step_board import StepProgressBoard
from saga_engine.admin._web import SecurityHeadersMiddleware, web_router
from saga_engine.admin._web_batch_operations import batches_page_router
from saga_engine.admin._web_dead_letters import dead_letters_page_router
from saga_engine.admin._web_insights import insights_page_router
from saga_engine.admin._web_schedules import schedules_page_router
from saga_engine.admin._web_waits import waits_page_router
from saga_engine.kernel._settings import AdminSettings, Settings
from saga_engine.kernel._version import __version__
from saga_engine.runner._engine import Engine
from saga_engine.runner._parts import EngineParts
from saga_engine.store._batch_operation_store import BatchStore
from saga_engine.store._schedule_store import ScheduleStore
from saga_engine.telemetry._health import HealthBoard
from saga_engine.transport._dead_letter import DeadLetterReader

__all__ = ["StartSaga", "create_admin_app"]


def create_admin_app(
    engine: Engine,
    settings: Settings,
    *,
    parts: EngineParts,
    start_saga: StartSaga | None = None,
    schedules: ScheduleStore | None = None,
    health: HealthBoard | None = None,
    batches: BatchStore | None = None,
    dead_letters: DeadLetterReader | None = None,
    step_progress: StepProgressBoard | None = None,
) -> FastAPI:
    """The admin API for ``engine``, configured by ``settings.admin``.

    ``parts``: what the engine was built from (its store, registry, counters, flow
    control), as the composition root that built it holds them (``SagaWorker.parts``,
    ``SagaTestEnv.parts``). ``schedules``: the schedules' store (else the schedule
    routes answer 503). ``batches``: the batch operations' store (else those routes
    answer 503). ``dead_letters``: the dead-letter topic to list and replay (the
    worker's; else those routes answer 503). ``step_progress``: the participants' step
    reports as the worker reads them from Kafka (else none are shown). ``health``: what ``/health`` reports
    besides liveness (the worker's board).

    Raises InsecureAdminBinding (a PermanentError) when ``settings.admin.host`` is not a
    loopback address and no token is configured, and AdminConfigError for weak or
    duplicated tokens.
    """
    admin = settings.admin
    tokens = auth_required(admin)
    app = FastAPI(
        title="saga-engine admin API",
        version=__version__,
        description=(
            "Inspect sagas, start them and act on them. Bearer tokens: `reader` tokens may "
            "use every GET, `operator` tokens everything. Operator actions are recorded in "
            "the saga's history with the token's name and the given reason."
        ),
        openapi_url="/openapi.json",
        # The interactive docs pages load their scripts from a CDN: not in an engine.
        docs_url=None,
        redoc_url=None,
    )
    state = AdminState(
        engine,
        parts,
        admin,
        start_saga or engine.start,
        schedules,
        health,
        batches,
        dead_letters,
        step_progress
        if step_progress is not None
        else StepProgressBoard.of(admin, parts.stats.counts),
        StreamSlots(admin.max_streams),
    )
    install(app, state)
    install_error_handlers(app)
    # Outermost last: SecurityHeaders(CatchAll(Auth(BodyLimit(app)))). Auth runs before
    # any body is read; every answer, a 401 or a 500 too, gets the anti-framing headers.
    app.add_middleware(BodyLimitMiddleware, limit=admin.max_body_bytes)
    app.add_middleware(AuthMiddleware, tokens=tokens)
    app.add_middleware(CatchAllMiddleware)
    app.add_middleware(SecurityHeadersMiddleware)
    _include_routers(app, parts, admin)
    return app


def _include_routers(app: FastAPI, parts: EngineParts, admin: AdminSettings) -> None:
    app.include_router(_engine_info.public_router)
    app.include_router(_callbacks.router)  # its signed token is its credential
    # Documents the bearer scheme on every API operation but /health (see _deps.bearer).
    secured = [Depends(bearer)]
    app.include_router(_engine_info.router, dependencies=secured)
    app.include_router(_saga_reads.router, dependencies=secured)
    app.include_router(_progress_stream.router, dependencies=secured)
    # Built per app: the type enum and the bound on ``wait`` are this engine's and
    # settings' (see _starts).
    app.include_router(
        starts_router(parts.registry.names(), admin.max_wait_s), dependencies=secured
    )
    app.include_router(_actions.router, dependencies=secured)
    app.include_router(_rerun.router, dependencies=secured)
    app.include_router(_updates.router, dependencies=secured)
    app.include_router(_rollouts.router, dependencies=secured)
    app.include_router(_flow.router, dependencies=secured)
    app.include_router(_flow_policies.router, dependencies=secured)
    app.include_router(_domain_events.router, dependencies=secured)
    app.include_router(_concurrency_keys.router, dependencies=secured)
    app.include_router(_schedules.router, dependencies=secured)
    app.include_router(_batch_operations.router, dependencies=secured)
    app.include_router(_insights.router, dependencies=secured)
    app.include_router(_dead_letters.router, dependencies=secured)
    app.include_router(web_router(parts, admin))
    app.include_router(_rollouts.ui_router(parts, admin))
    app.include_router(schedules_page_router())
    app.include_router(batches_page_router())
    app.include_router(waits_page_router())
    app.include_router(insights_page_router())
    app.include_router(dead_letters_page_router())
