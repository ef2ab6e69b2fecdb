"""The fraud service (port base+4): ``POST /check``, which the engine calls for an HTTP step.

It deduplicates on the ``Idempotency-Key`` header in its own table: the same key always
gets the same answer, computed once. The checkout's step is completed by callback
(``http_step(..., completion="callback")``, docs/callbacks.md): the engine sends the URL
to post the verdict to in the ``Saga-Callback-Url`` header, the service answers 202 at
once, and posts ``{"approved": true, "score": n}`` to that URL later, or, for a blocked
customer (``SAGA_DEMO_BLOCKED``, default ``mallory``), ``{"error": "customer ... is
blocked"}`` to the URL + ``/fail``, which fails the saga's step. The verdict to post is
written in the service's ``verdicts`` table before the 202 leaves, and a sender posts
what is not delivered yet, again after a 5xx or no answer (a restarted service too); the
engine's 4xx is final. Without the header it answers at once, as it used to (200 with the
verdict, 422 for a blocked customer).

With ``SAGA_DEMO_FRAUD_FLAKY`` (on by default) the first call of every key gets a 503 (and
nothing is posted for it), so the engine's retry under the same key shows in
``GET /checks/{key}`` (``calls: 2``, and the callback's delivery).

Run it with ``uvicorn services_demo.fraud:app --port 8104``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any

import asyncpg
import httpx
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

log = logging.getLogger("services_demo.fraud")

#: The verdicts to post to the engine's callback URLs, one per check accepted (202).
#: ``answer``: the engine's status code once delivered, or refused for good (a 4xx).
DDL = (
    answers_ddl("checks")
    + """
CREATE TABLE IF NOT EXISTS verdicts (
    idempotency_key text PRIMARY KEY,
    callback_url    text NOT NULL,
    failed          boolean NOT NULL,
    body            jsonb NOT NULL,
    attempts        int NOT NULL DEFAULT 0,
    answer          int,
    due_at          timestamptz NOT NULL DEFAULT now(),
    delivered_at    timestamptz
);
"""
)
#: How long after its 202 the verdict is posted ("later"), and the longest wait between
#: two attempts of a delivery that found the engine down.
POST_AFTER_S = 0.2
MAX_RETRY_S = 5.0
POLL_S = 0.1


def score_of(check: FraudCheck) -> int:
    """A deterministic "risk score" in [0, 60)."""
    return hashlib.sha256(f"{check.customer}:{check.order_id}".encode()).digest()[0] % 60


class Delivery(BaseModel):
    """A verdict posted to the engine's callback URL (``failed``: to its ``/fail`` URL)."""

    failed: bool
    body: dict[str, Any]
    attempts: int
    #: The engine's answer (200, or a final 4xx); None: not delivered yet.
    answer: int | None


class StoredCheck(BaseModel):
    idempotency_key: str
    request: dict[str, Any]
    status_code: int
    response: dict[str, Any]
    calls: int
    #: A check completed by callback: the verdict posted (or to post).
    callback: Delivery | None = None


def verdict_of(check: FraudCheck, blocked: frozenset[str]) -> tuple[bool, dict[str, Any]]:
    """What the service decides for ``check``: (failed, body). A blocked customer is a
    failure (``{"error": ...}``); anyone else gets a score."""
    if check.customer in blocked:
        return True, {"error": f"customer {check.customer} is blocked"}
    return False, FraudVerdict(approved=True, score=score_of(check)).model_dump()


class VerdictSender:
    """Posts the verdicts not delivered yet to their callback URLs: every ``POLL_S``,
    those that are due (a new one ``POST_AFTER_S`` after its 202; a retry after its
    back-off). A 2xx, 409 (the first answer stands)
    or another 4xx ends a delivery; a 5xx or no answer (the engine restarting) is tried
    again later."""

    def __init__(self, holder: Holder) -> None:
        self.holder = holder
        self.http = httpx.AsyncClient(timeout=5.0)
        #: The deliveries under way, by key (one at a time per verdict).
        self.sending: dict[str, asyncio.Task[None]] = {}

    async def run(self) -> None:
        while True:
            try:
                await self.send_due()
            except Exception:  # the database away: the next round tries again
                log.exception("delivering verdicts failed; trying again")
            await asyncio.sleep(POLL_S)

    async def send_due(self) -> None:
        """Starts a delivery of every verdict due and not under way: an engine that does
        not answer (frozen, or restarting) holds up only the verdicts whose URLs name it."""
        rows = await self.holder.pool.fetch(
            "SELECT idempotency_key, callback_url, failed, body, attempts FROM verdicts "
            "WHERE delivered_at IS NULL AND due_at <= now() ORDER BY due_at LIMIT 50"
        )
        for row in rows:
            key = row["idempotency_key"]
            if key not in self.sending:
                self.sending[key] = asyncio.create_task(self.deliver(row))
                self.sending[key].add_done_callback(functools.partial(self.done, key))

    def done(self, key: str, task: asyncio.Task[None]) -> None:
        self.sending.pop(key, None)
        if not task.cancelled() and task.exception() is not None:
            # Not recorded as delivered: a later round posts it again (the same answer).
            log.warning("delivering verdict %s failed: %r", key, task.exception())

    async def deliver(self, row: asyncpg.Record) -> None:
        pool, key = self.holder.pool, row["idempotency_key"]
        url = row["callback_url"] + ("/fail" if row["failed"] else "")
        try:
            response = await self.http.post(
                url, content=row["body"], headers={"content-type": "application/json"}
            )
        except httpx.HTTPError as exc:
            log.info("verdict %s not delivered (%s): trying again", key, exc)
        else:
            if response.status_code < 500:
                if response.status_code >= 300:
                    log.warning("the engine refused verdict %s: %s", key, response.text)
                await pool.execute(
                    "UPDATE verdicts SET attempts = attempts + 1, answer = $2, "
                    "delivered_at = now() WHERE idempotency_key = $1",
                    key,
                    response.status_code,
                )
                return
        retry_s = min(MAX_RETRY_S, 0.25 * 2 ** row["attempts"])
        await pool.execute(
            "UPDATE verdicts SET attempts = attempts + 1, "
            "due_at = now() + make_interval(secs => $2) WHERE idempotency_key = $1",
            key,
            retry_s,
        )

    async def accept(self, key: str, callback_url: str, failed: bool, body: dict[str, Any]) -> None:
        """Records the verdict to post for an accepted check (once per key)."""
        await self.holder.pool.execute(
            "INSERT INTO verdicts (idempotency_key, callback_url, failed, body, due_at) "
            "VALUES ($1, $2, $3, $4::jsonb, now() + make_interval(secs => $5)) "
            "ON CONFLICT (idempotency_key) DO NOTHING",
            key,
            callback_url,
            failed,
            orjson.dumps(body).decode(),
            POST_AFTER_S,
        )


def create_app() -> FastAPI:
    holder = Holder()
    sender = VerdictSender(holder)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with running_service("fraud", ddl=DDL) as svc:
            svc.extra_health.update(flaky=svc.demo.fraud_flaky)
            holder.set(svc)
            sending = asyncio.create_task(sender.run())
            try:
                yield
            finally:
                tasks = [sending, *sender.sending.values()]
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                await sender.http.aclose()
                holder.set(None)

    app = FastAPI(
        title="fraud",
        summary="A fraud check the saga engine calls over HTTP, idempotent per key; it "
        "answers 202 and posts its verdict to the step's callback URL later.",
        lifespan=lifespan,
    )
    add_health(app, holder)
    observe(app, "fraud")

    @app.post(
        "/check",
        response_model=FraudVerdict,
        responses={
            202: {"description": "accepted: the verdict is posted to Saga-Callback-Url later"},
            422: {"description": "the customer is blocked (without a callback URL)"},
        },
        tags=["fraud"],
    )
    async def check(
        body: FraudCheck,
        idempotency_key: Annotated[str, Header(min_length=1, max_length=200)],
        saga_callback_url: Annotated[
            str | None, Header(pattern=r"^https?://", max_length=4000)
        ] = None,
    ) -> JSONResponse:
        """Scores an order; the same ``Idempotency-Key`` always gets the same answer. With
        a ``Saga-Callback-Url`` header: 202 now, the verdict posted to it later."""
        demo = holder.service.demo
        failed, verdict = verdict_of(body, demo.blocked_customers)
        if saga_callback_url is not None:
            status, answer = 202, {"accepted": True, "order_id": body.order_id}
        elif failed:
            status, answer = 422, {"detail": verdict["error"]}
        else:
            status, answer = 200, verdict
        stored, response, calls = await answer_once(
            holder.pool, "checks", idempotency_key, body, status, answer
        )
        if demo.fraud_flaky and calls == 1:
            return JSONResponse({"detail": "busy, try again"}, status_code=503)
        if saga_callback_url is not None and stored == 202:
            await sender.accept(idempotency_key, saga_callback_url, failed, verdict)
        return JSONResponse(response, status_code=stored)

    @app.get("/checks/{idempotency_key}", response_model=StoredCheck, tags=["fraud"])
    async def get_check(idempotency_key: str) -> StoredCheck:
        """A stored answer, with how many calls it took."""
        row = await holder.pool.fetchrow(
            "SELECT * FROM checks WHERE idempotency_key = $1", idempotency_key
        )
        if row is None:
            raise HTTPException(404, f"no check under key {idempotency_key}")
        sent = await holder.pool.fetchrow(
            "SELECT failed, body, attempts, answer FROM verdicts WHERE idempotency_key = $1",
            idempotency_key,
        )
        return StoredCheck(
            idempotency_key=row["idempotency_key"],
            request=orjson.loads(row["request"]),
            status_code=row["status_code"],
            response=orjson.loads(row["response"]),
            calls=row["calls"],
            callback=None
            if sent is None
            else Delivery(
                failed=sent["failed"],
                body=orjson.loads(sent["body"]),
                attempts=sent["attempts"],
                answer=sent["answer"],
            ),
        )

    return app


app = create_app()
