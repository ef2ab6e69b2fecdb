"""Flow control's runner: a ``CommandSender`` in front of the real one that holds the
commands a limit stops (``_flow.py`` decides the order) and sends them when a permit
and a token are free.

The composition root puts it in front of the sender (``flow_control``) only when
``Settings.limits`` configures a limit: otherwise the engine talks to the broker's sender
directly, and the hot path is what it was.

- **Durable wait.** A command reaches a sender only after its ``command_issued`` is
  committed (the history is the outbox), so a held command is safe: a crash loses the
  queue, and recovery re-sends every outstanding command, through this queue again.
- **Permits** are held per (command id, attempt), from the send until the saga's
  history says the attempt is over: a reply, a timeout, a skip, the saga's end or park
  (``settle``, called after every decision the engine applies to the saga), or the
  saga's partition moving to another engine (``drop_unowned``).
- **Timeouts count from the send.** A queued attempt's timeout is not due (``timers``
  leaves it out); a sent one's is moved back by the time it waited in the queue.
- **Flow policies.** A command goes through the gates of its saga's flow policy
  (``saga_started.flow_policy``, resolved by ``LimitsSettings.resolve``): gates are per
  (policy, kind, name), and where several policies limit one name each gate enforces its
  policy's share (``_policy_shares``, recomputed at most every second by the pump). With
  one policy configured nothing of this is on the path: no saga is looked up before its
  command is known to be limited, and no share is computed.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Awaitable, Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from saga_engine.core.history._decision import OutboundCommand
from saga_engine.core.history._events import AttemptTimedOut, Event, ReplyReceived, SagaStarted
from saga_engine.core.planning._flow import (
    FlowQueue,
    Gate,
    GateBudgets,
    GateKind,
    Waiting,
    charge_of,
)
from saga_engine.core.planning._policy_shares import SHARES_EVERY_S, PolicyShares
from saga_engine.core.runtime._runtime import SagaRuntime
from saga_engine.kernel._errors import PermanentError
from saga_engine.kernel._settings import LimitsSettings
from saga_engine.runner._cache import LiveSagas
from saga_engine.runner._clock import Clock
from saga_engine.transport._bus import CommandSender, PipelinedSender, handed_over
from saga_engine.transport._child_wire import ENGINE_PARTICIPANTS

log = logging.getLogger("saga_engine.flow")

#: After a send that failed (the broker away), how long the command waits before its
#: next attempt; it keeps its place in the queue meanwhile.
_RETRY_SEND_S = 0.5

_Key = tuple[str, int]  # (command id, attempt)
_GateKey = tuple[int, GateKind, str]  # (flow policy, kind, name)


class TicketState(enum.Enum):
    #: Recorded, waiting for its gates.
    QUEUED = "queued"
    #: Sent: holds a permit of each of its gates until its attempt is over.
    SENT = "sent"


@dataclass(slots=True)
class _Ticket:
    command: OutboundCommand
    gates: tuple[Gate, ...]
    entry: Waiting
    state: TicketState = TicketState.QUEUED
    #: Seconds it waited in the queue: its timeout is moved back by as much.
    held_s: float = 0.0
    #: When it was sent (the latency clock's seconds): its reply's latency counts from
    #: there.
    sent_at: float = 0.0


class FlowControl:
    """A CommandSender that applies ``Settings.limits``; see the module docstring."""

    def __init__(
        self,
        settings: LimitsSettings,
        inner: CommandSender,
        started: Callable[[str], SagaStarted | None],
        now: Callable[[], float] = time.time,
        on_sent: Callable[[str], None] = lambda saga_id: None,
        owns: Callable[[str], bool] = lambda saga_id: True,
        monotonic: Callable[[], float] = time.monotonic,
        latency_clock: Callable[[], float] | None = None,
    ) -> None:
        self._inner = inner
        #: Seconds, from the engine's clock: a queued attempt's timeout is moved back by
        #: its wait measured on the clock that arms the timeout.
        self._now = now
        #: The process's monotonic seconds: token buckets, latencies, policy shares.
        self._monotonic = monotonic
        #: Seconds an adaptive limit measures a reply's latency and its moves by: the
        #: engine clock's ``monotonic`` (virtual time in the testing kit, so what a test
        #: sees does not depend on how fast the machine runs it); unset, ``monotonic``.
        self._latency_clock = latency_clock or monotonic
        #: Told of each saga whose held command was sent: its timeout is due now.
        self._on_sent = on_sent
        #: Whether this engine drives the saga (its partition is here).
        self._owns = owns
        # Checked once: a runtime protocol check costs microseconds on every command.
        self._pipelined = inner if isinstance(inner, PipelinedSender) else None
        self._started = started
        self._limits = settings
        versions = settings.versions
        self._gates: dict[_GateKey, Gate] = {}
        for version in versions:
            policy = settings.policy(version)
            for kind, table in (
                (GateKind.PARTICIPANT, policy.participants),
                (GateKind.SAGA_TYPE, policy.saga_types),
            ):
                for name, limit in table.items():
                    if limit.limits_anything:
                        self._gates[(version, kind, name)] = Gate(kind, name, limit, policy=version)
        #: Several policies: a command's saga is looked up to know its gates.
        self._several = len(versions) > 1
        #: A recorded policy -> the one configured here it runs under.
        self._resolved: dict[int | None, int] = {None: 1, **{v: v for v in versions}}
        self._weight_of = {v: settings.policy(v).weight_of for v in versions}
        self._queue = FlowQueue(aging_s=settings.aging_s)
        #: Costs are looked at only where a budget is configured.
        self._budgets = (
            GateBudgets(self._gates) if any(g.limit.budget for g in self._gates.values()) else None
        )
        #: This engine's partition share of every limit.
        self._share = 1.0
        #: The names several policies limit: their gates share them by arrivals.
        self._splits = _splits(self._gates.values())
        self._shares_at: float | None = None
        self._shares_due = False
        #: Adaptive limits are told of replies and timeouts only where there is one.
        self._adaptive = any(g.adaptive is not None for g in self._gates.values())
        self._tickets: dict[_Key, _Ticket] = {}
        self._by_saga: dict[str, set[_Key]] = {}
        self._seq = 0
        self._wake: asyncio.Event | None = None
        self._pump: asyncio.Task[None] | None = None
        self._sending: set[asyncio.Task[None]] = set()
        self.stats = {"queued": 0, "sent": 0, "released": 0, "send_failed": 0}

    # ------------------------------------------------------------------ CommandSender

    async def send_command(self, command: OutboundCommand) -> None:
        await self._through(command, *self._route(command))

    async def start_command(self, command: OutboundCommand) -> Awaitable[None]:
        """The batch path's pipelined send: a held command is done as far as the batch
        is concerned (its event is durable; the queue sends it)."""
        pipelined = self._pipelined
        if pipelined is None:
            await self.send_command(command)
            return handed_over()
        started, gates = self._route(command)
        if gates:
            await self._through(command, started, gates)
            return handed_over()
        return await pipelined.start_command(command)

    async def _through(
        self, command: OutboundCommand, started: SagaStarted | None, gates: tuple[Gate, ...]
    ) -> None:
        if not gates or not self._owns(command.saga_id):
            # Not limited; or an input applied here to a saga another engine drives (an
            # admin action): this engine lets go of it at once and its owner re-sends
            # what it owes under the owner's limits, so nothing here would release it.
            await self._inner.send_command(command)
            return
        ticket = self._tickets.get((command.command_id, command.attempt))
        if ticket is None:
            self._enqueue(command, gates, started)
        elif ticket.state is TicketState.SENT:
            # A re-send after a reload: the attempt still holds its permit.
            await self._inner.send_command(command)

    # ------------------------------------------------------------------ engine hooks

    def settle(self, saga_id: str, runtime: SagaRuntime, events: Sequence[Event] = ()) -> None:
        """Releases the permits (or queue places) of the saga's attempts that are over;
        ``events``, those just recorded, tell an adaptive limit a reply's latency or a
        timeout."""
        keys = self._by_saga.get(saga_id)
        if not keys:
            return
        if runtime.status.is_terminal or runtime.dead:
            # Ended; or parked as nondeterministic: its replies are dropped until a fixed
            # deploy, and a resume sends what is outstanding again (through the queue).
            # (A step_stuck saga's other branches are still in flight: counted below.)
            live: set[_Key] = set()
        else:
            live = {(c.command_id, c.attempt) for c in runtime.outstanding_commands()}
        over = [k for k in keys if k not in live]
        if self._adaptive and events and over:
            self._observe(over, events)
        for key in over:
            self._release(key)

    def drop_unowned(self, owns: Callable[[str], bool]) -> None:
        """After a rebalance: the sagas another engine drives now are its to send."""
        for saga_id in [s for s in self._by_saga if not owns(s)]:
            for key in list(self._by_saga.get(saga_id, ())):
                self._release(key)

    def set_share(self, owned: int, total: int) -> None:
        """This engine's share of every limit: owned inbox partitions / all of them."""
        share = self._share = owned / total if total > 0 else 1.0
        for gate in self._gates.values():
            gate.set_share(share)
        self._kick()

    def timers(self, saga_id: str, runtime: SagaRuntime) -> dict[str, datetime]:
        """The saga's pending timers as flow control sees them: a queued attempt's
        timeout is not due, a sent one's is later by the time it waited."""
        pending = runtime.pending_timers()
        keys = self._by_saga.get(saga_id)
        if not keys:
            return pending
        out: dict[str, datetime] = {}
        for timer_id, at in pending.items():
            ticket = self._ticket_of_timer(timer_id)
            if ticket is None:
                out[timer_id] = at
            elif ticket.state is TicketState.SENT:
                out[timer_id] = at + timedelta(seconds=ticket.held_s)
        return out

    def next_wakeup(self, saga_id: str, runtime: SagaRuntime) -> datetime | None:
        if saga_id not in self._by_saga:
            return runtime.next_wakeup()
        return min(self.timers(saga_id, runtime).values(), default=None)

    # ------------------------------------------------------------------ reading

    def snapshot(self) -> list[dict[str, object]]:
        """Per gate: its policy, its limits, this engine's share and the policy's, in
        flight and waiting, and what the commands in flight hold of its budget."""
        return [
            {
                "kind": gate.kind.value,
                "name": gate.name,
                "policy": gate.policy,
                "concurrency_limit": gate.limit.concurrency,
                "rate_limit": gate.limit.rate,
                "share": round(self._share, 4),
                "policy_share": round(gate.policy_share, 4),
                "effective_concurrency": gate.concurrency,
                "effective_rate": gate.rate,
                "in_flight": gate.in_flight,
                "waiting": gate.waiting,
                "sent": gate.sent,
                "budget": gate.limit.budget,
                "effective_budget": gate.budget,
                "budget_in_use": (
                    {r: gate.in_use.get(r, 0.0) for r in gate.limit.budget}
                    if gate.limit.budget
                    else None
                ),
                "adaptive": _adaptive_view(gate),
            }
            for gate in self._gates.values()
        ]

    async def close(self) -> None:
        tasks = [t for t in (self._pump, *self._sending) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # ------------------------------------------------------------------ internals

    def _route(self, command: OutboundCommand) -> tuple[SagaStarted | None, tuple[Gate, ...]]:
        """The command's gates, those of its saga's flow policy; and its saga's start,
        when several policies made it needed to find them (else None: looked up only
        once the command is known to queue)."""
        if not self._several:
            return None, self._gates_of(command, 1)
        if not self._gates or command.participant in ENGINE_PARTICIPANTS:
            return None, ()
        started = self._started(command.saga_id)
        return started, self._gates_of(command, self._policy_of(started))

    def _policy_of(self, started: SagaStarted | None) -> int:
        """The flow policy configured here that the saga runs under."""
        version = started.flow_policy if started is not None else None
        resolved = self._resolved.get(version)
        if resolved is None:
            resolved = self._resolved[version] = self._limits.resolve(version)
        return resolved

    def _gates_of(self, command: OutboundCommand, policy: int) -> tuple[Gate, ...]:
        gates = self._gates
        if not gates or command.participant in ENGINE_PARTICIPANTS:
            # A child saga's start or undo, or a child's end sent to its parent: the engine
            # answers these itself, and a child's end must never wait behind (or hold) a
            # permit of its parent's type; the child's own commands are limited as theirs.
            return ()
        found = []
        gate = gates.get((policy, GateKind.PARTICIPANT, command.participant))
        if gate is not None:
            found.append(gate)
        gate = gates.get((policy, GateKind.SAGA_TYPE, command.saga_type))
        if gate is not None:
            found.append(gate)
        return tuple(found)

    def _ticket_of_timer(self, timer_id: str) -> _Ticket | None:
        if not timer_id.startswith("timeout:"):
            return None
        command_id, _, attempt = timer_id[len("timeout:") :].rpartition(":")
        try:
            return self._tickets.get((command_id, int(attempt)))
        except ValueError:
            return None

    def _enqueue(
        self, command: OutboundCommand, gates: tuple[Gate, ...], started: SagaStarted | None
    ) -> None:
        if started is None and not self._several:
            started = self._started(command.saga_id)
        priority = started.priority if started is not None else 0
        key = (started.fairness_key if started is not None else None) or ""
        self._seq += 1
        lane = tuple((g.policy, g.kind, g.name) for g in gates)
        # A cost counts only against a budget (a command with none costs nothing of one).
        cost = command.cost if self._budgets is not None else None
        if cost is not None and not any(g.limit.budget for g in gates):
            cost = None
        entry = Waiting(
            self._seq,
            self._now(),
            priority,
            key,
            lane,
            command.compensation,
            None,
            cost,
            charge_of(cost, gates),
            self._weight_of[gates[0].policy](key),
        )
        ticket = _Ticket(command, gates, entry)
        entry.item = ticket
        k = (command.command_id, command.attempt)
        self._tickets[k] = ticket
        self._by_saga.setdefault(command.saga_id, set()).add(k)
        self._queue.push(entry)
        for gate in gates:
            gate.waiting += 1
        if self._splits:
            self._arrived(gates)
        self.stats["queued"] += 1
        self._kick()

    def _observe(self, over: list[_Key], events: Sequence[Event]) -> None:
        """Tells the adaptive limits of the attempts now over how they ended: answered
        (the reply's latency from the send) or timed out (ended otherwise: nothing)."""
        replied = {e.command_id for e in events if isinstance(e, ReplyReceived)}
        timed_out = {(e.command_id, e.attempt) for e in events if isinstance(e, AttemptTimedOut)}
        tick = self._latency_clock()
        for command_id, attempt in over:
            ticket = self._tickets.get((command_id, attempt))
            if ticket is None or ticket.state is not TicketState.SENT:
                continue
            for gate in ticket.gates:
                adaptive = gate.adaptive
                if adaptive is None:
                    continue
                if (command_id, attempt) in timed_out:
                    adaptive.timed_out(tick)
                elif command_id in replied:
                    adaptive.observe(tick - ticket.sent_at, gate.in_flight, tick)

    def _release(self, key: _Key) -> None:
        ticket = self._tickets.pop(key, None)
        if ticket is None:
            return
        saga_keys = self._by_saga.get(ticket.command.saga_id)
        if saga_keys is not None:
            saga_keys.discard(key)
            if not saga_keys:
                del self._by_saga[ticket.command.saga_id]
        if ticket.state is TicketState.QUEUED:
            if self._queue.remove(ticket.entry):
                for gate in ticket.gates:
                    gate.waiting -= 1
        else:
            for gate in ticket.gates:
                gate.give_back(ticket.entry.cost)
        self.stats["released"] += 1
        self._kick()

    def _kick(self) -> None:
        if self._wake is None:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                return  # built outside a loop (a test): the first enqueue starts it
            self._wake = asyncio.Event()
        self._wake.set()
        if self._pump is None or self._pump.done():
            self._pump = asyncio.get_running_loop().create_task(self._run())

    def _lane_admits(self, now: float) -> Callable[[Hashable], bool]:
        gates = self._gates

        def admits(lane: Hashable) -> bool:
            assert isinstance(lane, tuple)
            return all(gates[g].admits(now) for g in lane)

        return admits

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            self._wake.clear()
            delay = self._dispatch()
            if delay is None:
                await self._wake.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), delay)

    def _dispatch(self) -> float | None:
        """Sends what the gates admit now; returns how long until a token frees a lane
        that waits for one (None: a release or an enqueue wakes the queue)."""
        now = self._now()
        # Token buckets refill on the process's monotonic clock (the queue waits for a
        # token in real time), aging and timeouts go by the engine's clock.
        tick = self._monotonic()
        if self._splits and (
            self._shares_due or self._shares_at is None or tick - self._shares_at >= SHARES_EVERY_S
        ):
            self._share_out(tick)
        admits = self._lane_admits(tick)
        sent_at = self._latency_clock()
        batch: list[_Ticket] = []
        while True:
            entry = self._queue.pop(now, admits, self._budgets)
            if entry is None:
                break
            ticket: _Ticket = entry.item
            for gate in ticket.gates:
                gate.take(tick, entry.cost)
                gate.waiting -= 1
            ticket.state = TicketState.SENT
            ticket.held_s = now - entry.arrived
            ticket.sent_at = sent_at
            batch.append(ticket)
            self._on_sent(ticket.command.saga_id)
        if batch:
            task = asyncio.get_running_loop().create_task(self._send(batch))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)
        if not len(self._queue):
            return None
        waits = [w for w in (g.next_token_in(tick) for g in self._gates.values()) if w]
        if self._splits:  # commands wait: the shares move on meanwhile
            waits.append(SHARES_EVERY_S)
        return min(waits) + 0.001 if waits else None

    def _arrived(self, gates: tuple[Gate, ...]) -> None:
        """Counts a command's arrival at its gates, for the policies' shares."""
        for gate in gates:
            gate.arrived += 1
            if gate.policy_share <= 0:
                self._shares_due = True  # a policy's first command in a while: room for it

    def _share_out(self, tick: float) -> None:
        """Each shared name's gates: their policy's share of its recent arrivals."""
        self._shares_at, self._shares_due = tick, False
        share = self._share
        for split, gates in self._splits:
            split.arrived({g.policy: g.arrived for g in gates}, tick)
            shares = split.shares({g.policy for g in gates if g.waiting or g.in_flight})
            for gate in gates:
                gate.arrived = 0
                gate.set_share(share, shares[gate.policy])

    async def _send(self, batch: list[_Ticket]) -> None:
        inner, pipelined = self._inner, self._pipelined
        pending: list[tuple[_Ticket, Awaitable[None]]] = []
        failed: list[tuple[_Ticket, BaseException]] = []
        for ticket in batch:
            try:
                if pipelined is not None:
                    pending.append((ticket, await pipelined.start_command(ticket.command)))
                else:
                    await inner.send_command(ticket.command)
                    self.stats["sent"] += 1
            except Exception as exc:
                failed.append((ticket, exc))
        for ticket, ack in pending:
            try:
                await ack
                self.stats["sent"] += 1
            except Exception as exc:
                failed.append((ticket, exc))
        again: list[_Ticket] = []
        for ticket, error in failed:
            self.stats["send_failed"] += 1
            if isinstance(error, PermanentError):
                # Refused for good (too large for the broker): sending it again would
                # hold its permit for ever. Its attempt times out, as an unanswered one.
                log.error("sending command %s: %s", ticket.command.command_id, error)
                self._release((ticket.command.command_id, ticket.command.attempt))
                continue
            log.warning("sending command %s: %s; retrying", ticket.command.command_id, error)
            again.append(ticket)
        if again:
            await asyncio.sleep(_RETRY_SEND_S)
            for ticket in again:
                self._requeue(ticket)

    def _requeue(self, ticket: _Ticket) -> None:
        key = (ticket.command.command_id, ticket.command.attempt)
        if self._tickets.get(key) is not ticket or ticket.state is not TicketState.SENT:
            return  # released meanwhile (answered, ended, moved away)
        for gate in ticket.gates:
            gate.give_back(ticket.entry.cost)
            gate.waiting += 1
        ticket.state = TicketState.QUEUED
        self._queue.push(ticket.entry, front=True)  # it keeps its place: first again
        self._kick()


def _adaptive_view(gate: Gate) -> dict[str, object] | None:
    """An adaptive limit as an operator reads it (None: the gate's is not adaptive)."""
    adaptive = gate.adaptive
    if adaptive is None:
        return None
    return {
        "algorithm": adaptive.algorithm,
        "limit": adaptive.value,
        "min": adaptive.min_limit,
        "max": adaptive.max_limit,
        "cause": adaptive.cause,
        "reason": adaptive.reason,
        "baseline_ms": None if adaptive.baseline is None else round(adaptive.baseline * 1000, 3),
        "recent_ms": None if adaptive.recent is None else round(adaptive.recent * 1000, 3),
        "replies": adaptive.replies,
        "timeouts": adaptive.timeouts,
    }


def _splits(gates: Iterable[Gate]) -> list[tuple[PolicyShares, tuple[Gate, ...]]]:
    """The names several policies limit, with their gates, shared equally until the
    first arrivals."""
    by_name: dict[tuple[GateKind, str], list[Gate]] = {}
    for gate in gates:
        by_name.setdefault((gate.kind, gate.name), []).append(gate)
    splits = []
    for shared in by_name.values():
        if len(shared) > 1:
            split = PolicyShares([g.policy for g in shared])
            shares = split.shares()
            for gate in shared:
                gate.set_share(gate.share, shares[gate.policy])
            splits.append((split, tuple(shared)))
    return splits


def flow_control(
    limits: LimitsSettings,
    sender: CommandSender,
    live: LiveSagas,
    clock: Clock,
    owns: Callable[[str], bool],
) -> FlowControl | None:
    """Flow control in front of ``sender`` when a limit is configured, its timers seen by
    ``live``; None (nothing on the hot path) otherwise."""
    if not limits.enabled:
        return None

    def started(saga_id: str) -> SagaStarted | None:
        held = live.get(saga_id)
        return held.runtime.started if held is not None else None

    def sent(saga_id: str) -> None:
        # Its timer is armed again: the attempt's timeout (left out while it was held)
        # is due from now on.
        if owns(saga_id):
            live.rearm(saga_id)

    flow = FlowControl(
        limits,
        sender,
        started,
        lambda: clock.now().timestamp(),
        sent,
        owns,
        latency_clock=clock.monotonic,
    )
    live.flow = flow
    return flow
