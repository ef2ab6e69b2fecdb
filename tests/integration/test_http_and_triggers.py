"""HTTP steps against a real HTTP server, and Kafka triggers, on the real Kafka and Postgres."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
import uvicorn
from aiokafka import AIOKafkaProducer
from fastapi import FastAPI, Header
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from saga_engine import PastPivot, Saga, SagaContext, SagaStatus, Settings, StepFailed
from saga_engine.events import SagaStarted
from saga_engine.settings import AdminSettings, HttpSettings, KafkaSettings, PostgresSettings
from saga_engine.triggers import KafkaTrigger
from saga_engine.worker import SagaWorker
from tests.conftest import PgTarget
from tests.integration.kafka_helpers import fake_participant, read_topic
from tests.waiting import eventually

pytestmark = pytest.mark.integration


class Order(BaseModel):
    customer: str


class Verdict(BaseModel):
    approved: bool
    score: int = 0


class Out(BaseModel):
    approved: bool
    refused: str = ""


class Hold(BaseModel):
    customer: str


class CheckFraud(Saga[Order, Out]):
    name = "check-fraud"

    async def run(self, ctx: SagaContext, order: Order) -> Out:
        await ctx.step(
            "hold",
            to="alpha",
            command=Hold(customer=order.customer),
            compensate=Hold(customer="undo"),
        )
        try:
            verdict = await ctx.http_step(
                "fraud",
                endpoint="fraud",
                path="/check",
                json={"customer": order.customer},
                returns=Verdict,
                timeout=5,
            )
        except StepFailed as exc:
            if order.customer == "caught":
                return Out(approved=False, refused=exc.reason)
            raise
        return Out(approved=verdict.approved)


class FraudServer:
    """A real HTTP service on loopback: fails the first call of 'flaky', refuses 'bad'."""

    def __init__(self) -> None:
        self.keys: Counter[str] = Counter()
        self.blocked = {"bad", "caught"}
        self.captures: Counter[str] = Counter()
        self.app = FastAPI()

        @self.app.post("/capture")
        async def capture(body: dict[str, Any], idempotency_key: str = Header()) -> Any:
            self.captures[body["customer"]] += 1
            return {"captured": True}

        @self.app.post("/check")
        async def check(body: dict[str, Any], idempotency_key: str = Header()) -> Any:
            self.keys[idempotency_key] += 1
            customer = body["customer"]
            if customer == "flaky" and self.keys[idempotency_key] == 1:
                return JSONResponse({"detail": "try later"}, status_code=503)
            if customer in self.blocked:
                return JSONResponse({"detail": f"customer {customer} is blocked"}, status_code=422)
            return {"approved": True, "score": 7}


@contextlib.asynccontextmanager
async def serve(app: FastAPI) -> AsyncIterator[str]:
    # Bound here and handed to uvicorn: no window in which another socket takes the port.
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    await eventually(lambda: server.started, timeout=10)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()


TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _settings(pg: PgTarget, bootstrap: str, uid: str, fraud_url: str) -> Settings:
    return Settings(
        pg=PostgresSettings(dsn=pg.database_dsn, db_schema=pg.schema),
        kafka=KafkaSettings(
            bootstrap_servers=bootstrap, topic_prefix=f"t{uid}", group_id=f"g{uid}", partitions=2
        ),
        http=HttpSettings(endpoints={"fraud": fraud_url}, retry_window_s=5),
        admin=AdminSettings(port=0),
    )


async def _status(worker: SagaWorker, saga_id: str, want: SagaStatus) -> bool:
    assert worker.engine is not None
    try:
        return (await worker.engine.get(saga_id)).status == want
    except Exception:
        return False


async def test_http_step_retries_with_the_same_key_and_refusals_compensate(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    fraud = FraudServer()
    async with serve(fraud.app) as url:
        settings = _settings(pg, kafka_bootstrap, unique_id, url)
        async with (
            SagaWorker(settings, [CheckFraud]) as worker,
            fake_participant(settings, "alpha") as alpha,
        ):
            assert worker.engine is not None
            ok = await worker.engine.start(CheckFraud, Order(customer="flaky"))
            bad = await worker.engine.start(CheckFraud, Order(customer="bad"))
            caught = await worker.engine.start(CheckFraud, Order(customer="caught"))
            await eventually(lambda: _status(worker, ok, SagaStatus.COMPLETED))
            await eventually(lambda: _status(worker, bad, SagaStatus.COMPENSATED))
            await eventually(lambda: _status(worker, caught, SagaStatus.COMPLETED))
            history = await worker.engine.history(ok)
            issued = [e for e in history if e.kind == "command_issued" and e.step == "fraud"]
            assert len(issued) == 1
            key = issued[0].command_id
            assert fraud.keys[key] == 2, "the 503 was retried under the same Idempotency-Key"
            assert issued[0].participant == "http:fraud"
            assert issued[0].payload == {
                "method": "POST",
                "path": "/check",
                "body": {"customer": "flaky"},
            }
            record = await worker.engine.get(bad)
            assert record.error is not None
            assert "customer bad is blocked" in record.error["message"]
            assert [c.subject for c in alpha if c.saga_id == bad] == ["Hold", "Hold"]
            out = [e for e in await worker.engine.history(caught) if e.kind == "saga_completed"]
            assert out[0].output == {
                "approved": False,
                "refused": "HTTP 422: customer caught is blocked",
            }


class CaptureFirst(Saga[Order, Out]):
    """hold, then capture over HTTP as the pivot, then the fraud check over HTTP."""

    name = "capture-first"

    async def run(self, ctx: SagaContext, order: Order) -> Out:
        await ctx.step(
            "hold",
            to="alpha",
            command=Hold(customer=order.customer),
            compensate=Hold(customer="undo"),
        )
        await ctx.http_step(
            "capture",
            endpoint="fraud",
            path="/capture",
            json={"customer": order.customer},
            timeout=5,
            pivot=True,
        )
        verdict = await ctx.http_step(
            "fraud",
            endpoint="fraud",
            path="/check",
            json={"customer": order.customer},
            returns=Verdict,
            timeout=5,
        )
        return Out(approved=verdict.approved)


async def test_past_an_http_pivot_a_refused_http_step_parks_and_a_cancel_is_refused(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    fraud = FraudServer()
    fraud.blocked.add("late")
    async with serve(fraud.app) as url:
        settings = _settings(pg, kafka_bootstrap, unique_id, url)
        async with (
            SagaWorker(settings, [CaptureFirst]) as worker,
            fake_participant(settings, "alpha") as alpha,
        ):
            engine = worker.engine
            assert engine is not None
            saga_id = await engine.start(CaptureFirst, Order(customer="late"))
            # The 422 would compensate the hold; past the pivot it parks the saga.
            await eventually(lambda: _status(worker, saga_id, SagaStatus.STEP_STUCK))
            kinds = [e.kind for e in await engine.history(saga_id)]
            assert kinds.count("pivot_passed") == 1
            assert "step_parked" in kinds
            with pytest.raises(PastPivot, match="past its pivot"):
                await engine.cancel(saga_id, "too late")
            fraud.blocked.discard("late")
            await engine.retry_step(saga_id, "fraud", reason="unblocked")
            await eventually(lambda: _status(worker, saga_id, SagaStatus.COMPLETED))
            assert fraud.captures["late"] == 1
            assert [c.subject for c in alpha if c.saga_id == saga_id] == ["Hold"]
            kinds = [e.kind for e in await engine.history(saga_id)]
            assert "compensation_started" not in kinds


class OrderRequested(BaseModel):
    order_id: str
    customer: str


requested = KafkaTrigger(
    topic="",  # set per test below
    saga=CheckFraud,
    message=OrderRequested,
    to_input=lambda m: Order(customer=m.customer),
    idempotency_key=lambda m: f"order-{m.order_id}",
)


async def test_trigger_starts_one_saga_per_message_even_when_redelivered(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    fraud = FraudServer()
    async with serve(fraud.app) as url:
        settings = _settings(pg, kafka_bootstrap, unique_id, url)
        topic = f"t{unique_id}.orders.requested"
        trigger = KafkaTrigger(
            topic=topic,
            saga=requested.saga,
            message=requested.message,
            to_input=requested.to_input,
            idempotency_key=requested.idempotency_key,
        )
        async with (
            SagaWorker(settings, [CheckFraud], triggers=[trigger]) as worker,
            fake_participant(settings, "alpha"),
        ):
            producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
            await producer.start()
            try:
                # The first "1" comes from a traced producer; the "2"s with a garbled header.
                traced = [("traceparent", TRACEPARENT.encode())]
                garbled = [("traceparent", b"00-nonsense")]
                for order_id in ("1", "2", "1", "2", "1"):  # duplicates, as a redelivery would
                    await producer.send_and_wait(
                        topic,
                        orjson.dumps({"order_id": order_id, "customer": "c"}),
                        key=order_id.encode(),  # one order's messages stay in order
                        headers=traced if order_id == "1" else garbled,
                    )
                    traced = []
                await producer.send_and_wait(topic, b"{nope")
                await producer.send_and_wait(topic, orjson.dumps({"order_id": 3}))
                # An input Postgres could not store: the trigger record itself is refused.
                nul = {"order_id": "4", "customer": "c\u0000"}
                await producer.send_and_wait(topic, orjson.dumps(nul))
            finally:
                await producer.stop()
            assert worker.engine is not None
            engine, parts = worker.engine, worker.parts

            async def done() -> bool:
                sagas = await parts.store.list_sagas()
                return len(sagas) == 2 and all(s.status == SagaStatus.COMPLETED for s in sagas)

            await eventually(done)
            dlq = await read_topic(settings.kafka, f"t{unique_id}.dlq", 3)
            assert sorted(dict(r.headers)["dlq_reason"].decode() for r in dlq) == [
                "invalid_body",
                "malformed_json",
                "unstorable_value",
            ]
            assert {dict(r.headers)["dlq_topic"].decode() for r in dlq} == {topic}
            sagas = await parts.store.list_sagas()
            assert sorted(s.idempotency_key or "" for s in sagas) == ["order-1", "order-2"]
            # The last duplicates may still be in flight when both sagas are done.
            await eventually(lambda: parts.stats.counts["start_deduplicated"] == 3)
            # The saga joined the trace of the message that started it (a garbled
            # traceparent is ignored, not an error).
            contexts = {}
            origins = {}
            for saga in sagas:
                started = (await engine.history(saga.saga_id))[0]
                assert isinstance(started, SagaStarted)
                contexts[saga.idempotency_key] = started.trace_context.get("traceparent", "")
                assert started.trigger is not None
                origins[saga.idempotency_key] = started.trigger
            # Each saga records the trigger record that started it: the first of its
            # order's messages (the duplicates after it were deduplicated), so the first
            # message sent is the one order-1 points at.
            assert {o.topic for o in origins.values()} == {topic}
            assert origins["order-1"].offset == 0
            assert (origins["order-2"].partition, origins["order-2"].offset) != (
                origins["order-1"].partition,
                0,
            )
            assert contexts["order-1"].split("-")[1] == TRACEPARENT.split("-")[1]
            assert contexts["order-2"] == ""


async def test_a_malformed_trigger_message_counts_in_the_metrics_dead_lettered(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    # No HTTP step runs here: the endpoint is never called.
    settings = _settings(pg, kafka_bootstrap, unique_id, "http://127.0.0.1:9")
    topic = f"t{unique_id}.orders.requested"
    trigger = KafkaTrigger(
        topic=topic,
        saga=requested.saga,
        message=requested.message,
        to_input=requested.to_input,
        idempotency_key=requested.idempotency_key,
    )
    async with SagaWorker(settings, [CheckFraud], triggers=[trigger]) as worker:
        assert worker.engine is not None
        assert worker.admin_url is not None
        before = worker.parts.stats.counts["dead_lettered"]
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
        await producer.start()
        try:
            await producer.send_and_wait(topic, b"{nope")
        finally:
            await producer.stop()

        async with httpx.AsyncClient(base_url=worker.admin_url) as http:

            async def metrics() -> dict[str, Any]:
                response = await http.get("/metrics")
                assert response.status_code == 200, response.text
                body: dict[str, Any] = response.json()
                return body

            async def counted() -> bool:
                return bool((await metrics())["dead_lettered"] == before + 1)

            await eventually(counted)
            body = await metrics()
        assert body["counters"]["dead_lettered_malformed_json"] == 1
        [dead] = await read_topic(settings.kafka, f"t{unique_id}.dlq", 1)
        assert dict(dead.headers)["dlq_topic"].decode() == topic
