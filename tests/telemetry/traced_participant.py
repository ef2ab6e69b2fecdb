"""A participant process for the cross-process trace test.

``python -m tests.telemetry.traced_participant stock|payments`` with the SAGA_* settings
and OTEL_EXPORTER_OTLP_ENDPOINT in its environment. It sets OpenTelemetry up exactly as
a service would (``configure_from_env``: OTLP/HTTP export, asyncpg instrumentation),
handles its command with a write to its own table, and ``payments`` also serves an
instrumented FastAPI app for the saga's HTTP step. It prints ``ready <port>`` once it
consumes (port 0 when it serves no HTTP), and stops on SIGTERM, flushing its spans.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import sys

import uvicorn
from fastapi import FastAPI
from opentelemetry import trace
from pydantic import BaseModel

from saga_engine import Settings
from saga_engine.participant import Participant, Transaction
from saga_engine.telemetry import configure_from_env, default_telemetry
from tests.waiting import eventually


class Reserve(BaseModel):
    n: int


class Charge(BaseModel):
    n: int


class Receipt(BaseModel):
    n: int


def build(name: str, settings: Settings) -> Participant:
    participant = Participant(name, settings, relay_interval_s=0.2)

    async def record(tx: Transaction, n: int) -> Receipt:
        await tx.execute("CREATE TABLE IF NOT EXISTS ledger (command_id text PRIMARY KEY, n int)")
        await tx.execute("INSERT INTO ledger VALUES ($1, $2)", tx.command_id, n)
        return Receipt(n=n)

    if name == "stock":

        @participant.handles(Reserve)
        async def reserve(cmd: Reserve, tx: Transaction) -> Receipt:
            return await record(tx, cmd.n)

    else:

        @participant.handles(Charge)
        async def charge(cmd: Charge, tx: Transaction) -> Receipt:
            return await record(tx, cmd.n)

    return participant


def risk_app() -> FastAPI:
    app = FastAPI()

    @app.post("/risk")
    async def risk(body: dict[str, int]) -> dict[str, int]:
        return {"score": body.get("n", 0) * 2}

    default_telemetry().instrument_app(app)
    return app


async def main(name: str) -> None:
    assert configure_from_env(service_name=name), "OTEL_EXPORTER_OTLP_ENDPOINT is not set"
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    server: uvicorn.Server | None = None
    serving: asyncio.Task[None] | None = None
    port = 0
    async with build(name, Settings()):
        if name == "payments":
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            server = uvicorn.Server(uvicorn.Config(risk_app(), log_level="warning", lifespan="off"))
            serving = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
            await eventually(
                lambda: server.started, timeout=10, interval=0.01, what="the risk server to start"
            )
        print(f"ready {port}", flush=True)
        await stop.wait()
        if server is not None and serving is not None:
            server.should_exit = True
            await serving
    provider = trace.get_tracer_provider()
    provider.shutdown()  # type: ignore[attr-defined]  # the SDK's: flushes the exporter


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
