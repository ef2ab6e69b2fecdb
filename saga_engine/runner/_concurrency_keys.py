"""Per-key concurrency's runner (``Saga.concurrency``, docs/concurrency-keys.md): asks
the store for a queued saga's key slot and records the answer in its history, and
releases the slot of a saga that ended.

What is owed is derived from the saga's history, after every pass of the engine's path
over it (``after``, called once the batch's locks are released):

- a saga whose run waits for its key (``SagaRuntime.awaits_key``) asks the store
  (``KeySlotStore.acquire_key``, idempotent: it keeps its FIFO place). Granted, a
  ``key_acquired`` input is applied and its run begins; queued, a ``key_queued`` input
  says behind whom (once per change of holders), and it asks again every
  ``engine.key_poll_s`` while it waits;
- a saga that ended releases its slot (``release_key``); each saga that gets the slot
  is woken: here if this engine owns it, else through its owner's inbox (a reload).

A crash anywhere in between loses nothing: a saga recovered by another engine asks
again, a release not made is made by housekeeping's sweep (``sweep``). Sagas of types
without ``concurrency`` cost one attribute read per pass and no query.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta

from saga_engine.core.history._decision import KeyGrant, KeyQueue
from saga_engine.core.runtime._runtime import SagaRuntime
from saga_engine.kernel._errors import SagaError, TransientError
from saga_engine.runner._parts import EngineParts
from saga_engine.runner._path_inputs import Deliver, Input, InputOutcome, Load, LoadMode, Work
from saga_engine.store._keyslots import KeySlotStore

log = logging.getLogger("saga_engine.keys")

#: Wake-ups applied one inside the other before the next goes to a task of its own.
_MAX_DEPTH = 8

Apply = Callable[[Sequence[Input]], Awaitable[list[InputOutcome]]]


class KeyGate:
    def __init__(self, parts: EngineParts, apply: Apply) -> None:
        store = parts.store
        self._store = store if isinstance(store, KeySlotStore) else None
        self._clock = parts.clock
        self._owners = parts.owners
        self._stats = parts.stats
        self._poll_s = parts.settings.engine.key_poll_s
        self._apply = apply
        self._crash_hook = parts.crash_hook
        self._registry = parts.registry
        #: Sagas asking now: the pass that records the answer does not ask again.
        self._asking: set[str] = set()
        #: Sagas with a poll armed.
        self._polling: set[str] = set()
        #: Wake-ups applied inline, one inside the other (see ``_load_granted``).
        self._depth = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def limited(self) -> bool:
        """A saga type registered declares a concurrency limit: without one, no saga of
        a batch owes anything for a key (``after`` need not be called). Asked of the
        registry each batch: a class registered after the engine was built counts."""
        return self._registry.limited

    def close(self) -> None:
        self._closed = True

    async def after(self, works: Sequence[Work]) -> None:
        """What the sagas of a batch owe for their keys, once its locks are released."""
        for work in works:
            live = work.live
            if live is None or live.runtime.state.definition.concurrency is None:
                continue  # not limited: the hot path ends here
            try:
                await self._owed(work.saga_id, live.runtime)
            except TransientError as exc:
                # Owed still: asked again by its poll, released by the sweep.
                log.warning("concurrency key of saga %s: %s", work.saga_id, exc)
            except Exception:
                log.exception("concurrency key of saga %s", work.saga_id)

    async def _owed(self, saga_id: str, runtime: SagaRuntime) -> None:
        key = runtime.concurrency_key()
        if key is None or self._store is None:
            return
        if runtime.status.is_terminal:
            # Crash point: the saga's end is durable, its key not released yet.
            self._crash("before_key_release")
            granted = await self._store.release_key(saga_id, self._clock.now())
            self._stats.inc("key_released")
            for other in granted:
                await self._load_granted(other)
        elif runtime.awaits_key and saga_id not in self._asking and self._owners.owns(saga_id):
            await self._ask(saga_id, runtime, key)

    async def _ask(self, saga_id: str, runtime: SagaRuntime, key: str) -> None:
        assert self._store is not None
        limit = runtime.state.definition.concurrency
        assert limit is not None
        self._asking.add(saga_id)
        held = False
        try:
            asked = self._clock.now()
            turn = await self._store.acquire_key(
                runtime.saga_type, key, saga_id, limit.limit, asked
            )
            # Stamped once granted (not when asked): a history's key_acquired is never
            # before the end of the saga whose release granted it.
            now = self._clock.now()
            inbound: KeyGrant | KeyQueue
            if turn.held:
                # Crash point: the store granted the slot, the history does not say so.
                self._crash("after_key_grant")
                held = True
                inbound = KeyGrant(key, now)
                self._stats.inc("key_acquired")
            else:
                inbound = KeyQueue(key, now, behind=turn.holders, position=turn.position)
            (outcome,) = await self._apply([Deliver(saga_id, inbound)])
            if outcome.error is not None:
                if not isinstance(outcome.error, SagaError):
                    raise outcome.error
                held = False  # recorded nowhere: asked again
        finally:
            self._asking.discard(saga_id)
            if not held:
                self._poll(saga_id)

    def _poll(self, saga_id: str) -> None:
        """Asks again in ``key_poll_s`` (through a wake-up of the saga, which asks if its
        run still waits for its key), one poll per saga at a time."""
        if saga_id in self._polling or self._closed:
            return
        self._polling.add(saga_id)

        async def again() -> None:
            self._polling.discard(saga_id)
            if not self._closed and self._owners.owns(saga_id):
                await self._apply([Load(saga_id, LoadMode.WAKE_UP_DUE)])

        self._clock.call_at(self._clock.now() + timedelta(seconds=self._poll_s), again)

    async def _load_granted(self, saga_id: str) -> None:
        """A saga granted a slot by a release: its owner applies the grant."""
        if not self._owners.owns(saga_id):
            await self._owners.tell_owner(saga_id)
        elif self._depth < _MAX_DEPTH:
            # Inline: the release's caller sees the next saga under way when it returns.
            self._depth += 1
            try:
                await self._apply([Load(saga_id, LoadMode.WAKE_UP_DUE)])
            finally:
                self._depth -= 1
        else:
            # A chain of sagas that end as soon as they get the key (each release wakes
            # the next) goes on in a task of its own, not ever deeper in this one.
            task = asyncio.get_running_loop().create_task(self._load_granted_later(saga_id))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _load_granted_later(self, saga_id: str) -> None:
        await self._apply([Load(saga_id, LoadMode.WAKE_UP_DUE)])

    def _crash(self, point: str) -> None:
        if self._crash_hook is not None:
            self._crash_hook(point)

    async def sweep(self) -> int:
        """Releases the slots of sagas that ended without releasing them, and wakes the
        sagas that get them; how many were granted."""
        if self._store is None:
            return 0
        granted = await self._store.sweep_keys(self._clock.now())
        for saga_id in granted:
            await self._load_granted(saga_id)
        return len(granted)
