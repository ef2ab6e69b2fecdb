"""Serving the admin API with uvicorn on the engine's own event loop.

::

    app = create_admin_app(engine, settings, parts=parts, start_saga=client.start)
    server = await serve_admin(app, settings)   # bound and accepting when it returns
    ...
    await server.stop()

The server leaves signal handling and logging configuration to the host process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Generator

import uvicorn
from fastapi import FastAPI

from saga_engine.admin._auth import auth_required
from saga_engine.kernel._errors import AdminConfigError
from saga_engine.kernel._settings import Settings
from saga_engine.telemetry._telemetry import detach_from_trace

log = logging.getLogger("saga_engine.admin")


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # The engine process owns SIGINT/SIGTERM: it stops the server as part of its own
        # orderly shutdown, so uvicorn must not install (and later re-raise) handlers.
        yield


class AdminServer:
    """A running admin server. ``port`` is the bound one (useful with port 0)."""

    def __init__(self, server: uvicorn.Server, task: asyncio.Task[None], sock: socket.socket):
        self.server = server
        self._task = task
        self._socket = sock
        name = sock.getsockname()
        self.host: str = str(name[0])
        self.port: int = int(name[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def running(self) -> bool:
        return not self._task.done()

    async def stop(self, timeout: float = 10.0) -> None:  # noqa: ASYNC109
        """Stops accepting, lets requests in flight finish (up to ``timeout``), closes."""
        self.server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except TimeoutError:
            self.server.force_exit = True
            await asyncio.wait({self._task}, timeout=2)
            if not self._task.done():
                self._task.cancel()
        finally:
            self._socket.close()

    async def __aenter__(self) -> AdminServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def _bind(host: str, port: int) -> socket.socket:
    host = host.strip().strip("[]")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise AdminConfigError(f"cannot resolve the admin host {host!r}: {exc}") from exc
    family, kind, proto, _, address = infos[0]
    # The protocol number matters: asyncio sets TCP_NODELAY on accepted connections only
    # when the listening socket says IPPROTO_TCP (without it, replies wait ~40 ms on
    # delayed ACKs).
    sock = socket.socket(family, kind, proto or socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise AdminConfigError(
            f"cannot serve the admin API on {host}:{port}: {exc.strerror or exc}; choose "
            "another SAGA_ADMIN__PORT (0 picks a free one) or SAGA_ADMIN__HOST"
        ) from exc
    return sock


async def serve_admin(app: FastAPI, settings: Settings) -> AdminServer:
    """Binds ``settings.admin.host:port`` and serves ``app`` on the running loop.

    Returns once the server accepts connections. Raises InsecureAdminBinding when the
    host is beyond loopback and no token is configured, and AdminConfigError when the
    address cannot be bound.
    """
    admin = settings.admin
    auth_required(admin)  # the app checks too; refuse here whatever app we are given
    sock = _bind(admin.host, admin.port)
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_config=None,  # the host process configures logging
        access_log=False,
        server_header=False,
        proxy_headers=False,
        timeout_graceful_shutdown=5,
    )
    server = _Server(config)

    async def serve() -> None:
        # Requests are traced (their queries too), each in its caller's trace or a new
        # one, never in the trace of whatever span was current when the server started.
        detach_from_trace(suppress_queries=False)
        await server.serve(sockets=[sock])

    task = asyncio.get_running_loop().create_task(serve(), name="saga-admin-http")
    while not server.started:
        if task.done():
            sock.close()
            exc = task.exception()
            raise AdminConfigError(f"the admin server did not start: {exc!r}") from exc
        await asyncio.sleep(0.01)
    handle = AdminServer(server, task, sock)
    log.info("admin API listening on %s", handle.url)
    return handle
