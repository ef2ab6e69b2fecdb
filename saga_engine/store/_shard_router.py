"""What a sharded store does with its shards: opens each on first use, routes a call to
one, fans a call out to several, and turns a shard's connection trouble into
``ShardUnavailable`` naming it.

One home for the two answers a shard that does not answer gets: a call routed to it (one
saga's operation) raises ``ShardUnavailable``; a read fanned out across shards skips it
and says so through ``missed`` (``_coverage``), failing only when no shard answered.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from typing import TypeVar

from saga_engine.kernel._errors import ShardMapError, ShardUnavailable
from saga_engine.kernel._shards import ShardMap
from saga_engine.store._coverage import missed
from saga_engine.store._pgbase import transient_cause
from saga_engine.store._store import EventStore
from saga_engine.telemetry._health import HealthBoard

__all__ = ["ShardOpener", "ShardRouter"]

#: Opens one shard's store (``PostgresEventStore.connect`` on its DSN, in production).
ShardOpener = Callable[[], Awaitable[EventStore]]

T = TypeVar("T")


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


class ShardRouter:
    """The shards of a sharded store: ``openers`` maps each shard the map names to what
    opens its store; none is opened before a call needs it."""

    def __init__(
        self,
        shard_map: ShardMap,
        openers: Mapping[str, ShardOpener],
        *,
        health: HealthBoard | None = None,
    ) -> None:
        missing = [n for n in shard_map.names if n not in openers]
        unknown = sorted(n for n in openers if n not in shard_map.names)
        if missing or unknown:
            raise ShardMapError(
                "the shard map and the shards' stores disagree: "
                + "; ".join(
                    part
                    for part in (
                        f"no store for {', '.join(missing)}" if missing else "",
                        f"stores the map does not name: {', '.join(unknown)}" if unknown else "",
                    )
                    if part
                )
            )
        self._map = shard_map
        self._openers = dict(openers)
        self._opened: dict[str, EventStore] = {}
        self._opening = {name: asyncio.Lock() for name in shard_map.names}
        self._closed = False
        #: Where a shard that does not answer shows (``/health``: degraded, naming it),
        #: until a call to it succeeds again.
        self._health = health
        #: The shards reported down: a call that succeeds clears only these (every
        #: routed call passes here, so the common case is one set lookup).
        self._reported: set[str] = set()

    @property
    def shard_map(self) -> ShardMap:
        return self._map

    def adopt(self, shard_map: ShardMap) -> bool:
        """Routes by ``shard_map`` from now on if its epoch is above the one in force
        (a move ended); whether it did. Its shards must be those this store opens
        (``ShardMapError`` otherwise: the settings lack a shard a move created)."""
        if shard_map.epoch <= self._map.epoch:
            return False
        unknown = [n for n in shard_map.names if n not in self._openers]
        if unknown or shard_map.partitions != self._map.partitions:
            raise ShardMapError(
                f"the shard map of epoch {shard_map.epoch} cannot be followed: "
                + (
                    f"no store for shard(s) {', '.join(unknown)} (add them to SAGA_PG__SHARDS)"
                    if unknown
                    else f"it divides {shard_map.partitions} partitions, not {self._map.partitions}"
                )
            )
        self._map = shard_map
        return True

    @property
    def opened(self) -> tuple[str, ...]:
        """The shards whose stores are open, in the map's order."""
        return tuple(n for n in self._map.names if n in self._opened)

    async def shard(self, name: str) -> EventStore:
        """The shard's store, opened on first use (once, however many ask at a time).
        Raises ``ShardUnavailable`` if it cannot be opened (asked again next time)."""
        store = self._opened.get(name)
        if store is not None:
            return store
        async with self._opening[name]:
            store = self._opened.get(name)
            if store is None:
                if self._closed:
                    raise ShardUnavailable(name, "the sharded store is closed")
                store = await self._openers[name]()
                if self._closed:  # closed while it opened
                    await store.close()
                    raise ShardUnavailable(name, "the sharded store is closed")
                self._opened[name] = store
        return store

    async def on_shard(self, name: str, call: Callable[[EventStore], Awaitable[T]]) -> T:
        """``call`` on the shard's store; its connection trouble (or its opener's) is
        ``ShardUnavailable`` naming it, any other error passes unchanged."""
        try:
            result = await call(await self.shard(name))
        except ShardUnavailable as exc:
            self._down(name, exc)
            raise
        except Exception as exc:
            if transient_cause(exc) is None:
                raise
            down = ShardUnavailable(name, _reason(exc))
            self._down(name, down)
            raise down from exc
        if name in self._reported:
            self._reported.discard(name)
            if self._health is not None:
                self._health.clear(f"shard:{name}")
        return result

    def _down(self, name: str, exc: ShardUnavailable) -> None:
        if self._health is not None:
            self._reported.add(name)
            self._health.report(f"shard:{name}", f"{exc}; its sagas wait, the others go on")

    async def on_saga(self, saga_id: str, call: Callable[[EventStore], Awaitable[T]]) -> T:
        """``call`` on the store of the saga's shard (its inbox partition's)."""
        return await self.on_shard(self._map.shard_of_saga(saga_id), call)

    async def on_shards(
        self,
        names: Iterable[str],
        call: Callable[[str, EventStore], Awaitable[T]],
        *,
        partial: bool = True,
    ) -> dict[str, T]:
        """``call`` on each shard's store at once, by shard (those that answered).

        ``partial``: a shard that does not answer is left out and reported with
        ``missed``; ``ShardUnavailable`` only when none of them answered. Otherwise
        (a read whose caller acts on all of it) the first one that does not answer
        raises. Errors other than a shard's unavailability pass unchanged."""
        asked = list(dict.fromkeys(names))
        results = await asyncio.gather(
            *(self.on_shard(n, functools.partial(call, n)) for n in asked),
            return_exceptions=True,
        )
        out: dict[str, T] = {}
        down: dict[str, ShardUnavailable] = {}
        for name, result in zip(asked, results, strict=True):
            if isinstance(result, ShardUnavailable):
                down[name] = result
            elif isinstance(result, BaseException):
                raise result
            else:
                out[name] = result
        if down and (not partial or not out):
            raise _unavailable(down)
        for name, exc in down.items():
            missed(name, str(exc))
        return out

    async def on_every_shard(
        self, call: Callable[[str, EventStore], Awaitable[T]], *, partial: bool = True
    ) -> dict[str, T]:
        return await self.on_shards(self._map.names, call, partial=partial)

    def plan(
        self, partitions: Collection[int] | None, partition_count: int
    ) -> dict[str, Collection[int] | None]:
        """The shards a read of ``partitions`` (of ``partition_count``) asks, each with
        the partitions to ask it of: only those holding them when the count is the map's,
        every shard with all of them otherwise (a count the map does not divide)."""
        if partitions is None:
            return dict.fromkeys(self._map.names)
        wanted = set(partitions)
        if partition_count == self._map.partitions and all(
            0 <= p < partition_count for p in wanted
        ):
            return dict(self._map.by_shard(wanted))
        return dict.fromkeys(self._map.names, wanted)

    async def close(self) -> None:
        """Closes every store opened (each, even if one fails); later calls raise
        ``ShardUnavailable``."""
        self._closed = True
        opened, self._opened = self._opened, {}
        results = await asyncio.gather(
            *(store.close() for store in opened.values()), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result


def _unavailable(down: Mapping[str, ShardUnavailable]) -> ShardUnavailable:
    if len(down) == 1:
        [exc] = down.values()
        return exc
    exc = ShardUnavailable(
        ", ".join(down), "no shard answered: " + "; ".join(map(str, down.values()))
    )
    exc.__cause__ = next(iter(down.values()))
    return exc
