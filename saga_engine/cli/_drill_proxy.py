"""The drill's TCP proxies: asyncio, bound to loopback only. A :class:`LinkProxy` carries a
group of processes' connections to their servers (one listener per server) and injects
the link faults: :meth:`LinkProxy.cut` drops every open connection and, for the stall,
holds new ones unanswered (neither refused nor forwarded), as a network partition does,
then forwards them again; :meth:`LinkProxy.stop` drops them and closes new ones at once,
as the port of a server that stopped does; :meth:`LinkProxy.slow` delivers everything
late, in order.

:class:`PgProxy` is the engines' link to Postgres (scenario ``pg-cut``) or to one shard
(``shard-down``); the Kafka links (``_drill_kafka``) are link proxies that read the
protocol's frames."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass

__all__ = ["LinkProxy", "LinkStats", "PgProxy"]

_CHUNK = 64 * 1024
#: Chunks read ahead of a slow link's delivery, per direction of a connection.
_IN_FLIGHT = 256


@dataclass
class LinkStats:
    """What a link proxy saw: counted, so a drill shows its faults were really felt."""

    connections: int = 0  # accepted from the group's processes
    cuts: int = 0
    dropped: int = 0  # open connections a cut dropped
    held: int = 0  # connections that arrived during a stall (answered only after it)
    refused: int = 0  # connections closed at once while the server was away (``stop``)
    forwarded_after_cut: int = 0  # connections carried to the server after the last stall
    delayed: int = 0  # chunks (Kafka: frames) a slow link delivered late

    def as_json(self) -> dict[str, int]:
        return asdict(self)


class LinkProxy:
    def __init__(self) -> None:
        self.stats = LinkStats()
        self.latency_s = 0.0
        self._servers: list[asyncio.Server] = []
        self._clients: set[asyncio.StreamWriter] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._serving: set[asyncio.Task[None]] = set()
        self._open = asyncio.Event()
        self._open.set()
        self._refusing = False

    async def listen(self, host: str, port: int) -> int:
        """A listener on loopback whose connections go to ``host:port``; its port."""

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            self._serving.add(task)
            try:
                await self._serve(reader, writer, (host, port))
            finally:
                self._serving.discard(task)

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        self._servers.append(server)
        local: int = server.sockets[0].getsockname()[1]
        return local

    async def close(self) -> None:
        self._open.set()
        self._refusing = False
        self.latency_s = 0.0
        for server in self._servers:
            server.close()
        self._drop()
        # Bounded: a client holding its socket must not keep the drill from ending.
        if self._serving:
            await asyncio.wait(set(self._serving), timeout=5)
        for server in self._servers:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), 5)

    async def cut(self, stall_s: float) -> None:
        """Drops every connection, then stalls new ones for ``stall_s`` seconds."""
        self.stats.cuts += 1
        self._open.clear()
        self.stats.dropped += self._drop()
        try:
            await asyncio.sleep(stall_s)
        finally:
            self.stats.forwarded_after_cut = 0
            self._open.set()

    async def stop(self, for_s: float) -> None:
        """Drops every connection, then closes new ones at once for ``for_s`` seconds (a
        stopped server: its clients fail fast and try again), then forwards again."""
        self.stats.cuts += 1
        self._refusing = True
        self.stats.dropped += self._drop()
        try:
            await asyncio.sleep(for_s)
        finally:
            self.stats.forwarded_after_cut = 0
            self._refusing = False

    async def slow(self, latency_s: float, for_s: float) -> None:
        """Delivers every chunk ``latency_s`` late, each way, for ``for_s`` seconds."""
        self.latency_s = latency_s
        try:
            await asyncio.sleep(for_s)
        finally:
            self.latency_s = 0.0

    def _drop(self) -> int:
        dropped = len(self._clients)
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()
        self._clients.clear()
        return dropped

    async def _serve(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        upstream: tuple[str, int],
    ) -> None:
        self.stats.connections += 1
        if self._refusing:
            self.stats.refused += 1
            writer.transport.abort()
            return
        self._writers.add(writer)
        self._clients.add(writer)
        try:
            if not self._open.is_set():
                self.stats.held += 1
            await self._open.wait()  # a stalled connection waits here, unanswered
            if writer.is_closing():
                return
            up_reader, up_writer = await asyncio.open_connection(*upstream)
        except OSError:
            writer.transport.abort()
            self._writers.discard(writer)
            self._clients.discard(writer)
            return
        self.stats.forwarded_after_cut += 1
        self._writers.add(up_writer)
        try:
            await self._link(reader, writer, up_reader, up_writer)
        finally:
            for w in (writer, up_writer):
                w.transport.abort()
                self._writers.discard(w)
            self._clients.discard(writer)

    async def _link(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
    ) -> None:
        """Carries one connection both ways (bytes as they come; a subclass may read
        its protocol's frames instead)."""
        await asyncio.gather(
            self.forward(_chunks(reader), up_writer), self.forward(_chunks(up_reader), writer)
        )

    async def forward(self, chunks: AsyncIterator[bytes], writer: asyncio.StreamWriter) -> None:
        """Writes each chunk, ``latency_s`` after it was read while the link is slow, in
        order, without one chunk's delay holding up the reading of the next."""
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(_IN_FLIGHT)

        async def read() -> None:
            # Cancelled (the writing ended first), it puts nothing more.
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                async for data in chunks:
                    await queue.put((time.monotonic() + self.latency_s, data))
            await queue.put(None)

        reading = asyncio.create_task(read())
        try:
            while (item := await queue.get()) is not None:
                due, data = item
                if (wait := due - time.monotonic()) > 0:
                    self.stats.delayed += 1
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            reading.cancel()
            writer.transport.abort()


async def _chunks(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    while data := await reader.read(_CHUNK):
        yield data


class PgProxy(LinkProxy):
    """The engines' link to Postgres (their DSN points at :attr:`port`)."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        super().__init__()
        self.upstream = (upstream_host, upstream_port)
        self.port = 0

    @property
    def cuts(self) -> int:
        return self.stats.cuts

    async def start(self) -> None:
        self.port = await self.listen(*self.upstream)
