"""The drill's Kafka links (scenarios ``engine-link-cut``, ``participant-link-cut``,
``slow-link``): one :class:`KafkaLinkProxy` for the engines and one for the participants,
each its processes' only way to the brokers, so that one group's link is cut while the
other's is not.

A Kafka client connects to a bootstrap address, then to the addresses the brokers
advertise in their answers (Metadata: every broker; FindCoordinator: a group's or a
transaction's coordinator). The proxy reads the protocol's frames and rewrites those
addresses to listeners of its own (one per broker, opened as brokers appear), so that a
client never reaches a broker around it; it caps the versions the broker offers for
those two requests (its ApiVersions answer) to the last ones before the protocol's
compact encodings, the ones it reads. Any broker on a PLAINTEXT listener will do: the
drill needs no listener configured for it."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from saga_engine.cli._drill_proxy import LinkProxy
from saga_engine.kernel._errors import KafkaProtocolError

__all__ = ["KafkaLinkProxy", "KafkaProtocolError", "broker_addresses", "cap_versions", "rewrite"]

METADATA, FIND_COORDINATOR, API_VERSIONS = 3, 10, 18
#: The newest version of each request whose answer the proxy reads (the one before the
#: compact encodings).
CAPS = {METADATA: 8, FIND_COORDINATOR: 2}
#: A frame larger than this is not Kafka talking (the broker's own default bound).
_MAX_FRAME = 100 * 1024 * 1024


Address = tuple[str, int]


@dataclass(frozen=True)
class _Span:
    """A broker address in an answer: the host string and the port after it."""

    start: int
    end: int
    address: Address


class _Reader:
    def __init__(self, data: bytes, at: int) -> None:
        self.data = data
        self.at = at

    def take(self, fmt: str) -> int:
        size = struct.calcsize(fmt)
        if self.at + size > len(self.data):
            raise KafkaProtocolError("truncated answer")
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += size
        return int(value)

    def string(self) -> str | None:
        size = self.take(">h")
        if size < 0:
            return None
        if self.at + size > len(self.data):
            raise KafkaProtocolError("truncated answer")
        value = self.data[self.at : self.at + size].decode(errors="replace")
        self.at += size
        return value

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            byte = self.take(">B")
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7

    def skip_tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()  # the tag
            size = self.uvarint()  # read before ``at`` is: it moves ``at``
            self.at += size


def _address_at(r: _Reader) -> _Span:
    start = r.at
    host = r.string() or ""
    port = r.take(">i")
    return _Span(start, r.at, (host, port))


def _spans(api_key: int, version: int, body: bytes) -> list[_Span]:
    """The broker addresses in an answer's body (after the correlation id)."""
    if version > CAPS[api_key]:
        raise KafkaProtocolError(
            f"api {api_key} v{version} (the proxy reads up to v{CAPS[api_key]})"
        )
    r = _Reader(body, 0)
    if api_key == FIND_COORDINATOR:
        if version >= 1:
            r.take(">i")  # throttle_time_ms
        error = r.take(">h")
        if version >= 1:
            r.string()  # error_message
        r.take(">i")  # node_id
        span = _address_at(r)
        return [] if error else [span]
    if version >= 3:
        r.take(">i")  # throttle_time_ms
    spans = []
    for _ in range(r.take(">i")):
        r.take(">i")  # node_id
        spans.append(_address_at(r))
        if version >= 1:
            r.string()  # rack
    return spans


def broker_addresses(api_key: int, version: int, body: bytes) -> list[Address]:
    """The broker addresses a Metadata or FindCoordinator answer's body names."""
    return [s.address for s in _spans(api_key, version, body)]


def rewrite(api_key: int, version: int, body: bytes, to: Callable[[Address], Address]) -> bytes:
    """The answer's body with each broker address replaced by ``to(address)``."""
    out = bytearray()
    at = 0
    for span in _spans(api_key, version, body):
        host, port = to(span.address)
        encoded = host.encode()
        out += body[at : span.start] + struct.pack(">h", len(encoded)) + encoded
        out += struct.pack(">i", port)
        at = span.end
    return bytes(out + body[at:])


def cap_versions(version: int, body: bytearray) -> None:
    """Lowers, in place, the newest versions an ApiVersions answer offers for the
    requests whose answers the proxy rewrites, to :data:`CAPS`."""
    r = _Reader(bytes(body), 0)
    if r.take(">h"):  # an error: the client asks again (version 0)
        return
    count = r.uvarint() - 1 if version >= 3 else r.take(">i")
    for _ in range(max(0, count)):
        key = r.take(">h")
        r.take(">h")  # min_version
        newest = r.take(">h")
        if key in CAPS and newest > CAPS[key]:
            struct.pack_into(">h", body, r.at - 2, CAPS[key])
        if version >= 3:
            r.skip_tags()


async def _frames(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    """Each frame's payload (the size prefix read off), until the connection ends."""
    while True:
        try:
            head = await reader.readexactly(4)
        except asyncio.IncompleteReadError:
            return
        (size,) = struct.unpack(">i", head)
        if not 0 <= size <= _MAX_FRAME:
            raise KafkaProtocolError(f"a frame of {size} bytes")
        yield await reader.readexactly(size)


def _framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


class KafkaLinkProxy(LinkProxy):
    """A group's link to the brokers: its processes' ``SAGA_KAFKA__BOOTSTRAP_SERVERS`` is
    :attr:`bootstrap_servers`."""

    def __init__(self, bootstrap_servers: str) -> None:
        super().__init__()
        self._bootstrap = [_parse(a) for a in bootstrap_servers.split(",") if a.strip()]
        self._ports: dict[Address, int] = {}
        self._opening = asyncio.Lock()
        #: The first answer the proxy could not read (the drill reports it).
        self.problem: str | None = None

    async def start(self) -> None:
        for address in self._bootstrap:
            await self._port(address)

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{self._ports[a]}" for a in self._bootstrap)

    async def _port(self, address: Address) -> int:
        async with self._opening:
            if address not in self._ports:
                self._ports[address] = await self.listen(*address)
            return self._ports[address]

    async def _link(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
    ) -> None:
        asked: dict[int, tuple[int, int]] = {}  # correlation id -> (api key, version)
        await asyncio.gather(
            self.forward(self._requests(reader, asked), up_writer),
            self.forward(self._answers(up_reader, asked), writer),
        )

    async def _requests(
        self, reader: asyncio.StreamReader, asked: dict[int, tuple[int, int]]
    ) -> AsyncIterator[bytes]:
        async for payload in self._guarded(reader):
            if len(payload) >= 8:
                key, version, correlation = struct.unpack_from(">hhi", payload)
                if key in (METADATA, FIND_COORDINATOR, API_VERSIONS):
                    asked[correlation] = (key, version)
            yield _framed(payload)

    async def _answers(
        self, reader: asyncio.StreamReader, asked: dict[int, tuple[int, int]]
    ) -> AsyncIterator[bytes]:
        async for payload in self._guarded(reader):
            (correlation,) = struct.unpack_from(">i", payload)
            found = asked.pop(correlation, None)
            if found is not None:
                try:
                    payload = payload[:4] + await self._rewritten(*found, payload[4:])
                except KafkaProtocolError as exc:
                    # Passed on as it is, the client would reach a broker around the proxy.
                    self.problem = self.problem or f"cannot read a broker's answer: {exc}"
                    return
            yield _framed(payload)

    async def _guarded(self, reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
        """The frames; one the proxy cannot read ends the connection and is reported."""
        try:
            async for payload in _frames(reader):
                yield payload
        except KafkaProtocolError as exc:
            self.problem = self.problem or str(exc)

    async def _rewritten(self, key: int, version: int, body: bytes) -> bytes:
        if key == API_VERSIONS:
            capped = bytearray(body)
            with contextlib.suppress(KafkaProtocolError):  # then the client's own problem
                cap_versions(version, capped)
            return bytes(capped)
        ports = {a: await self._port(a) for a in broker_addresses(key, version, body)}
        return rewrite(key, version, body, lambda a: ("127.0.0.1", ports[a]))


def _parse(address: str) -> Address:
    host, _, port = address.strip().rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{address!r}: a Kafka bootstrap address is host:port")
    return host.strip("[]"), int(port)
