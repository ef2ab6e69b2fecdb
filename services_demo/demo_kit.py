"""The demo scenario's kit: its targets (a local stack, an external one, compose), the
handles it drives them with (``Demo``: HTTP, the engine's tables, a saga client, a Kafka
producer), what an order placed by it must end as (``Placed``), and the Kafka helpers and
history summaries it prints. ``scenario.py`` tells the story with them."""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import httpx
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from saga_engine import CodecChain, SagaNotFound, SagaStatus, Settings
from saga_engine.client import SagaClient
from saga_engine.events import (
    AttemptTimedOut,
    CommandIssued,
    CompensationCompleted,
    CompensationStarted,
    Event,
    NodeSkipped,
    ReplyReceived,
    SagaCancelled,
    SagaCompensated,
    SagaCompleted,
    SagaFailed,
    SignalReceived,
    TimerFired,
    TimerStarted,
)
from saga_engine.settings import CodecSettings, KafkaSettings, PostgresSettings
from saga_engine.store import EventStore
from saga_engine.store._connect import connect_event_store
from services_demo.config import PRICES, SERVICES
from services_demo.run import DemoStack

FINISHED = {s.value for s in SagaStatus if s.is_terminal or s.is_parked}


class DemoFailed(AssertionError):
    """An expectation of the scenario did not hold."""


def say(text: str = "") -> None:
    print(text, flush=True)


def check(condition: bool, what: str, *, quiet: bool = False) -> None:
    """Every expectation goes through here: the demo stops at the first one that fails."""
    if not condition:
        raise DemoFailed(what)
    if not quiet:
        say(f"    ok  {what}")


def items(**qty: int) -> list[dict[str, Any]]:
    return [{"sku": sku, "qty": n} for sku, n in qty.items()]


def show_items(lines: list[dict[str, Any]]) -> str:
    return ", ".join(f"{i['qty']} x {i['sku']}" for i in lines)


# --------------------------------------------------------------------------- the target


class EngineControl:
    """How the crash scenario kills and restarts the engine."""

    async def kill(self) -> str:
        raise NotImplementedError

    async def restart(self) -> str:
        raise NotImplementedError


class LocalEngine(EngineControl):
    def __init__(self, stack: DemoStack) -> None:
        self.stack = stack

    async def kill(self) -> str:
        pid = self.stack.pid("engine")
        self.stack.kill_engine()
        return f"SIGKILL to the engine process (pid {pid})"

    async def restart(self) -> str:
        recovered = await self.stack.restart_engine()
        return (
            f"a new engine process (pid {self.stack.pid('engine')}) took the inbox partitions "
            f"and rebuilt {recovered} open saga(s) from their histories in Postgres"
        )


class CommandEngine(EngineControl):
    """For a stack this process did not start: shell commands (``docker compose kill``...)."""

    def __init__(self, kill_cmd: str, start_cmd: str) -> None:
        self.kill_cmd, self.start_cmd = kill_cmd, start_cmd

    async def _run(self, cmd: str) -> None:
        proc = await asyncio.create_subprocess_exec(*shlex.split(cmd))
        if await proc.wait() != 0:
            raise DemoFailed(f"`{cmd}` failed with exit code {proc.returncode}")

    async def kill(self) -> str:
        await self._run(self.kill_cmd)
        return f"`{self.kill_cmd}`"

    async def restart(self) -> str:
        await self._run(self.start_cmd)
        return f"`{self.start_cmd}`; it recovers the open sagas from Postgres"


@dataclass
class Target:
    """Where the demo's services, engine database and topics are."""

    urls: dict[str, str]
    engine_dsn: str
    engine_schema: str
    kafka: KafkaSettings
    orders_topic: str
    engine: EngineControl | None = None
    service_schemas: tuple[str, ...] = ()
    #: The engine's admin API (schedules are triggered there); None: not reachable.
    admin_url: str | None = None
    #: The stack's payload codec (payloads by reference): to read its histories.
    codec: CodecSettings = field(default_factory=CodecSettings)
    #: Past one database (``make demo-shards``): the shards as ``SAGA_PG__SHARDS`` names
    #: them (name, partitions, dsn); the control database is ``engine_dsn``'s. Empty:
    #: the engine's store is ``engine_dsn``'s database.
    shards: list[dict[str, str]] = field(default_factory=list)

    @property
    def pg(self) -> PostgresSettings:
        """The engine's store, as the engine has it (one database, or the shards)."""
        shards = self.shards
        return PostgresSettings.model_validate(
            {
                "dsn": self.engine_dsn,
                "db_schema": self.engine_schema,
                **({"shards": shards, "control_dsn": self.engine_dsn} if shards else {}),
            }
        )

    @property
    def trigger_group(self) -> str:
        return f"{self.kafka.group_id}.triggers"

    @classmethod
    def of_stack(cls, stack: DemoStack) -> Target:
        c = stack.config
        return cls(
            urls={s: c.url(s) for s in SERVICES},
            engine_dsn=c.dsn,
            engine_schema=c.engine_db_schema,
            kafka=c.kafka,
            orders_topic=c.orders_topic,
            engine=LocalEngine(stack),
            service_schemas=tuple(c.schema(s) for s in SERVICES),
            admin_url=c.admin_url,
            codec=c.codec,
            shards=c.shard_list,
        )


# --------------------------------------------------------------------------- the demo


@dataclass
class Placed:
    """An order placed by the scenario, and what it must end as."""

    label: str
    order_id: str
    saga_id: str
    customer: str
    items: list[dict[str, Any]]
    expect: str  # confirmed | rejected
    reason: str = ""  # a rejection reason must contain this
    order: dict[str, Any] = field(default_factory=dict)
    placed_at: float = field(default_factory=time.monotonic)
    saga_status: str = ""
    summary: str = ""
    events: list[Event] = field(default_factory=list)

    @property
    def total(self) -> int:
        return int(self.order.get("total") or 0)


class Demo:
    """The scenario's handles: HTTP, the engine's tables, a saga client, a Kafka producer."""

    def __init__(self, target: Target, *, approval_timeout_s: float) -> None:
        self.target = target
        self.approval_timeout_s = approval_timeout_s
        self.run_id = uuid.uuid4().hex[:8]
        self.placed: list[Placed] = []
        #: The fulfilments started by the scenario: the order's label -> saga id.
        self.fulfilments: dict[str, str] = {}
        self._stack = contextlib.AsyncExitStack()
        self.http: httpx.AsyncClient
        self.db: asyncpg.Connection[asyncpg.Record]
        #: The databases of the engine's sagas: ``db`` alone, or each shard's.
        self.saga_dbs: dict[str, asyncpg.Connection[asyncpg.Record]] = {}
        self.client: SagaClient
        self.store: EventStore
        self.producer: AIOKafkaProducer
        self.fraud_flaky = False

    async def __aenter__(self) -> Demo:
        try:
            await self._open()
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def _open(self) -> None:
        s = self._stack
        self.http = await s.enter_async_context(httpx.AsyncClient(timeout=10.0))
        self.db = await asyncpg.connect(self.target.engine_dsn)
        s.push_async_callback(self.db.close)
        self.saga_dbs = {"": self.db}
        if self.target.shards:
            self.saga_dbs = {}
            for shard in self.target.shards:
                name = shard["name"]
                self.saga_dbs[name] = await asyncpg.connect(shard["dsn"])
                s.push_async_callback(self.saga_dbs[name].close)
        settings = Settings(pg=self.target.pg, kafka=self.target.kafka, codec=self.target.codec)
        # Histories read as the engine wrote them (payloads by reference resolved), from
        # each saga's shard by the map in force when there are shards.
        self.store = await connect_event_store(
            settings,
            pg=settings.pg.model_copy(update={"pool_min_size": 1, "pool_max_size": 2}),
            codec=CodecChain.from_settings(settings.codec),
        )
        s.push_async_callback(self.store.close)
        self.client = await s.enter_async_context(
            SagaClient(settings, source="/services-demo/scenario")
        )
        self.producer = AIOKafkaProducer(
            bootstrap_servers=self.target.kafka.bootstrap_servers, acks="all"
        )
        await self.producer.start()
        s.push_async_callback(self.producer.stop)
        health = (await self.http.get(f"{self.url('fraud')}/health")).json()
        self.fraud_flaky = bool(health.get("flaky"))

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    def url(self, service: str) -> str:
        return self.target.urls[service]

    async def get_json(self, service: str, path: str) -> dict[str, Any]:
        """``GET path`` on a service; anything but a 200 fails the demo."""
        response = await self.http.get(f"{self.url(service)}{path}")
        check(
            response.status_code == 200,
            f"GET {path} on {service} answered {response.status_code}: {response.text}",
            quiet=True,
        )
        body: dict[str, Any] = response.json()
        return body

    # ------------------------------------------------------------------ orders

    async def place(
        self,
        label: str,
        customer: str,
        lines: list[dict[str, Any]],
        *,
        expect: str,
        reason: str = "",
        idempotency_key: str | None = None,
        pay: bool = True,
    ) -> Placed:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        response = await self.http.post(
            f"{self.url('orders')}/orders",
            json={"customer": customer, "items": lines},
            headers=headers,
        )
        check(
            response.status_code == 202, f"POST /orders answered {response.status_code}", quiet=True
        )
        body = response.json()
        placed = Placed(
            label, body["order_id"], body["saga_id"], customer, lines, expect=expect, reason=reason
        )
        self.placed.append(placed)
        say(f"  POST /orders  {customer}: {show_items(lines)}")
        say(f"    -> 202 order {placed.order_id}, saga {placed.saga_id}")
        if pay:
            await self.pay(placed)
        return placed

    async def cancel(self, placed: Placed, reason: str) -> None:
        """The customer cancels: the orders service sends the saga its ``cancel`` signal."""
        response = await self.http.post(
            f"{self.url('orders')}/orders/{placed.order_id}/cancel", json={"reason": reason}
        )
        check(
            response.status_code == 202, f"the cancel answered {response.status_code}", quiet=True
        )

    async def waiting_for_payment(self, placed: Placed) -> None:
        """Until the checkout races the payment against a cancel and its timeout."""

        async def waiting() -> bool:
            return any(
                isinstance(e, TimerStarted) and e.purpose == "sleep"
                for e in await self.history(placed.saga_id)
            )

        await self.wait_for(f"saga {placed.saga_id} to wait for its payment", waiting)

    async def pay(self, placed: Placed) -> None:
        """The payment provider's webhook for the order's full price: the orders service
        publishes ``payment-captured``, which the checkout waits for (often it is there
        before the checkout reaches its wait, and is matched all the same)."""
        amount = sum(PRICES.get(line["sku"], 0) * line["qty"] for line in placed.items)
        response = await self.http.post(
            f"{self.url('orders')}/orders/{placed.order_id}/payment", json={"amount": amount}
        )
        check(
            response.status_code == 202,
            f"the payment webhook answered {response.status_code}",
            quiet=True,
        )
        say(f"    payment of {amount} captured: the orders service published payment-captured")

    async def order(self, order_id: str) -> dict[str, Any] | None:
        response = await self.http.get(f"{self.url('orders')}/orders/{order_id}")
        if response.status_code == 404:
            return None
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        return body

    async def approve(self, placed: Placed, by: str) -> None:
        response = await self.http.post(
            f"{self.url('orders')}/orders/{placed.order_id}/approval",
            json={"approved": True, "by": by},
        )
        check(response.status_code == 202, f"the approval was accepted ({response.status_code})")

    # ------------------------------------------------------------------ the engine's tables

    async def saga_row(self, saga_id: str) -> dict[str, Any] | None:
        """The saga's status, current step and error, from its database (its shard)."""
        try:
            record = await self.store.get(saga_id)
        except SagaNotFound:
            return None
        return {
            "status": record.status.value,
            "current_step": record.current_step,
            "error": record.error,
        }

    async def on_saga_dbs(self, sql: str, *args: Any) -> dict[str, list[asyncpg.Record]]:
        """``sql`` (on the engine's schema: ``{schema}`` in it) in every database of the
        engine's sagas (one, or each shard): the rows of each."""
        sql = sql.format(schema=f'"{self.target.engine_schema}"')
        return {name: await db.fetch(sql, *args) for name, db in self.saga_dbs.items()}

    async def history(self, saga_id: str) -> list[Event]:
        try:
            loaded = await self.store.load(saga_id)
        except SagaNotFound:
            return []
        return [stored.event for stored in loaded.events]

    async def wait_for(
        self, what: str, probe: Callable[[], Awaitable[bool]], within_s: float = 30.0
    ) -> None:
        deadline = time.monotonic() + within_s
        while not await probe():
            if time.monotonic() > deadline:
                raise DemoFailed(f"timed out after {within_s:.0f}s waiting for {what}")
            await asyncio.sleep(0.1)

    async def waiting_for_approval(self, placed: Placed) -> None:
        async def waiting() -> bool:
            return any(
                isinstance(e, TimerStarted) and e.purpose == "signal_timeout"
                for e in await self.history(placed.saga_id)
            )

        await self.wait_for(f"saga {placed.saga_id} to wait for its approval", waiting)

    async def settle(self, placed: Placed, within_s: float = 30.0) -> Placed:
        """Waits until the saga is finished, then checks the order against expectations."""

        async def finished() -> bool:
            row = await self.saga_row(placed.saga_id)
            return row is not None and row["status"] in FINISHED

        await self.wait_for(f"saga {placed.saga_id} ({placed.label}) to finish", finished, within_s)
        row = await self.saga_row(placed.saga_id)
        assert row is not None
        placed.saga_status = row["status"]
        placed.events = await self.history(placed.saga_id)
        placed.summary = summarize(placed.events)
        order = await self.order(placed.order_id)
        check(order is not None, f"order {placed.order_id} exists", quiet=True)
        assert order is not None
        placed.order = order
        took = time.monotonic() - placed.placed_at
        say(f"    saga {placed.saga_status}, {took:.1f}s after the order: {placed.summary}")
        want_saga = {"confirmed": "completed"}.get(placed.expect, "compensated")
        check(
            placed.saga_status == want_saga,
            f"saga {placed.saga_status} (expected {want_saga})",
            quiet=True,
        )
        check(
            order["status"] == placed.expect,
            f"order {order['status']}"
            + (f": {order['reason']}" if order["reason"] else f", total {order['total']}"),
        )
        if placed.reason:
            check(
                placed.reason in (order["reason"] or ""),
                f"the reason names {placed.reason!r}",
                quiet=True,
            )
        started = sum(1 for e in placed.events if e.kind == "saga_started")
        check(started == 1, "one saga_started event", quiet=True)
        return placed

    # ------------------------------------------------------------------ balances and stock

    async def snapshot(self) -> Snapshot:
        balances = (await self.http.get(f"{self.url('payments')}/customers")).json()
        stock = (await self.http.get(f"{self.url('inventory')}/stock")).json()
        return Snapshot(
            balances=dict(balances),
            available={s["sku"]: s["available"] for s in stock},
            reserved={s["sku"]: s["reserved"] for s in stock},
            picked={s["sku"]: s["picked"] for s in stock},
        )

    async def reservations(self, customer: str) -> dict[str, dict[str, Any]]:
        body = (await self.http.get(f"{self.url('payments')}/customers/{customer}")).json()
        return {r["order_id"]: r for r in body["reservations"]}

    async def fraud_calls(self, placed: Placed) -> int:
        key = next(
            e.command_id
            for e in placed.events
            if isinstance(e, CommandIssued) and e.step == "fraud-check"
        )
        body = (await self.http.get(f"{self.url('fraud')}/checks/{key}")).json()
        return int(body["calls"])

    # ------------------------------------------------------------------ Kafka

    async def send_trigger(self, payload: bytes, key: str) -> None:
        await self.producer.send_and_wait(self.target.orders_topic, payload, key=key.encode())

    async def trigger_backlog(self) -> int:
        """Messages on the trigger topic that the engine has not consumed (committed) yet."""
        return await trigger_backlog(
            self.target.kafka.bootstrap_servers, self.target.orders_topic, self.target.trigger_group
        )

    async def dead_letters(self, marker: str) -> list[str]:
        """The dead-letter reasons of this run's trigger messages containing ``marker``."""
        reasons: list[str] = []
        for record in await read_all(
            self.target.kafka.bootstrap_servers, f"{self.target.kafka.topic_prefix}.dlq"
        ):
            headers = {k: v.decode() for k, v in record.headers or []}
            value = (record.value or b"").decode(errors="replace")
            if headers.get("dlq_topic") == self.target.orders_topic and marker in value:
                reasons.append(headers.get("dlq_reason", "?"))
        return sorted(reasons)


@dataclass
class Snapshot:
    balances: dict[str, int]
    available: dict[str, int]
    reserved: dict[str, int]
    #: Reserved units taken off the shelf by fulfilments.
    picked: dict[str, int]


async def topic_partitions(bootstrap: str, topic: str) -> list[TopicPartition]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics([topic])
    finally:
        await admin.close()
    return sorted(
        TopicPartition(topic, p["partition"])
        for t in described
        if t["topic"] == topic and t["error_code"] == 0
        for p in t["partitions"]
    )


async def read_all(bootstrap: str, topic: str, within_s: float = 10.0) -> list[Any]:
    """Every record on ``topic`` now (up to its end offsets when called)."""
    partitions = await topic_partitions(bootstrap, topic)
    records: list[Any] = []
    if not partitions:
        return records
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        consumer.assign(partitions)
        ends = await consumer.end_offsets(partitions)
        await consumer.seek_to_beginning(*partitions)
        deadline = time.monotonic() + within_s
        while [tp for tp in partitions if await consumer.position(tp) < ends[tp]]:
            if time.monotonic() > deadline:
                raise DemoFailed(f"could not read {topic} to its end in {within_s:.0f}s")
            for batch in (await consumer.getmany(timeout_ms=200)).values():
                records.extend(batch)
    finally:
        await consumer.stop()
    return records


async def trigger_backlog(bootstrap: str, topic: str, group: str) -> int:
    """End offsets minus the trigger consumer group's committed offsets, over the topic."""
    partitions = await topic_partitions(bootstrap, topic)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        ends = await consumer.end_offsets(partitions)
        committed = await admin.list_consumer_group_offsets(group, partitions=partitions)
        # -1 (or no entry): nothing committed on that partition yet.
        done = {tp: max(0, c.offset) for tp, c in committed.items()}
        return sum(max(0, ends[tp] - done.get(tp, 0)) for tp in partitions)
    finally:
        await admin.close()
        await consumer.stop()


def summarize(events: list[Event]) -> str:
    """One line per saga: its steps and their outcomes, the compensations, the end."""
    parts: list[str] = []
    http: set[str] = set()
    for e in events:
        if isinstance(e, CommandIssued):
            if e.participant.startswith("http:"):
                http.add(e.step)
            if e.attempt > 1:
                parts.append(f"{e.step} re-sent (attempt {e.attempt})")
        elif isinstance(e, ReplyReceived) and not e.compensation:
            mark = {"success": "ok", "failure": "REFUSED"}.get(e.outcome, e.outcome)
            via = " (HTTP)" if e.step in http else ""
            parts.append(f"{e.step}{via} {mark}")
        elif isinstance(e, AttemptTimedOut):
            parts.append(f"{e.step} attempt {e.attempt} timed out")
        elif isinstance(e, NodeSkipped):
            parts.append(f"{e.node} skipped")
        elif isinstance(e, TimerStarted) and e.purpose == "signal_timeout":
            parts.append("waiting for approval")
        elif isinstance(e, SignalReceived):
            parts.append(f"signal {e.name!r} received")
        elif isinstance(e, TimerFired) and e.timer_id.startswith("signal"):
            parts.append("approval timed out")
        elif isinstance(e, CompensationStarted):
            parts.append("compensating " + ", ".join(e.owed))
        elif isinstance(e, CompensationCompleted):
            parts.append(f"undo {e.step} ok")
        elif isinstance(e, SagaCompleted | SagaCompensated | SagaFailed | SagaCancelled):
            parts.append(e.kind.removeprefix("saga_").upper())
    return " -> ".join(parts) + f"  [{len(events)} events]"
