"""A simulated world of parents and their children around the real engine (in memory).

An order reserves stock, starts a shipment (which books a carrier, may start an
insurance saga of its own, and prints a label that may be refused), may start a second
shipment, and charges a payment that may be refused: parents, children and grandchildren.

Two engines' worth of messages travel through one lossy network: a parent's child start
and undo, a child's end, participants' commands and replies. Hypothesis chooses, step by
step, which message arrives next (any of them: reordering), whether it arrives twice or
not at all, whether the broker refuses the next send, when a parent is cancelled, when
time moves on (polls, timeouts, back-offs), and when the engine process is replaced by a
new one that recovers from the store. Then the world drains: every message is delivered
and time moves on until nothing is left to do.

The participants keep their own database, as real ones do: a reply stored per command id
(a duplicate gets the stored reply), each forward effect applied once, each compensation
undoing the effect it names once, and a compensation that arrives before its forward
leaves a tombstone that refuses the late forward. The oracles read that database.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from hypothesis import strategies as st
from pydantic import BaseModel

from saga_engine import Saga, SagaContext, Settings
from saga_engine.core.history._decision import (
    CHILD_PARTICIPANT,
    PARENT_PARTICIPANT,
    OutboundCommand,
)
from saga_engine.kernel._errors import InvalidTransition, SagaError, TransientError
from saga_engine.kernel._serde import JsonDict
from saga_engine.runner._children import ChildLinks
from saga_engine.runner._clock import VirtualClock
from saga_engine.runner._engine import Engine
from saga_engine.runner._parts import EngineParts
from saga_engine.store._memstore import InMemoryEventStore

STEP_TIMEOUT = timedelta(minutes=1)
#: At most this many messages lost, and sends refused, in one run: fewer than the
#: attempts any compensation gets before it parks, so every run can end.
MAX_DROPS = 4
MAX_SEND_FAILURES = 4
MAX_ACTIONS = 60
#: How long time may move on in the random phase while messages wait: less than the
#: back-offs and timeouts of a compensation's ten attempts.
MAX_SILENCE = timedelta(minutes=6)
DRAIN_LIMIT = 2_000


class Item(BaseModel):
    order: str
    fail_label: bool = False
    fail_charge: bool = False
    #: The shipment starts a child of its own (a grandchild of the order).
    insured: bool = False
    #: The order starts a second shipment after the first.
    second: bool = False


class Act(BaseModel):
    order: str
    fail: bool = False


class Done(BaseModel):
    order: str


def _step(ctx: SagaContext, name: str, to: str, order: str, fail: bool = False) -> Any:
    return ctx.step(
        name,
        to=to,
        command=Act(order=order, fail=fail),
        compensate=Act(order=order),
        timeout=STEP_TIMEOUT,
    )


class Insurance(Saga[Item, Done]):
    name = "world-insurance"

    async def run(self, ctx: SagaContext, item: Item) -> Done:
        await _step(ctx, "insure", "insurer", item.order)
        return Done(order=item.order)


class Shipment(Saga[Item, Done]):
    name = "world-shipment"

    async def run(self, ctx: SagaContext, item: Item) -> Done:
        await _step(ctx, "book", "carrier", item.order)
        if item.insured:
            await ctx.child(Insurance, item)
        await _step(ctx, "label", "printer", item.order, item.fail_label)
        return Done(order=item.order)


class Order(Saga[Item, Done]):
    name = "world-order"

    async def run(self, ctx: SagaContext, item: Item) -> Done:
        await _step(ctx, "reserve", "stock", item.order)
        await ctx.child(Shipment, item)
        if item.second:
            await ctx.child(Shipment, item.model_copy(update={"insured": False}), id="second")
        await _step(ctx, "charge", "payments", item.order, item.fail_charge)
        return Done(order=item.order)


SAGAS: list[type[Saga[Any, Any]]] = [Order, Shipment, Insurance]


@dataclass
class ParticipantDb:
    """Every participant's own tables, as one: replies by command id, effects applied."""

    replies: dict[str, tuple[str, JsonDict, str | None]] = field(default_factory=dict)
    #: Forward command id -> (saga, step) of each effect applied.
    applied: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: (saga, step) -> how many times its effect was undone.
    undone: Counter[tuple[str, str]] = field(default_factory=Counter)
    _undone_ids: set[str] = field(default_factory=set)
    _tombstones: set[str] = field(default_factory=set)

    def handle(self, command: OutboundCommand) -> tuple[str, JsonDict, str | None]:
        stored = self.replies.get(command.command_id)
        if stored is not None:
            return stored  # a duplicate: the stored reply, nothing applied again
        if command.compensation:
            for forward in command.compensates:
                if forward in self.applied and forward not in self._undone_ids:
                    self._undone_ids.add(forward)
                    self.undone[self.applied[forward]] += 1
                elif forward not in self.applied:
                    self._tombstones.add(forward)  # a late forward must not apply
            reply: tuple[str, JsonDict, str | None] = ("success", {}, None)
        elif command.command_id in self._tombstones:
            reply = ("failure", {}, "compensated before it arrived")
        elif command.payload.get("fail"):
            reply = ("failure", {}, "refused by the participant")
        else:
            self.applied[command.command_id] = (command.saga_id, command.step)
            reply = ("success", {"order": command.payload["order"]}, None)
        self.replies[command.command_id] = reply
        return reply


@dataclass
class Message:
    command: OutboundCommand
    #: A participant's reply to ``command``; None: the command itself, on its way.
    reply: tuple[str, JsonDict, str | None] | None = None


class LossyBus:
    """The engine's sender: every send lands in the network, unless it is refused."""

    def __init__(self, network: list[Message]) -> None:
        self.network = network
        self.refuse_next = 0

    async def send_command(self, command: OutboundCommand) -> None:
        if self.refuse_next:
            self.refuse_next -= 1
            raise TransientError("the broker did not take the record (simulated)")
        self.network.append(Message(command))


Action = tuple[str, int]

actions = st.lists(
    st.one_of(
        st.tuples(
            st.sampled_from(["deliver", "deliver", "deliver", "twice", "drop"]), st.integers(0, 50)
        ),
        st.tuples(st.sampled_from(["refuse", "restart"]), st.just(0)),
        st.tuples(st.just("cancel"), st.integers(0, 1)),
        st.tuples(st.just("tick"), st.integers(1, 7)),
    ),
    max_size=MAX_ACTIONS,
)
items = st.lists(
    st.builds(
        Item,
        order=st.just(""),
        fail_label=st.booleans(),
        fail_charge=st.booleans(),
        insured=st.booleans(),
        second=st.booleans(),
    ),
    min_size=1,
    max_size=2,
)


class World:
    def __init__(self) -> None:
        self.clock = VirtualClock()
        self.store = InMemoryEventStore()
        self.network: list[Message] = []
        self.bus = LossyBus(self.network)
        self.db = ParticipantDb()
        self.engine = self._engine()
        self.parents: list[str] = []
        self.drops = 0
        self.refusals = 0
        self.silence = timedelta(0)
        #: Errors a real inbox would have dead-lettered: none is expected here.
        self.unexpected: list[str] = []

    def _engine(self) -> Engine:
        """A new engine process: its collaborators, its engine and its child links."""
        self.parts = EngineParts.build(
            Settings(), sagas=SAGAS, store=self.store, sender=self.bus, clock=self.clock
        )
        engine = Engine(self.parts)
        self.children = ChildLinks(engine, self.parts)
        return engine

    async def start(self, item: Item, index: int) -> None:
        order = item.model_copy(update={"order": f"o{index}"})
        self.parents.append(await self.engine.start(Order, order))

    async def act(self, kind: str, n: int) -> None:
        if kind in ("deliver", "twice", "drop") and self.network:
            message = self.network[n % len(self.network)]
            if kind == "drop" and self.drops < MAX_DROPS:
                self.drops += 1
                self.network.remove(message)
            elif kind != "drop":
                if kind == "deliver":
                    self.network.remove(message)
                await self.deliver(message)
        elif kind == "refuse" and self.refusals < MAX_SEND_FAILURES:
            self.refusals += 1
            self.bus.refuse_next += 1
        elif kind == "restart":
            await self.restart()
        elif kind == "cancel" and self.parents:
            await self._quietly(self.engine.cancel(self.parents[n % len(self.parents)], "x"))
        elif kind == "tick":
            await self.tick(timedelta(minutes=n))

    async def tick(self, delta: timedelta, *, draining: bool = False) -> None:
        """Time moves on: timers fire, and the housekeeping wakes sagas not in memory
        whose wake-up is due (one evicted after a refused send, say). While draining,
        what each timer sends is delivered before the next one fires."""
        if not draining:
            # Bounded: a participant silent for longer than a compensation's attempts
            # parks the saga, rightly; that is not what this world tests.
            delta = min(delta, MAX_SILENCE - self.silence)
            self.silence += delta
        await self.clock.advance(delta, settle=self._deliver_all if draining else _nothing)
        for saga_id, _ in await self.store.due_wakeups(self.clock.now()):
            if not self.parts.live.holds_timer(saga_id):
                await self._quietly(self.engine.load_due(saga_id))

    async def deliver(self, message: Message) -> None:
        """One record applied, as the inbox or a participant would: refused sends put it
        back (its offset is not committed), so it is applied again later."""
        command = message.command
        try:
            if message.reply is not None:
                outcome, payload, error = message.reply
                await self.engine.reply(
                    command.saga_id, command.command_id, outcome, payload, error
                )
            elif command.participant in (CHILD_PARTICIPANT, PARENT_PARTICIPANT):
                await self.children.deliver_locally(command)
            else:
                self.network.append(Message(command, self.db.handle(command)))
        except TransientError:
            self.network.append(message)
        except SagaError as exc:
            self.unexpected.append(f"{type(exc).__name__}: {exc}")

    async def restart(self) -> None:
        """The engine process is replaced: the new one recovers every open saga."""
        await self.engine.close()
        self.engine = self._engine()
        while True:
            try:
                await self.engine.recover()
                return
            except TransientError:
                continue  # a refused re-send: recovery is tried again, as a worker does

    async def drain(self) -> None:
        """Everything delivered, in order, and time moved on, until nothing is owed."""
        for _ in range(DRAIN_LIMIT):
            if self.network:
                await self.deliver(self.network.pop(0))
            elif not await self.settled():
                await self.tick(timedelta(minutes=6), draining=True)
            else:
                return

    async def _deliver_all(self) -> None:
        for _ in range(DRAIN_LIMIT):
            if not self.network:
                return
            await self.deliver(self.network.pop(0))

    async def settled(self) -> bool:
        return all(r.status.is_terminal for r in await self.store.list_sagas(limit=1000))

    async def _quietly(self, action: Any) -> None:
        # Cancelling what cannot be cancelled any more; a refused send (it is owed).
        with contextlib.suppress(InvalidTransition, TransientError):
            await action


async def _nothing() -> None:
    return None
