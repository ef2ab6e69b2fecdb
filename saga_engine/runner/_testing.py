"""The code behind :mod:`saga_engine.testing`, whose docstring says what it is for."""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, SecretStr

from saga_engine.core.authoring._definition import Saga
from saga_engine.core.authoring._domain_events import EventSource
from saga_engine.core.authoring._update import name_of
from saga_engine.core.history._decision import OutboundCommand
from saga_engine.core.history._events import Event
from saga_engine.core.history._status import SagaStatus
from saga_engine.core.history._structs import to_data
from saga_engine.core.planning._rollout import RolloutSpec, flow_policy_key
from saga_engine.kernel._callback_tokens import token_of
from saga_engine.kernel._errors import SagaError, TransientError, UpdateFailed
from saga_engine.kernel._serde import JsonDict
from saga_engine.kernel._settings import CallbackSettings, Settings
from saga_engine.runner._children import ChildLinks
from saga_engine.runner._clock import VirtualClock
from saga_engine.runner._engine import Engine
from saga_engine.runner._matcher import take_fact
from saga_engine.runner._parts import EngineParts
from saga_engine.runner._rollouts import apply_rollout
from saga_engine.store._batch_operation_store import BatchStore
from saga_engine.store._domain_store import InMemoryDomainEventStore, StoredFact
from saga_engine.store._membatch_operations import InMemoryBatchStore
from saga_engine.store._memschedules import InMemoryScheduleStore
from saga_engine.store._memstore import InMemoryEventStore
from saga_engine.store._schedule_store import ScheduleStore, saga_status_of
from saga_engine.store._store import EventStore, SagaRecord, as_utc

__all__ = ["InMemoryCommandBus", "SagaRun", "SagaTestEnv", "ScriptedParticipant"]

M = TypeVar("M", bound=BaseModel)
Outcome = Literal["success", "failure", "retryable"]


@dataclass
class _ScriptedReply:
    outcome: Outcome | None  # None: never reply (the attempt times out)
    payload: JsonDict = field(default_factory=dict)
    error: str | None = None
    times: int | None = None  # None: every time
    duplicate: bool = False


class ScriptedParticipant:
    """A participant whose replies you script per command type.

    Unscripted commands get a success reply with an empty payload. The latest ``.on``
    for a command type wins, so a test can override a default a fixture scripted. A
    rule with ``times`` is used up after that many commands, and the rule scripted
    before it applies again::

        env.participant("bank").on(Charge, reply=Charged(amount=5))   # the default
        env.participant("bank").on(Charge, retryable="busy", times=2)  # then: twice busy

    ``reset()`` forgets the rules (of one command type, or all of them).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.received: list[OutboundCommand] = []
        self._rules: dict[str, deque[_ScriptedReply]] = {}

    def on(
        self,
        command: type[BaseModel] | str,
        *,
        reply: BaseModel | JsonDict | None = None,
        reject: str | None = None,
        retryable: str | None = None,
        no_reply: bool = False,
        times: int | None = None,
        duplicate: bool = False,
    ) -> ScriptedParticipant:
        """Scripts the reply to ``command``: a success ``reply``, a ``reject`` (business
        failure), a ``retryable`` error, or ``no_reply`` (so the attempt times out).
        It overrides what was scripted for ``command`` before (for ``times`` commands,
        if given)."""
        chosen = sum(x is not None for x in (reject, retryable)) + int(no_reply)
        if chosen > 1 or (chosen and reply is not None):
            raise ValueError("choose one of reply, reject, retryable and no_reply")
        outcome: Outcome | None
        if no_reply:
            outcome = None
        elif reject is not None:
            outcome = "failure"
        elif retryable is not None:
            outcome = "retryable"
        else:
            outcome = "success"
        payload = reply.model_dump(mode="json") if isinstance(reply, BaseModel) else (reply or {})
        # Newest first: a per-test .on() after a fixture's default must win (the first
        # rule winning ignored such overrides silently).
        self._rules.setdefault(_type_name(command), deque()).appendleft(
            _ScriptedReply(outcome, payload, reject or retryable, times, duplicate)
        )
        return self

    def reset(self, command: type[BaseModel] | str | None = None) -> ScriptedParticipant:
        """Forgets the rules scripted for ``command`` (every command type if None), so
        its commands get the default success reply again. ``received`` is kept."""
        if command is None:
            self._rules.clear()
        else:
            self._rules.pop(_type_name(command), None)
        return self

    def _answer(self, command: OutboundCommand) -> _ScriptedReply:
        self.received.append(command)
        rules = self._rules.get(command.command_type)
        if not rules:
            return _ScriptedReply("success")
        rule = rules[0]
        if rule.times is not None:
            rule.times -= 1
            if rule.times <= 0:
                rules.popleft()  # used up: the rule scripted before it applies again
        return rule


def _type_name(command: type[BaseModel] | str) -> str:
    return command if isinstance(command, str) else command.__name__


class InMemoryCommandBus:
    """Collects commands; the test environment hands them to scripted participants.

    Like a real broker it is asynchronous: sending only enqueues. A closed bus raises
    TransientError, as the Kafka adapter does when the broker is unreachable.
    """

    def __init__(self) -> None:
        self.sent: list[OutboundCommand] = []
        self.pending: deque[OutboundCommand] = deque()
        self.closed = False
        self._failing: list[tuple[Callable[[OutboundCommand], bool], list[int]]] = []

    def fail(self, predicate: Callable[[OutboundCommand], bool], times: int = 1) -> None:
        """The next ``times`` sends of a command ``predicate`` matches raise
        TransientError, as the Kafka adapter does when a send is not acknowledged."""
        self._failing.append((predicate, [times]))

    async def send_command(self, command: OutboundCommand) -> None:
        if self.closed:
            raise TransientError("the command bus is closed")
        for predicate, left in self._failing:
            if left[0] > 0 and predicate(command):
                left[0] -= 1
                raise TransientError(f"send of {command.command_id} not acknowledged (test)")
        self.sent.append(command)
        self.pending.append(command)


class SagaRun:
    """A started saga, seen from a test."""

    def __init__(self, env: SagaTestEnv, saga_id: str, saga_cls: type[Saga[Any, Any]]) -> None:
        self.env = env
        self.saga_id = saga_id
        self._cls = saga_cls

    async def record(self) -> SagaRecord:
        return await self.env.engine.get(self.saga_id)

    async def status(self) -> SagaStatus:
        return (await self.record()).status

    async def history(self) -> list[Event]:
        return await self.env.engine.history(self.saga_id)

    async def output(self) -> BaseModel:
        """The saga's result; raises AssertionError if it did not complete."""
        record = await self.record()
        if record.status != SagaStatus.COMPLETED:
            raise AssertionError(
                f"saga {self.saga_id} is {record.status.value}, not completed: {record.error}"
            )
        for event in reversed(await self.history()):
            if event.kind == "saga_completed":
                return self._cls.output_type.model_validate(event.output)
        raise AssertionError("completed saga without a saga_completed event")  # pragma: no cover

    async def error(self) -> JsonDict | None:
        return (await self.record()).error

    def __repr__(self) -> str:
        return f"SagaRun({self.saga_id!r})"


#: The key a test environment signs callback URLs with when its settings have none.
TEST_CALLBACK_KEY = "test-callback-key-" + "0" * 32


def _with_callback_key(settings: Settings) -> Settings:
    if settings.callbacks.keys:
        return settings
    keys = CallbackSettings(keys={"test": SecretStr(TEST_CALLBACK_KEY)})
    return settings.model_copy(update={"callbacks": keys})


class SagaTestEnv:
    """The real engine on in-memory adapters and a virtual clock.

    It is the composition root of a test: it builds the engine's collaborators
    (``parts``: the store, the live sagas, the counters in ``parts.stats``...) and the
    child-saga links beside it. Callback URLs (``ctx.callback``) are signed with a fixed
    test key unless ``settings.callbacks`` has keys; ``callback(url, body)`` calls one."""

    def __init__(
        self,
        sagas: list[type[Saga[Any, Any]]],
        *,
        settings: Settings | None = None,
        start_time: datetime | None = None,
        store: EventStore | None = None,
        event_sources: list[EventSource[Any]] | None = None,
    ) -> None:
        self.sagas = list(sagas)
        #: The domain events ``publish_event`` takes (``ctx.wait_event``), kept in memory.
        self.event_sources = list(event_sources or [])
        self._facts = 0
        self.settings = _with_callback_key(settings or Settings())
        # UTC and timezone-aware, whatever is given (a naive time is taken as UTC, as the
        # stores read one): the saga's ctx.now() is this clock's time, and must read the
        # same on the Postgres store, which gives back UTC.
        self.clock = VirtualClock(
            None if start_time is None else as_utc(start_time).astimezone(UTC)
        )
        #: In memory by default; pass a PostgresEventStore to run the same tests on Postgres.
        self.store: EventStore = store or InMemoryEventStore()
        self.bus = InMemoryCommandBus()
        self.domain_events = InMemoryDomainEventStore(self._open_histories, self._all_histories)
        #: What each engine of this environment was built from (``new_engine``).
        self._built: weakref.WeakKeyDictionary[Engine, tuple[EngineParts, ChildLinks]] = (
            weakref.WeakKeyDictionary()
        )
        self.engine = self.new_engine()
        self._schedules: InMemoryScheduleStore | None = None
        self._batches: InMemoryBatchStore | None = None
        self._participants: dict[str, ScriptedParticipant] = {}
        self._hold: Callable[[OutboundCommand], bool] | None = None
        self._due_loads_armed: set[tuple[str, datetime]] = set()
        #: Commands kept in flight by ``hold``, in the order they were sent.
        self.held: list[OutboundCommand] = []

    def new_engine(
        self, sagas: list[type[Saga[Any, Any]]] | None = None, store: EventStore | None = None
    ) -> Engine:
        """Another engine on the same store, bus and clock: a restarted process, or a new
        deploy when given other saga classes. Assign it to ``env.engine`` to drive it."""
        parts = EngineParts.build(
            self.settings,
            sagas=sagas or self.sagas,
            store=store or self.store,
            sender=self.bus,
            clock=self.clock,
            domain_events=self.domain_events,
        )
        engine = Engine(parts)
        self._built[engine] = (parts, ChildLinks(engine, parts))
        return engine

    @property
    def parts(self) -> EngineParts:
        """The collaborators ``env.engine`` was built from: its store, live sagas,
        counters (``parts.stats.counts``), flow control, registry..."""
        return self._built[self.engine][0]

    @property
    def children(self) -> ChildLinks:
        """``env.engine``'s child-saga links (starts, undos, answers to parents)."""
        return self._built[self.engine][1]

    @property
    def schedules(self) -> ScheduleStore:
        """Durable schedules kept in memory beside the store (the admin API's, for a test
        that serves it: ``create_admin_app(..., schedules=env.schedules)``)."""
        if self._schedules is None:
            self._schedules = InMemoryScheduleStore(saga_status_of(self.store))
        return self._schedules

    async def _open_histories(self) -> dict[str, list[Any]]:
        loaded = await self.store.histories(await self.store.open_saga_ids())
        return {h.record.saga_id: [e.event for e in h.events] for h in loaded}

    async def _all_histories(self) -> dict[str, list[Any]]:
        rows = await self.store.list_sagas(limit=1_000_000)
        loaded = await self.store.histories([r.saga_id for r in rows])
        return {h.record.saga_id: [e.event for e in h.events] for h in loaded}

    async def publish_event(
        self,
        event: BaseModel,
        *,
        event_id: str | None = None,
        source: EventSource[Any] | None = None,
    ) -> list[str]:
        """Publishes a domain event as another service would on ``source``'s topic (the
        source declared for its model by default): it is kept for the source's retention,
        and the sagas waiting for its key get it. Returns the sagas that were waiting."""
        if source is None:
            source = next((s for s in self.event_sources if s.model is type(event)), None)
            if source is None:
                raise ValueError(
                    f"no event source for {type(event).__name__}: pass "
                    "SagaTestEnv(..., event_sources=[...]) or source="
                )
        self._facts += 1
        now = self.clock.now()
        fact = StoredFact(
            source=source.name,
            key=source.key_of(event),
            event_id=event_id or f"test-{self._facts}",
            payload=event.model_dump(mode="json"),
            received_at=now,
            expires_at=now + source.retention,
        )
        waiting = await take_fact(self.domain_events, fact, self.engine.reload)
        await self.settle()
        return waiting

    @property
    def batches(self) -> BatchStore:
        """Batch operations kept in memory (the admin API's, for a test that serves it:
        ``create_admin_app(..., batches=env.batches)``); no worker runs them here."""
        if self._batches is None:
            self._batches = InMemoryBatchStore()
        return self._batches

    async def set_rollout(
        self,
        saga_type: str,
        version: int,
        percent: int = 0,
        *,
        predicate: str | None = None,
        reason: str = "set by a test",
    ) -> None:
        """Sets which version new starts of ``saga_type`` run, as ``PUT /rollouts`` does:
        stored with its audit row (principal ``test``) and applied on ``env.engine`` now."""
        spec = RolloutSpec(version=version, percent=percent, predicate=predicate)
        await apply_rollout(self.parts, saga_type, spec, principal="test", reason=reason)

    async def set_flow_rollout(
        self,
        version: int,
        percent: int = 0,
        *,
        saga_type: str | None = None,
        predicate: str | None = None,
        reason: str = "set by a test",
    ) -> None:
        """Sets which flow policy new sagas (of ``saga_type``, or of every type) run
        under, as ``PUT /flow/policies/rollout`` does (``Settings.limits.policies``
        configures the versions)."""
        spec = RolloutSpec(version=version, percent=percent, predicate=predicate)
        key = flow_policy_key(saga_type)
        await apply_rollout(self.parts, key, spec, principal="test", reason=reason)

    def participant(self, name: str) -> ScriptedParticipant:
        if name not in self._participants:
            self._participants[name] = ScriptedParticipant(name)
        return self._participants[name]

    def now(self) -> datetime:
        """The virtual clock's time, a timezone-aware UTC datetime: a method, as the
        saga's ``ctx.now()`` is, and of the same form (the time of the event a saga
        handles is this clock's time)."""
        return self.clock.now()

    async def start(
        self,
        saga: type[Saga[Any, Any]],
        input: BaseModel | JsonDict,
        **options: Any,
    ) -> SagaRun:
        saga_id = await self.engine.start(saga, input, **options)
        await self.settle()
        return SagaRun(self, saga_id, saga)

    def hold(self, predicate: Callable[[OutboundCommand], bool]) -> None:
        """Keeps the commands ``predicate`` matches in flight: ``settle`` does not deliver
        them until ``release``. A message the broker took and has not handed over yet,
        for tests of races (a child's end that reaches its parent late, say)."""
        self._hold = predicate

    async def release(self) -> None:
        """Stops holding, then delivers what was held, in the order it was sent."""
        self._hold = None
        held, self.held = self.held, []
        self.bus.pending.extend(held)
        await self.settle()

    async def settle(self) -> None:
        """Delivers every queued command to its participant and feeds back the replies,
        and the domain events kept to the sagas that wait for them."""
        await self._deliver()
        matcher = self.parts.matcher
        while matcher is not None and matcher.pending:
            await matcher.drain()
            await self._deliver()

    async def _deliver(self) -> None:
        while self.bus.pending:
            command = self.bus.pending.popleft()
            if self._hold is not None and self._hold(command):
                self.held.append(command)
                continue
            try:
                if await self.children.deliver_locally(command):
                    continue  # a child saga's start or undo, or its end to its parent
            except SagaError:
                continue  # e.g. an answer after the parent ended: the engine says why
            rule = self.participant(command.participant)._answer(command)
            if rule.outcome is None:
                continue
            for _ in range(2 if rule.duplicate else 1):
                try:
                    await self.engine.reply(
                        command.saga_id, command.command_id, rule.outcome, rule.payload, rule.error
                    )
                except SagaError:
                    continue  # e.g. a reply after the saga ended: the engine says why

    async def advance(self, delta: timedelta) -> None:
        """Moves virtual time forward, firing due timers and timeouts in order, and
        waking, as the worker's housekeeping does, sagas not in memory whose next wake-up
        falls due (one evicted after a send the broker refused, say)."""
        await self.settle()
        target = self.clock.now() + delta
        while (due := await self._next_due(target)) is not None and due <= target:
            await self.clock.advance(max(due - self.clock.now(), timedelta(0)), settle=self.settle)
        await self.clock.advance(max(target - self.clock.now(), timedelta(0)), settle=self.settle)
        if self.parts.matcher is not None:
            await self.parts.matcher.expire()  # as the worker's matcher does every poll

    async def _next_due(self, until: datetime) -> datetime | None:
        """The clock's next due callback, once the wake-ups of sagas not in memory due by
        ``until`` are on it."""
        for saga_id, at in await self.store.due_wakeups(until):
            if (saga_id, at) not in self._due_loads_armed and not self.parts.live.holds_timer(
                saga_id
            ):
                self._due_loads_armed.add((saga_id, at))
                self.clock.call_at(at, functools.partial(self._load_due, saga_id))
        return self.clock.next_due()

    async def _load_due(self, saga_id: str) -> None:
        with contextlib.suppress(SagaError):  # it says why in its log; the next wake retries
            await self.engine.load_due(saga_id)

    async def run_until_settled(
        self, run: SagaRun, *, max_time: timedelta = timedelta(days=30)
    ) -> SagaStatus:
        """Skips from timer to timer until the saga ends or parks (or ``max_time`` passes)."""
        limit = self.clock.now() + max_time
        await self.settle()
        while True:
            status = await run.status()
            if status.is_terminal or status.is_parked:
                return status
            due = await self._next_due(limit)
            if due is None or due > limit:
                return status
            await self.clock.advance(max(due - self.clock.now(), timedelta(0)), settle=self.settle)

    async def signal(
        self, run: SagaRun | str, name: str, payload: BaseModel | JsonDict | None = None, **kw: Any
    ) -> None:
        await self.engine.signal(run if isinstance(run, str) else run.saga_id, name, payload, **kw)
        await self.settle()

    async def callback(self, url: str, body: BaseModel | JsonDict | None = None) -> None:
        """Posts ``body`` to a callback URL (``cb.url``, or ``cb.fail_url``) as the admin
        API's ``POST /callbacks/{token}`` does, with the same checks and refusals."""
        token, failed = token_of(url)
        payload = body.model_dump(mode="json") if isinstance(body, BaseModel) else body or {}
        await self.engine.callback(token, payload, failed=failed)
        await self.settle()

    async def update(
        self,
        run: SagaRun | str,
        update: Any,
        payload: BaseModel | JsonDict | None = None,
        **kw: Any,
    ) -> Any:
        """Calls the saga's update (its name or the method, ``Order.add_item``) and returns
        its result; raises UpdateFailed if its handler raised, UpdateRefused if refused."""
        saga_id = run if isinstance(run, str) else run.saga_id
        answer = await self.engine.update(saga_id, name_of(update), payload, **kw)
        await self.settle()
        if answer.error is not None:
            raise UpdateFailed(answer.update_id, answer.name, to_data(answer.error))
        return answer.result

    async def query(
        self, run: SagaRun | str, query: Any, args: BaseModel | JsonDict | None = None
    ) -> Any:
        """Asks the saga's query (its name or the method); writes nothing."""
        saga_id = run if isinstance(run, str) else run.saga_id
        return await self.engine.query(saga_id, name_of(query), args)

    async def cancel(self, run: SagaRun | str, reason: str = "cancelled by test") -> None:
        await self.engine.cancel(run if isinstance(run, str) else run.saga_id, reason)
        await self.settle()

    async def resume(self, run: SagaRun | str) -> None:
        await self.engine.resume(run if isinstance(run, str) else run.saga_id)
        await self.settle()

    def commands(
        self, participant: str | None = None, *, compensation: bool | None = None
    ) -> list[OutboundCommand]:
        """Commands sent so far, optionally for one participant or only (non-)compensations."""
        return [
            c
            for c in self.bus.sent
            if (participant is None or c.participant == participant)
            and (compensation is None or c.compensation == compensation)
        ]

    def compensated_steps(self) -> list[str]:
        """The steps whose compensation was sent, in order, each once."""
        seen: list[str] = []
        for c in self.bus.sent:
            if c.compensation and c.step not in seen:
                seen.append(c.step)
        return seen

    def where(self, predicate: Callable[[OutboundCommand], bool]) -> list[OutboundCommand]:
        return [c for c in self.bus.sent if predicate(c)]
