"""The drill's TCP proxy between the engines and Postgres (scenario ``pg-cut``): asyncio,
bound to loopback only. :meth:`PgProxy.cut` drops every open connection and, for the
stall, holds new ones unanswered (neither refused nor forwarded), as a network partition
does; after the stall they are forwarded again."""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["PgProxy"]

_CHUNK = 64 * 1024


class PgProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._open = asyncio.Event()
        self._open.set()
        self.cuts = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        self._open.set()
        if self._server is not None:
            self._server.close()
        self._drop()
        if self._server is not None:
            # Bounded: a client holding its socket must not keep the drill from ending.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def cut(self, stall_s: float) -> None:
        """Drops every connection, then stalls new ones for ``stall_s`` seconds."""
        self.cuts += 1
        self._open.clear()
        self._drop()
        try:
            await asyncio.sleep(stall_s)
        finally:
            self._open.set()

    def _drop(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            await self._open.wait()  # a stalled connection waits here, unanswered
            if writer.is_closing():
                return
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.transport.abort()
            self._writers.discard(writer)
            return
        self._writers.add(up_writer)
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                w.transport.abort()
                self._writers.discard(w)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
    writer.transport.abort()
