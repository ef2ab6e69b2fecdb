"""An engine's collaborators, built once by a composition root.

The worker (and the testing kit, for tests) builds them with :meth:`EngineParts.build`
and hands the same objects to the ``Engine`` and to whoever else works on its sagas: the
admin API (the store, the registry, the counters, flow control), housekeeping (live
sagas, the clock), ownership (live sagas, flow control's share). Nothing reads them back
from the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from saga_engine.core.authoring._definition import Saga, SagaRegistry
from saga_engine.core.authoring._graph import Graph
from saga_engine.core.planning._rollout import RolloutTable
from saga_engine.core.runtime._operations import CommandLimit
from saga_engine.kernel._crash import CrashHook
from saga_engine.kernel._errors import DefinitionError
from saga_engine.kernel._settings import LimitsSettings, Settings
from saga_engine.runner._cache import LiveSagas
from saga_engine.runner._clock import Clock, SystemClock
from saga_engine.runner._flow_sender import FlowControl, flow_control
from saga_engine.runner._learned_costs import LearnedCosts
from saga_engine.runner._matcher import EventMatcher
from saga_engine.runner._observer import EngineObserver, EngineStats
from saga_engine.runner._saga_owner import Owners
from saga_engine.runner._tracing import step_context_sender
from saga_engine.runner._waiters import Waiters
from saga_engine.store._domain_store import DomainEventStore
from saga_engine.store._store import EventStore
from saga_engine.telemetry._telemetry import Telemetry, default_telemetry
from saga_engine.transport._bus import CommandSender, Ownership
from saga_engine.transport._command_records import CommandRecords
from saga_engine.transport._topics import Topics


@dataclass(frozen=True, slots=True)
class EngineParts:
    settings: Settings
    #: The saga types deployed here, and which version of each a new saga runs.
    registry: SagaRegistry
    rollouts: RolloutTable
    store: EventStore
    #: Where commands go: the broker's sender behind the step span's context, and flow
    #: control in front of both when a limit is configured.
    sender: CommandSender
    clock: Clock
    #: The sagas held in memory, with their locks and timers.
    live: LiveSagas
    flow: FlowControl | None
    #: Spans and counters: it listens to what the engine did.
    observer: EngineObserver
    #: Which sagas this engine drives (all of them without an Ownership).
    owners: Owners
    #: Callers waiting for a saga to end or park.
    waiters: Waiters
    #: The fault-injection tests' seam: called with each crash point's name.
    crash_hook: CrashHook | None = None
    #: What a saga waiting for a domain event is owed (None: no domain events here).
    matcher: EventMatcher | None = None
    #: The size rule for the commands sagas issue (a step whose command is larger fails
    #: before the command is recorded). None: commands are not measured.
    command_limit: CommandLimit | None = None
    #: What steps were measured to cost (``cost="learned"``), kept fresh by housekeeping.
    learned: LearnedCosts = field(default_factory=LearnedCosts)

    @property
    def stats(self) -> EngineStats:
        """The engine's counters (``/metrics``)."""
        return self.observer.stats

    @classmethod
    def build(
        cls,
        settings: Settings,
        *,
        sagas: Sequence[type[Saga[Any, Any]]],
        store: EventStore,
        sender: CommandSender,
        clock: Clock | None = None,
        crash_hook: CrashHook | None = None,
        telemetry: Telemetry | None = None,
        ownership: Ownership | None = None,
        domain_events: DomainEventStore | None = None,
        command_records: CommandRecords | None = None,
    ) -> EngineParts:
        """The collaborators of an engine driving ``sagas`` over ``store`` and ``sender``.
        ``telemetry``: the global OpenTelemetry providers unless one is given;
        ``ownership``: which sagas it drives when several engines share them;
        ``command_records``: the records ``sender`` sends commands as (the broker's
        sender's ``records``), which the size rule measures; unset, as the broker's
        sender would write them without a codec."""
        if command_records is None:
            command_records = CommandRecords(Topics.of(settings.kafka), "/saga-engine")
        clock = clock or SystemClock()
        observer = EngineObserver(telemetry or default_telemetry())
        live = LiveSagas(clock, on_evict=observer.evicted)
        observer.telemetry.watch(live)  # the saga.open gauge
        owners = Owners(ownership, observer.stats)
        traced = step_context_sender(sender, observer.spans)
        flow = flow_control(settings.limits, traced, live, clock, owners.owns)
        matcher = None
        if domain_events is not None:
            poll_s = settings.engine.event_poll_s
            matcher = EventMatcher(domain_events, live, clock, observer.stats, poll_s)
        registry = SagaRegistry(sagas)
        check_declared_costs(registry, settings.limits)
        learned = LearnedCosts()
        return cls(
            settings=settings,
            registry=registry,
            rollouts=RolloutTable(),
            store=store,
            sender=flow or traced,
            clock=clock,
            live=live,
            flow=flow,
            observer=observer,
            owners=owners,
            waiters=Waiters(),
            crash_hook=crash_hook,
            matcher=matcher,
            command_limit=CommandLimit(
                settings.kafka.max_message_bytes,
                command_records.size,
                settings.limits,
                learned.cost,
                settings.engine.continue_as_new_after,
                command_records.bound,
            ),
            learned=learned,
        )


def check_declared_costs(registry: SagaRegistry, limits: LimitsSettings) -> None:
    """Refuses to start an engine whose graph sagas declare a cost no budget could hold,
    in any flow policy configured (a saga may run under any of them; the reason names
    the policy when there are several), or name a cost class the settings lack:
    DefinitionError, with every such node and the numbers, before any saga runs. A step
    written in ``run`` is checked when it is issued, by its saga's policy (its step
    fails, recorded)."""
    refusals = [
        refusal
        for name in registry.names()
        for definition in registry.versions(name).values()
        if isinstance(definition.graph, Graph)
        for refusal in definition.graph.cost_refusals(name, limits)
    ]
    if refusals:
        raise DefinitionError("; ".join(refusals))
