"""One drill run: the processes up, sagas started at the asked rate, the scenario's faults
injected, the drain awaited, then the checks (``_drill_checks``). Every loop here is
bounded in count and in time."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import shlex
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from saga_engine.cli._drill_checks import Check, ProgressWatch, check_all, saga_databases
from saga_engine.cli._drill_kafka import KafkaLinkProxy
from saga_engine.cli._drill_proxy import LinkProxy, PgProxy
from saga_engine.cli._drill_shards import ShardOutage, shard_check, shard_down, shard_proxies
from saga_engine.cli._drill_stack import SESSION_TIMEOUT_MS, DrillStack
from saga_engine.kernel._errors import CliError
from saga_engine.kernel._retry import OUTAGE, is_transient
from saga_engine.kernel._settings import Settings

__all__ = ["SCENARIOS", "DrillPlan", "DrillReport", "run_drill"]

SCENARIOS = (
    "engine-kill",
    "engine-kill-slow",
    "engine-freeze",
    "pg-cut",
    "broker-restart",
    "participant-kill",
    "engine-link-cut",
    "participant-link-cut",
    "slow-link",
    "shard-down",
    "mix",
)
#: The faults ``mix`` takes turns with (and a broker restart after them, when the drill
#: has a command for it).
_MIX = (
    "engine-kill",
    "participant-kill",
    "pg-cut",
    "engine-freeze",
    "engine-link-cut",
    "participant-link-cut",
    "slow-link",
)
#: The scenarios whose processes reach Kafka through the drill's link proxies.
_KAFKA_LINKS = ("engine-link-cut", "participant-link-cut", "slow-link", "mix")
#: How long the engines may take to make their first progress.
_START_S = 90.0
#: How long the drill's own client tries a start or an event while the broker is away.
_SEND_FOR_S = 90.0
#: How long a broker restart command may take.
_RESTART_TIMEOUT_S = 120.0


@dataclass
class DrillPlan:
    scenario: str
    saga_type: str
    sagas: list[Any]  # the Saga classes, for the replay check
    inputs: Iterator[Any]
    rate: float  # sagas per second
    duration_s: float
    #: input -> the (EventSource, fact) pairs the outside world publishes for its saga.
    events: Callable[[Any], Iterable[tuple[Any, Any]]] | None = None
    engines: int = 2
    fault_every_s: float = 5.0
    stall_s: float = 3.0  # how long pg-cut holds new connections
    #: How long a Kafka link cut holds new connections, and a slow link stays slow: past
    #: the session timeout, so the cut processes' groups move their partitions.
    link_fault_s: float = SESSION_TIMEOUT_MS / 1000 + 2
    link_latency_s: float = 0.3  # what a slow link adds, each way
    #: How long shard-down keeps a shard away from the engines.
    shard_down_s: float = 10.0
    drain_timeout_s: float = 120.0
    #: The command that restarts the user's Kafka broker (``--broker-restart``): the
    #: drill cannot restart a broker it did not start, so the user says how.
    broker_restart: str | None = None


@dataclass
class DrillReport:
    scenario: str
    started: int
    faults: list[str] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    timings: dict[str, float | None] = field(default_factory=dict)
    #: What each of the drill's link proxies counted (``LinkStats``), by link.
    links: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def as_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "ok": self.ok,
            "sagas": self.started,
            "faults": self.faults,
            "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in self.checks],
            "timings": self.timings,
            "links": self.links,
        }


@dataclass
class _Links:
    """The drill's link proxies: the engines' to Postgres (or to each shard), and each
    group's to Kafka; and the shards stopped for the engines (``shard-down``)."""

    pg: PgProxy | None = None
    engines: KafkaLinkProxy | None = None
    participants: KafkaLinkProxy | None = None
    shards: dict[str, PgProxy] = field(default_factory=dict)
    outages: list[ShardOutage] = field(default_factory=list)

    def named(self) -> dict[str, LinkProxy]:
        found: dict[str, LinkProxy | None] = {
            "engines-postgres": self.pg,
            "engines-kafka": self.engines,
            "participants-kafka": self.participants,
            **{f"engines-shard-{name}": proxy for name, proxy in self.shards.items()},
        }
        return {name: proxy for name, proxy in found.items() if proxy is not None}

    async def close(self) -> None:
        for proxy in self.named().values():
            await proxy.close()

    def problem(self) -> str | None:
        """The first Kafka answer a proxy could not read, naming the link."""
        for name, proxy in (("engines", self.engines), ("participants", self.participants)):
            if proxy is not None and proxy.problem:
                return f"the {name}' Kafka link proxy: {proxy.problem}"
        return None


async def run_drill(stack: DrillStack, plan: DrillPlan) -> DrillReport:
    if plan.scenario == "broker-restart" and not plan.broker_restart:
        raise CliError(
            "broker-restart needs --broker-restart CMD, the command that restarts the broker "
            f"at {stack.settings.kafka.bootstrap_servers} (e.g. 'docker restart kafka'): the "
            "drill did not start that broker and does not know how to restart it"
        )
    links = _Links()
    watch = ProgressWatch(
        stack.settings.pg.dsn.get_secret_value(),
        stack.engine_schema,
        databases=list(saga_databases(stack.settings).values()),
    )
    report = DrillReport(plan.scenario, 0)
    try:
        if plan.scenario == "shard-down":
            links.shards = await shard_proxies(stack)
        if plan.scenario in ("pg-cut", "mix"):
            links.pg = await _proxy(stack)
        if plan.scenario in _KAFKA_LINKS:
            links.engines, links.participants = await _kafka_links(stack)
        for name in stack.participants:
            stack.start_participant(name)
        for i in range(plan.engines):
            stack.start_engine(f"engine-{i}")
        async with asyncio.TaskGroup() as tasks:
            load = tasks.create_task(_load(stack, plan, watch))
            watching = tasks.create_task(_watch(stack, watch, plan))
            await _faults(stack, plan, links, watch, report)
            await load
            watching.cancel()
        report.started = len(watch.saga_ids)
        await _drain(stack, watch, plan.drain_timeout_s)
        ledgers = {n: stack.participant_schema(n) for n in stack.participants}
        report.checks = await check_all(
            stack.settings, stack.engine_schema, ledgers, watch.saga_ids, plan.sagas
        )
        if links.outages:
            report.checks.append(
                await shard_check(
                    stack.settings,
                    stack.engine_schema,
                    watch.saga_ids,
                    watch.sent_at,
                    links.outages,
                )
            )
        report.timings = watch.timings(stack.takeovers())
        report.links = {name: p.stats.as_json() for name, p in links.named().items()}
    finally:
        stack.stop_all()
        await links.close()
    if problem := links.problem():
        # The connection ended there, so nothing went around the proxy; but the drill
        # did not test what it says it did.
        raise CliError(f"{problem}; the drill's Kafka faults need a client it can carry")
    return report


async def _proxy(stack: DrillStack) -> PgProxy:
    """The engines reach Postgres through the drill's proxy (their DSN points at it)."""
    dsn = stack.settings.pg.dsn.get_secret_value()
    parts = urlsplit(dsn)
    if not parts.hostname:
        raise CliError("pg-cut needs SAGA_PG__DSN as a URL with a host (postgresql://...)")
    proxy = PgProxy(parts.hostname, parts.port or 5432)
    await proxy.start()
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@127.0.0.1:{proxy.port}" if userinfo else f"127.0.0.1:{proxy.port}"
    stack.pg_dsn = urlunsplit(parts._replace(netloc=netloc))
    return proxy


async def _kafka_links(stack: DrillStack) -> tuple[KafkaLinkProxy, KafkaLinkProxy]:
    """The engines and the participants reach Kafka each through a proxy of their own
    (their bootstrap address is its listener's)."""
    bootstrap = stack.settings.kafka.bootstrap_servers
    engines, participants = KafkaLinkProxy(bootstrap), KafkaLinkProxy(bootstrap)
    for proxy in (engines, participants):
        await proxy.start()
    stack.kafka_engines = engines.bootstrap_servers
    stack.kafka_participants = participants.bootstrap_servers
    return engines, participants


async def _load(stack: DrillStack, plan: DrillPlan, watch: ProgressWatch) -> None:
    """Starts ``rate`` sagas a second for ``duration_s`` (fewer if the inputs run out).
    The first saga starts at once; the others are paced from the engines' first progress,
    the faults' clock too, so that a slow start-up cannot eat the load before the first
    fault."""
    from saga_engine.client._client import SagaClient
    from saga_engine.transport._kafka import ensure_topics
    from saga_engine.transport._topics import Topics

    settings = _engine_settings(stack)
    await ensure_topics(settings.kafka, [Topics(stack.namespace).inbox])
    total = max(1, round(plan.rate * plan.duration_s))
    begin = time.monotonic()
    async with SagaClient(settings, source="/saga-drill") as client:
        for i, item in zip(range(total), plan.inputs, strict=False):
            if i == 1:
                await _started(watch)  # bounded; without progress the faults end the drill
                begin = time.monotonic() - 1 / plan.rate
            await asyncio.sleep(max(0.0, begin + i / plan.rate - time.monotonic()))
            saga_id = f"{stack.namespace}-{i:05d}"
            watch.saga_ids.append(saga_id)
            watch.sent_at[saga_id] = time.time()
            await _sent(
                f"the start of {saga_id}",
                lambda: client.start(plan.saga_type, item, saga_id=saga_id),  # noqa: B023
            )
            # The facts its saga waits for, as the services owning them would publish
            # them (a payment provider's capture, say); ids per saga: kept once each.
            for n, (source, fact) in enumerate(plan.events(item) if plan.events else ()):
                event_id = f"{saga_id}-event-{n}"
                await _sent(
                    f"event {event_id}",
                    lambda: client.publish_event(source, fact, event_id=event_id),  # noqa: B023
                )


async def _sent(what: str, send: Callable[[], Awaitable[object]]) -> None:
    """``send()``, again while it fails transiently (a broker restarting under the load),
    for at most ``_SEND_FOR_S``: a start with its saga id and an event with its id are
    kept once, however often they are sent."""
    backoff = OUTAGE.backoff()
    give_up = time.monotonic() + _SEND_FOR_S
    while True:
        try:
            await send()
            return
        except Exception as exc:
            if not is_transient(exc):
                raise
            if time.monotonic() > give_up:
                raise CliError(
                    f"the drill could not send {what} in {_SEND_FOR_S:.0f}s: {exc}"
                ) from exc
            await backoff.sleep()


async def _started(watch: ProgressWatch) -> bool:
    """Waits (at most ``_START_S``) for the engines' first progress; whether it came."""
    ready_by = time.monotonic() + _START_S
    while not watch.progress_at and time.monotonic() < ready_by:  # noqa: ASYNC110
        await asyncio.sleep(0.25)
    return bool(watch.progress_at)


def _engine_settings(stack: DrillStack) -> Settings:
    s = stack.settings
    kafka = s.kafka.model_copy(
        update={"topic_prefix": stack.namespace, "group_id": f"{stack.namespace}-engines"}
    )
    pg = s.pg.model_copy(update={"db_schema": stack.engine_schema})
    return s.model_copy(update={"kafka": kafka, "pg": pg})


@contextlib.asynccontextmanager
async def _sagas_tables(watch: ProgressWatch) -> AsyncIterator[list[asyncpg.Connection]]:
    """A connection to each database of the sagas' rows (every shard's, past one)."""
    conns: list[asyncpg.Connection] = []
    try:
        for dsn in watch.databases or [watch.dsn]:
            conns.append(await asyncpg.connect(dsn))
        yield conns
    finally:
        for conn in conns:
            await conn.close()


async def _watch(stack: DrillStack, watch: ProgressWatch, plan: DrillPlan) -> None:
    async with _sagas_tables(watch) as conns:
        while True:  # cancelled when the load and the faults are done
            await watch.sample(conns)
            await asyncio.sleep(0.25)


async def _drain(stack: DrillStack, watch: ProgressWatch, timeout_s: float) -> None:
    """Waits (at most ``timeout_s``) until every saga is terminal or parked; the checks
    then name what is left."""
    async with _sagas_tables(watch) as conns:
        deadline = time.monotonic() + timeout_s
        # Polled: the open sagas are counted in another process's tables.
        while await watch.sample(conns) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.25)


async def _faults(
    stack: DrillStack,
    plan: DrillPlan,
    links: _Links,
    watch: ProgressWatch,
    report: DrillReport,
) -> None:
    """The scenario's faults, one every ``fault_every_s`` while the load runs (bounded:
    at most duration / interval of them)."""
    rng = random.Random()
    if plan.scenario == "engine-kill-slow":
        kinds: Iterator[str] = iter(["engine-kill-slow"])
    elif plan.scenario == "mix":
        kinds = itertools.cycle(_MIX + (("broker-restart",) if plan.broker_restart else ()))
    else:
        kinds = itertools.repeat(plan.scenario)
    # The faults start once the engines make progress: start-up is not a fault's stall.
    if not await _started(watch):
        raise CliError(f"no progress in {_START_S:.0f}s; engine log:\n{stack.log_tail('engine-0')}")
    begin = time.monotonic()
    count = max(1, int(plan.duration_s // plan.fault_every_s))
    for n, kind in zip(range(count), kinds, strict=False):
        wait = begin + (n + 1) * plan.fault_every_s - time.monotonic()
        if plan.scenario == "engine-kill-slow":
            wait = begin + plan.duration_s / 3 - time.monotonic()
        await asyncio.sleep(max(0.0, wait))
        crashed = [n for n in stack.died() if n.startswith(("engine", "participant"))]
        if crashed and not report.faults:
            raise CliError(f"{crashed[0]} exited unasked:\n{stack.log_tail(crashed[0])}")
        report.faults.append(await _inject(stack, kind, links, watch, rng, plan))


async def _inject(
    stack: DrillStack,
    kind: str,
    links: _Links,
    watch: ProgressWatch,
    rng: random.Random,
    plan: DrillPlan,
) -> str:
    if kind in ("engine-link-cut", "participant-link-cut", "slow-link"):
        return await _link_fault(kind, links, watch, plan)
    if kind == "shard-down":
        turn = len(links.outages)
        return await shard_down(stack, links.shards, turn, plan.shard_down_s, watch, links.outages)
    engines = [n for n in stack.procs if n.startswith("engine-") and stack.alive(n)]
    now = (time.monotonic(), time.time())
    if kind in ("engine-kill", "engine-kill-slow"):
        victim = rng.choice(engines)
        stack.kill(victim)
        watch.faults.append(("engine-kill", *now))
        if kind == "engine-kill":
            stack.start_engine(victim)  # a new process in its place, as an orchestrator does
        return f"SIGKILL {victim}"
    if kind == "engine-freeze":
        victim = rng.choice(engines)
        stack.signal(victim, signal.SIGSTOP)
        watch.faults.append(("engine-freeze", *now))
        # Past the session timeout: the group moves its partitions while it sleeps.
        await asyncio.sleep(SESSION_TIMEOUT_MS / 1000 + 4)
        stack.signal(victim, signal.SIGCONT)
        return f"SIGSTOP {victim} for {SESSION_TIMEOUT_MS / 1000 + 4:.0f}s, then SIGCONT"
    if kind == "broker-restart":
        watch.faults.append(("broker-restart", *now))
        took = await _restart_broker(plan.broker_restart or "")
        return f"broker restarted by {plan.broker_restart!r} in {took:.1f}s"
    if kind == "participant-kill":
        victim = rng.choice(list(stack.participants))
        stack.kill(f"participant-{victim}")
        watch.faults.append(("participant-kill", *now))
        stack.start_participant(victim)
        return f"SIGKILL participant-{victim}"
    assert kind == "pg-cut"
    assert links.pg is not None
    watch.faults.append(("pg-cut", *now))
    with contextlib.suppress(asyncio.CancelledError):
        await links.pg.cut(plan.stall_s)
    return f"Postgres link cut, stalled {plan.stall_s:.0f}s"


async def _link_fault(kind: str, links: _Links, watch: ProgressWatch, plan: DrillPlan) -> str:
    """A Kafka link fault: one group's link cut (the other's carries on), or both slow.
    The line says what the proxies counted while it lasted."""
    assert links.engines is not None
    assert links.participants is not None
    watch.faults.append((kind, time.monotonic(), time.time()))
    if kind == "slow-link":
        before = links.engines.stats.delayed + links.participants.stats.delayed
        await asyncio.gather(
            links.engines.slow(plan.link_latency_s, plan.link_fault_s),
            links.participants.slow(plan.link_latency_s, plan.link_fault_s),
        )
        delayed = links.engines.stats.delayed + links.participants.stats.delayed - before
        return (
            f"Kafka links slowed by {plan.link_latency_s * 1000:.0f} ms each way for "
            f"{plan.link_fault_s:.0f}s: {delayed} frames delayed, "
            f"{watch.open} sagas open when it ended"
        )
    group = "engine" if kind == "engine-link-cut" else "participant"
    proxy = links.engines if group == "engine" else links.participants
    dropped, held = proxy.stats.dropped, proxy.stats.held
    await proxy.cut(plan.link_fault_s)
    return (
        f"{group} Kafka link cut, stalled {plan.link_fault_s:.0f}s: "
        f"{proxy.stats.dropped - dropped} connections dropped, "
        f"{proxy.stats.held - held} held until it ended, {watch.open} sagas open then"
    )


async def _restart_broker(command: str) -> float:
    """Runs the user's restart command (bounded); its failure ends the drill, saying why."""
    begin = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *shlex.split(command),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with asyncio.timeout(_RESTART_TIMEOUT_S):
            output, _ = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise CliError(
            f"--broker-restart {command!r} did not finish in {_RESTART_TIMEOUT_S:.0f}s"
        ) from None
    if proc.returncode != 0:
        tail = output.decode(errors="replace")[-2000:]
        raise CliError(f"--broker-restart {command!r} exited {proc.returncode}:\n{tail}")
    return time.monotonic() - begin
