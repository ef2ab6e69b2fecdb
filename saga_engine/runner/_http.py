"""HTTP steps: the engine calls the service itself, with httpx, and feeds back the reply.

A command addressed to ``http:<endpoint>`` is an HTTP request (``HttpRequest``). The
caller sends it with an ``Idempotency-Key`` header equal to the command id (the same on
every re-send) and turns the response into a reply for the engine:

- 2xx: ``success``, with the JSON body as payload;
- another 4xx: ``failure`` (a refusal: the service did not apply it);
- connection errors, 408, 429, 5xx: retried with capped exponential back-off and jitter,
  same key, for ``retry_window_s``; after that no reply is given, and the step's attempt
  timeout re-sends it under the same key, per its retry policy.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

import httpx
from opentelemetry import context as otel_context

from saga_engine.core.authoring._context import HTTP_PREFIX, HttpRequest
from saga_engine.core.history._decision import OutboundCommand
from saga_engine.kernel._errors import SagaError
from saga_engine.kernel._retry import HANDLER
from saga_engine.kernel._settings import HttpSettings
from saga_engine.telemetry._telemetry import Telemetry, extract
from saga_engine.transport._bus import CommandSender, PipelinedSender, handed_over

if TYPE_CHECKING:
    from saga_engine.runner._engine import Engine

log = logging.getLogger("saga_engine.http")

_RETRY_STATUS = {408, 429}
#: Where ``http_step(..., completion="callback")`` tells its service to POST its result.
CALLBACK_HEADER = "Saga-Callback-Url"


class HttpCaller:
    """The CommandSender for ``http:`` steps. Requests run as background tasks."""

    def __init__(
        self,
        settings: HttpSettings,
        client: httpx.AsyncClient | None = None,
        *,
        telemetry: Telemetry | None = None,
    ) -> None:
        self._settings = settings
        self._client = client or httpx.AsyncClient(timeout=settings.request_timeout_s)
        if telemetry is not None:
            telemetry.instrument_client(self._client)
        self._engine: Engine | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def bind(self, engine: Engine) -> None:
        self._engine = engine

    async def send_command(self, command: OutboundCommand) -> None:
        endpoint = command.participant.removeprefix(HTTP_PREFIX)
        if endpoint not in self._settings.endpoints:
            # Answered at once: the saga learns that the step cannot work here.
            known = ", ".join(sorted(self._settings.endpoints)) or "none"
            self._spawn(
                self._reply(
                    command, "failure", {}, f"no HTTP endpoint {endpoint!r} (known: {known})"
                )
            )
            return
        self._spawn(self._call(command, self._settings.endpoints[endpoint]))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._tasks.discard)

    async def _call(self, command: OutboundCommand, base_url: str) -> None:
        request = HttpRequest.model_validate(command.payload)
        url = base_url.rstrip("/") + request.path
        headers = {"Idempotency-Key": command.command_id, "X-Saga-Id": command.saga_id}
        if request.callback_url is not None:  # completion="callback": it answers there
            headers[CALLBACK_HEADER] = request.callback_url
        # The step span's W3C context: the service's server span becomes its child (or,
        # with the httpx instrumentation, the child of the client span made current
        # below, which replaces these headers with its own context).
        for name in ("traceparent", "tracestate"):
            if name in command.trace_context:
                headers[name] = command.trace_context[name]
        # This runs as its own task, so the attached context is this call's alone.
        otel_context.attach(extract(command.trace_context))
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self._settings.retry_window_s
        backoff = HANDLER.backoff()
        while True:
            try:
                response = await self._client.request(
                    request.method, url, json=request.body, headers=headers
                )
            except httpx.HTTPError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if response.is_success:
                    await self._reply(command, "success", _json_object(response), None)
                    return
                if 400 <= response.status_code < 500 and response.status_code not in _RETRY_STATUS:
                    await self._reply(command, "failure", _json_object(response), _detail(response))
                    return
                problem = f"HTTP {response.status_code}"
            delay = backoff.next_delay()
            if loop.time() + delay > give_up:
                log.warning(
                    "HTTP step %s to %s: %s; leaving it to the step timeout",
                    command.step,
                    url,
                    problem,
                )
                return
            await asyncio.sleep(delay)

    async def _reply(
        self, command: OutboundCommand, outcome: str, payload: dict[str, Any], error: str | None
    ) -> None:
        if self._engine is None:
            raise RuntimeError("HttpCaller is not bound to an engine")
        try:
            await self._engine.reply(command.saga_id, command.command_id, outcome, payload, error)
        except SagaError as exc:  # stale owner, saga ended: the engine already said why
            log.info("HTTP reply for saga %s not applied: %s", command.saga_id, exc)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._client.aclose()


def _json_object(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {"text": response.text[:2000]} if response.text else {}
    return body if isinstance(body, dict) else {"value": body}


def _detail(response: httpx.Response) -> str:
    body = _json_object(response)
    detail = body.get("detail") or body.get("text") or response.reason_phrase
    return f"HTTP {response.status_code}: {detail}"


class RoutingSender:
    """Sends ``http:`` steps with the HTTP caller and everything else to Kafka."""

    def __init__(self, kafka: CommandSender, http: HttpCaller) -> None:
        self._kafka = kafka
        self._http = http
        # Checked once: a runtime protocol check costs microseconds on every command.
        self._pipelined = kafka if isinstance(kafka, PipelinedSender) else None

    async def send_command(self, command: OutboundCommand) -> None:
        if command.participant.startswith(HTTP_PREFIX):
            await self._http.send_command(command)
        else:
            await self._kafka.send_command(command)

    async def start_command(self, command: OutboundCommand) -> Awaitable[None]:
        if self._pipelined is not None and not command.participant.startswith(HTTP_PREFIX):
            return await self._pipelined.start_command(command)
        await self.send_command(command)
        return handed_over()
