"""The fraud service (port base+4): ``POST /check``, which the engine calls for an HTTP step.

It deduplicates on the ``Idempotency-Key`` header in its own table: the same key always
gets the same answer, computed once. ``{"approved": true, "score": n}`` for most
customers; 422 ``{"detail": ...}`` for a blocked one (``SAGA_DEMO_BLOCKED``, default
``mallory``), which fails the saga's step. With ``SAGA_DEMO_FRAUD_FLAKY`` (on by default)
the first call of every key gets a 503, so the engine's retry under the same key shows in
``GET /checks/{key}`` (``calls: 2``).

Run it with ``uvicorn services_demo.fraud:app --port 8104``.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator
from typing import Annotated, Any

import orjson
from fastapi import FastAPI, Header, HTTPException
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from services_demo._service import (
    Holder,
    add_health,
    answer_once,
    answers_ddl,
    observe,
    running_service,
)
from services_demo.contracts import FraudCheck, FraudVerdict

DDL = answers_ddl("checks")


def score_of(check: FraudCheck) -> int:
    """A deterministic "risk score" in [0, 60)."""
    return hashlib.sha256(f"{check.customer}:{check.order_id}".encode()).digest()[0] % 60


class StoredCheck(BaseModel):
    idempotency_key: str
    request: dict[str, Any]
    status_code: int
    response: dict[str, Any]
    calls: int


def create_app() -> FastAPI:
    holder = Holder()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with running_service("fraud", ddl=DDL) as svc:
            svc.extra_health.update(flaky=svc.demo.fraud_flaky)
            holder.set(svc)
            try:
                yield
            finally:
                holder.set(None)

    app = FastAPI(
        title="fraud",
        summary="A fraud check the saga engine calls over HTTP, idempotent per key.",
        lifespan=lifespan,
    )
    add_health(app, holder)
    observe(app, "fraud")

    @app.post(
        "/check",
        response_model=FraudVerdict,
        responses={422: {"description": "the customer is blocked"}},
        tags=["fraud"],
    )
    async def check(
        body: FraudCheck, idempotency_key: Annotated[str, Header(min_length=1, max_length=200)]
    ) -> JSONResponse:
        """Scores an order; the same ``Idempotency-Key`` always gets the same answer."""
        demo = holder.service.demo
        if body.customer in demo.blocked_customers:
            status, answer = 422, {"detail": f"customer {body.customer} is blocked"}
        else:
            status, answer = 200, FraudVerdict(approved=True, score=score_of(body)).model_dump()
        stored, response, calls = await answer_once(
            holder.pool, "checks", idempotency_key, body, status, answer
        )
        if demo.fraud_flaky and calls == 1:
            return JSONResponse({"detail": "busy, try again"}, status_code=503)
        return JSONResponse(response, status_code=stored)

    @app.get("/checks/{idempotency_key}", response_model=StoredCheck, tags=["fraud"])
    async def get_check(idempotency_key: str) -> StoredCheck:
        """A stored answer, with how many calls it took."""
        row = await holder.pool.fetchrow(
            "SELECT * FROM checks WHERE idempotency_key = $1", idempotency_key
        )
        if row is None:
            raise HTTPException(404, f"no check under key {idempotency_key}")
        return StoredCheck(
            idempotency_key=row["idempotency_key"],
            request=orjson.loads(row["request"]),
            status_code=row["status_code"],
            response=orjson.loads(row["response"]),
            calls=row["calls"],
        )

    return app


app = create_app()
