"""Runs the demo: the engine and the five services as processes (``make demo-up``).

    python -m services_demo.run [--namespace demo] [--base-port 8100]

Settings come from the ``SAGA_*`` environment that ``scripts/devstack.py`` prints
(``SAGA_PG__DSN``, ``SAGA_KAFKA__BOOTSTRAP_SERVERS``). Every process gets them, plus:

- the engine: ``SAGA_PG__DB_SCHEMA={namespace}_engine``, ``SAGA_HTTP__ENDPOINTS``
  pointing the ``fraud``, ``orders`` and ``payments`` endpoints at those services, and
  the callback settings (``SAGA_CALLBACKS__KEYS``: a key made for the stack;
  ``SAGA_CALLBACKS__BASE_URL``: its admin API, where the fraud service posts verdicts);
- each service: ``SAGA_PARTICIPANT__DB_SCHEMA={namespace}_{service}``, its own schema for
  its tables and the participant kit's;
- all of them: the topic prefix ``{namespace}`` (``demo.inbox``, ``demo.cmd.payments``,
  ``demo.orders.requested``...) and ``SAGA_DEMO_*`` (see ``services_demo.config``).

The shipping service is written in Go (``services_demo/shipping_go``, with the participant
kit of ``kits/go``): ``DemoStack.start`` builds it first (``go build``, into a temporary
directory), so the ``go`` command must be on the PATH; the other services are Python
(``uvicorn services_demo.X:app``).

``DemoStack`` is also what the scenario and the tests use: it starts the processes,
waits until each answers (``/health``; the engine: its log says it owns its partitions),
kills and restarts the engine, and stops everything (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from pydantic import SecretStr

from saga_engine import Settings, run
from saga_engine.settings import BlobSettings, CodecSettings, KafkaSettings
from services_demo.config import (
    BLOB_THRESHOLD_BYTES,
    DEFAULT_BASE_PORT,
    ENGINE_LIMITS,
    PORT_OFFSETS,
    SERVICES,
    DemoSettings,
    callback_env,
    http_endpoints,
)
from services_demo.create_topics import create_topics, demo_topics

ROOT = Path(__file__).resolve().parent.parent
#: The Go module of the shipping service.
SHIPPING_GO = ROOT / "services_demo" / "shipping_go"
#: The engine logs this once it owns inbox partitions (and recovered their sagas).
_ENGINE_READY = re.compile(r"took partitions .* and recovered (\d+) sagas")


class StackError(RuntimeError):
    """A process did not start, or died."""


@dataclass(frozen=True)
class DemoShard:
    """A shard of the engine's store (``SAGA_PG__SHARDS``): a database of its own, made
    for the stack on ``server`` (the address of any database of that Postgres cluster)."""

    name: str
    partitions: str  # "0-1"
    server: str

    def dsn(self, namespace: str) -> str:
        return with_database(self.server, f"{namespace}_{self.name}")


def with_database(dsn: str, database: str) -> str:
    """``dsn`` pointed at another database of the same server."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path=f"/{database}"))


@dataclass(frozen=True)
class StackConfig:
    """Where the stack's data and messages go; one namespace per independent stack."""

    dsn: str  # the database (no search_path): every schema lives in it
    bootstrap: str
    namespace: str  # schema prefix and Kafka topic prefix
    base_port: int = DEFAULT_BASE_PORT
    engine_schema: str = ""  # default {namespace}_engine
    approval_timeout_s: float = 30.0
    partitions: int = 4
    logs: Path = field(default_factory=lambda: ROOT / ".dev" / "demo-logs")
    extra_env: tuple[tuple[str, str], ...] = ()
    #: The engine's store past one database (``make demo-shards``): each shard a database
    #: made for the stack; the control database is ``dsn``'s. Empty: ``dsn``'s, as ever.
    shards: tuple[DemoShard, ...] = ()
    #: The key the engine signs its callback URLs with (``SAGA_CALLBACKS__KEYS``): a new
    #: one per stack, kept across the engine's restarts (its URLs must still verify).
    callback_key: str = field(default_factory=lambda: secrets.token_urlsafe(32), repr=False)
    #: The MAC key of payloads by reference, made for this stack (every process gets it).
    blob_mac_key: str = field(
        default_factory=lambda: base64.b64encode(os.urandom(32)).decode(), repr=False
    )

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z][a-z0-9_]{0,40}", self.namespace):
            raise ValueError(f"namespace {self.namespace!r}: use lowercase letters, digits, '_'")

    @classmethod
    def from_env(cls, namespace: str, *, base_port: int, approval_timeout_s: float) -> StackConfig:
        """Postgres and Kafka from the ``SAGA_*`` environment (``scripts/devstack.py env``)."""
        settings = Settings()
        return cls(
            dsn=settings.pg.dsn.get_secret_value(),
            bootstrap=settings.kafka.bootstrap_servers,
            namespace=namespace,
            base_port=base_port,
            approval_timeout_s=approval_timeout_s,
        )

    @property
    def topic_prefix(self) -> str:
        return self.namespace

    @property
    def shard_list(self) -> list[dict[str, str]]:
        """``SAGA_PG__SHARDS``: each shard's name, partitions and database (none without)."""
        return [
            {"name": s.name, "partitions": s.partitions, "dsn": s.dsn(self.namespace)}
            for s in self.shards
        ]

    @property
    def shards_env(self) -> dict[str, str]:
        """``SAGA_PG__SHARDS`` and ``SAGA_PG__CONTROL_DSN`` of every process (the
        participants keep their blobs by reference in their sagas' shards), or nothing."""
        if not self.shards:
            return {}
        return {"SAGA_PG__SHARDS": json.dumps(self.shard_list), "SAGA_PG__CONTROL_DSN": self.dsn}

    @property
    def group_id(self) -> str:
        return f"{self.namespace}-engines"

    @property
    def engine_db_schema(self) -> str:
        return self.engine_schema or f"{self.namespace}_engine"

    def schema(self, service: str) -> str:
        return f"{self.namespace}_{service}"

    @property
    def schemas(self) -> list[str]:
        return [self.engine_db_schema, *(self.schema(s) for s in SERVICES)]

    def port(self, service: str) -> int:
        return self.base_port + PORT_OFFSETS[service]

    def url(self, service: str) -> str:
        return f"http://127.0.0.1:{self.port(service)}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.base_port}"

    @property
    def orders_topic(self) -> str:
        return f"{self.topic_prefix}.orders.requested"

    @property
    def kafka(self) -> KafkaSettings:
        return KafkaSettings(
            bootstrap_servers=self.bootstrap,
            topic_prefix=self.topic_prefix,
            group_id=self.group_id,
            partitions=self.partitions,
        )

    @property
    def codec(self) -> CodecSettings:
        """Payloads by reference, as every process of the stack has them."""
        blobs = BlobSettings(
            threshold_bytes=BLOB_THRESHOLD_BYTES,
            mac_keys={"demo-1": SecretStr(self.blob_mac_key)},
        )
        return CodecSettings(blobs=blobs)

    @property
    def demo(self) -> DemoSettings:
        return DemoSettings(orders_topic=self.orders_topic)

    @property
    def topics(self) -> list[str]:
        return demo_topics(Settings(kafka=self.kafka), self.demo)

    def env(self, service: str | None = None) -> dict[str, str]:
        """The environment of one process (None: the engine)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SAGA_", "OTEL_"))}
        env.update(
            PYTHONPATH=str(ROOT),
            PYTHONUNBUFFERED="1",
            COLUMNS="200",  # the CLI's rich console must not wrap its log lines
            SAGA_PG__DSN=self.dsn,
            SAGA_PG__DB_SCHEMA=self.engine_db_schema,
            SAGA_KAFKA__BOOTSTRAP_SERVERS=self.bootstrap,
            SAGA_KAFKA__TOPIC_PREFIX=self.topic_prefix,
            SAGA_KAFKA__GROUP_ID=self.group_id,
            SAGA_KAFKA__PARTITIONS=str(self.partitions),
            # A killed engine's partitions move after 6 s (the broker's minimum), not 10.
            SAGA_KAFKA__SESSION_TIMEOUT_MS="6000",
            SAGA_KAFKA__HEARTBEAT_INTERVAL_MS="500",
            SAGA_PARTICIPANT__DSN=self.dsn,
            SAGA_HTTP__ENDPOINTS=json.dumps(http_endpoints(self.url)),
            SAGA_LIMITS__PARTICIPANTS=json.dumps(ENGINE_LIMITS),
            SAGA_HTTP__RETRY_WINDOW_S="4",
            # The engine's admin API, once the worker serves it: the base port itself.
            SAGA_ADMIN__HOST="127.0.0.1",
            SAGA_ADMIN__PORT=str(self.base_port),
            SAGA_DEMO_BASE_PORT=str(self.base_port),
            SAGA_DEMO_APPROVAL_TIMEOUT_S=str(self.approval_timeout_s),
            SAGA_DEMO_ORDERS_TOPIC=self.orders_topic,
            SAGA_CODEC__BLOBS__THRESHOLD_BYTES=str(BLOB_THRESHOLD_BYTES),
            SAGA_CODEC__BLOBS__MAC_KEYS=json.dumps({"demo-1": self.blob_mac_key}),
        )
        env.update(self.shards_env)
        if service is not None:
            env["SAGA_PARTICIPANT__DB_SCHEMA"] = self.schema(service)
        else:
            env.update(callback_env(self.callback_key, self.admin_url))
        env.update(dict(self.extra_env))
        return env


def _read_from(path: Path, offset: int) -> str:
    if not path.exists():
        return ""
    with open(path, "rb") as log:
        log.seek(offset)
        return log.read().decode(errors="replace")


def free_base_port(span: int = max(PORT_OFFSETS.values())) -> int:
    """A free base port (the engine's admin API) whose next ``span`` ports are free too
    (the services): for tests and demos that must not meet a running ``make demo-up``."""
    # Below the kernel's ephemeral range: a port the OS hands out to some outgoing
    # connection (a Kafka client, say) between our probe and the service's bind would
    # make the service fail to start.
    low, high = 21000, min(28000, _ephemeral_low() - span - 1)
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(low, high)
        if all(port_free(base + i) for i in range(span + 1)):
            return base
    raise StackError("no block of free ports found")


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def port_free(port: int) -> bool:
    """Nobody listens on it (connections of a stopped server in TIME_WAIT do not count,
    as for uvicorn, which binds with SO_REUSEADDR)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class DemoStack:
    """The engine and the services as child processes, each in its own process group."""

    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        config.logs.mkdir(parents=True, exist_ok=True)
        self._build_dir: Path | None = None  # the Go shipping service's binary, once built

    # ------------------------------------------------------------------ processes

    def log_path(self, name: str) -> Path:
        return self.config.logs / f"{self.config.namespace}-{name}.log"

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        old = self.procs.get(name)
        if old is not None and old.poll() is None:
            raise StackError(f"{name} is already running (pid {old.pid})")
        with open(self.log_path(name), "ab") as log:
            self.procs[name] = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    async def build_shipping(self) -> Path:
        """Builds the Go shipping service (``go build`` in ``services_demo/shipping_go``)
        into a temporary directory of this stack; returns the binary."""
        if self._build_dir is not None:
            return self._build_dir / "shipping"
        go = shutil.which("go")
        if go is None:
            raise StackError(
                "the shipping service is written in Go (services_demo/shipping_go) and the "
                "`go` command is not on the PATH: install Go 1.26 or newer "
                "(https://go.dev/dl/) and run the demo again"
            )
        build_dir = Path(tempfile.mkdtemp(prefix=f"saga-demo-{self.config.namespace}-"))
        binary = build_dir / "shipping"
        # GOWORK=off: the module's own go.mod (which points at ../../kits/go) decides.
        proc = await asyncio.create_subprocess_exec(
            go,
            "build",
            "-o",
            str(binary),
            ".",
            cwd=SHIPPING_GO,
            env={**os.environ, "GOWORK": "off"},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            output, _ = await asyncio.wait_for(proc.communicate(), timeout=900)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            shutil.rmtree(build_dir, ignore_errors=True)
            raise StackError("building the Go shipping service took over 15 minutes") from None
        if proc.returncode != 0:
            shutil.rmtree(build_dir, ignore_errors=True)
            tail = "\n".join(output.decode(errors="replace").splitlines()[-30:])
            raise StackError(
                f"`go build` of the shipping service (in {SHIPPING_GO}) failed with code "
                f"{proc.returncode}:\n{tail}"
            )
        self._build_dir = build_dir
        return binary

    def start_service(self, service: str) -> None:
        host, port = "127.0.0.1", str(self.config.port(service))
        if service == "shipping":
            if self._build_dir is None:
                raise StackError("the shipping service is not built: call build_shipping first")
            argv = [str(self._build_dir / "shipping"), "--host", host, "--port", port]
        else:
            argv = [
                sys.executable,
                "-m",
                "uvicorn",
                f"services_demo.{service}:app",
                "--host",
                host,
                "--port",
                port,
                "--log-level",
                "warning",
                "--no-access-log",
            ]
        self._spawn(service, argv, self.config.env(service))

    def start_engine(self) -> int:
        """Starts the engine; returns the log offset to wait from (``wait_engine``)."""
        path = self.log_path("engine")
        offset = path.stat().st_size if path.exists() else 0
        self._spawn(
            "engine",
            [
                sys.executable,
                "-m",
                "saga_engine",
                "worker",
                "services_demo.sagas",
                "--log-level",
                "INFO",
            ],
            self.config.env(None),
        )
        return offset

    def kill_engine(self) -> None:
        """SIGKILL: no shutdown code runs, as in a crash."""
        proc = self.procs["engine"]
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def stop_engine(self, grace_s: float = 30.0) -> None:
        """SIGTERM: the engine finishes its batch, commits its offsets and leaves its groups."""
        proc = self.procs["engine"]
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.kill_engine()

    def pid(self, name: str) -> int:
        return self.procs[name].pid

    def check_alive(self, *, ignore: tuple[str, ...] = ()) -> None:
        for name, proc in self.procs.items():
            if name not in ignore and proc.poll() is not None:
                raise StackError(
                    f"{name} exited with code {proc.returncode}; its log:\n{self.log_tail(name)}"
                )

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.log_path(name)
        if not path.exists():
            return "(no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    # ------------------------------------------------------------------ readiness

    async def wait_healthy(self, service: str, within_s: float = 60.0) -> None:
        url = f"{self.config.url(service)}/health"
        deadline = time.monotonic() + within_s
        async with httpx.AsyncClient(timeout=2.0) as client:
            while True:
                self.check_alive()
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(url)).status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise StackError(
                        f"{service} not healthy after {within_s:.0f}s:\n{self.log_tail(service)}"
                    )
                await asyncio.sleep(0.1)

    async def wait_engine(self, offset: int = 0, within_s: float = 60.0) -> int:
        """Waits until the engine owns its partitions; returns how many sagas it recovered."""
        path = self.log_path("engine")
        deadline = time.monotonic() + within_s
        while True:
            self.check_alive()
            found = _ENGINE_READY.search(_read_from(path, offset))
            if found:
                return int(found.group(1))
            if time.monotonic() > deadline:
                raise StackError(
                    f"the engine did not take its partitions in {within_s:.0f}s:\n"
                    f"{self.log_tail('engine')}"
                )
            await asyncio.sleep(0.1)

    async def start(self) -> None:
        """Starts the services and the engine, and waits until all of them are ready."""
        wanted = {"admin": self.config.base_port} | {s: self.config.port(s) for s in SERVICES}
        busy = {name: port for name, port in wanted.items() if not port_free(port)}
        if busy:
            ports = ", ".join(f"{name} {port}" for name, port in busy.items())
            raise StackError(
                f"ports taken ({ports}): is `make demo-up` running? Set SAGA_DEMO_BASE_PORT "
                "to move the services"
            )
        # The Go shipping service's binary (a no-op once built; fails early without Go).
        await self.build_shipping()
        # The topics first (as the compose `topics` job does): an engine that creates the
        # trigger topic and subscribes at once may wait for Kafka's metadata to catch up.
        await create_topics(Settings(kafka=self.config.kafka), self.config.demo)
        await self.create_shard_databases()
        # The services create their schemas themselves; they come up in parallel.
        for service in SERVICES:
            self.start_service(service)
        offset = self.start_engine()
        await asyncio.gather(*(self.wait_healthy(s) for s in SERVICES))
        await self.wait_engine(offset)

    async def restart_engine(self) -> int:
        """Starts the engine again (after ``kill_engine``); returns how many sagas it
        recovered once it owns its partitions."""
        offset = self.start_engine()
        return await self.wait_engine(offset)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM to every process still running, then SIGKILL to those that linger."""
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        if self._build_dir is not None:
            shutil.rmtree(self._build_dir, ignore_errors=True)
            self._build_dir = None

    # ------------------------------------------------------------------ data

    async def create_shard_databases(self) -> None:
        """The shards' databases, one per shard on its cluster (none without shards): the
        engine migrates them, and the control database, when it starts."""
        for shard in self.config.shards:
            conn = await asyncpg.connect(shard.server)
            try:
                await conn.execute(f'CREATE DATABASE "{self.config.namespace}_{shard.name}"')
            finally:
                await conn.close()
        if self.config.shards:
            # As an operator would before the first start (docs/operations.md): the
            # participants read the shard map at their start, maybe before the engine's.
            await self.migrate()

    async def migrate(self) -> None:
        """``saga migrate``: the control database and every shard."""
        code, out, err = await self.saga_cli("migrate")
        if code != 0:
            raise StackError(f"saga migrate failed:\n{out}{err}")

    async def saga_cli(self, *args: str) -> tuple[int, str, str]:
        """``saga ARGS`` (the CLI, as a process) with the engine's settings: its exit
        code, stdout and stderr."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "saga_engine",
            *args,
            cwd=ROOT,
            env=self.config.env(None),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
        assert proc.returncode is not None
        return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")

    async def drop_data(self) -> None:
        """Drops the stack's schemas (and shard databases) and deletes its topics (after
        ``stop``)."""
        conn = await asyncpg.connect(self.config.dsn)
        try:
            for schema in self.config.schemas:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()
        for shard in self.config.shards:
            conn = await asyncpg.connect(shard.server)
            try:
                name = f"{self.config.namespace}_{shard.name}"
                await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            finally:
                await conn.close()
        admin = AIOKafkaAdminClient(bootstrap_servers=self.config.bootstrap)
        await admin.start()
        try:
            existing = set(await admin.list_topics())
            mine = [t for t in self.config.topics if t in existing]
            if mine:
                await admin.delete_topics(mine)
        except KafkaError as exc:
            print(f"note: could not delete the demo's topics ({exc!r})", file=sys.stderr)
        finally:
            await admin.close()


async def admin_available(config: StackConfig) -> bool:
    """Whether the engine serves its admin API (it does unless SAGA_ADMIN__ENABLED=false)."""
    async with httpx.AsyncClient(timeout=2.0) as client:
        try:
            return (await client.get(f"{config.admin_url}/health")).status_code == 200
        except httpx.HTTPError:
            return False


def print_urls(config: StackConfig, *, admin: bool) -> None:
    print("The checkout demo is running:\n")
    for service in SERVICES:
        url = config.url(service)
        if service == "shipping":  # the Go service: no OpenAPI page
            print(f"  {service:<10} {url:<26} (Go) {url}/health, {url}/shipments/ORDER_ID")
        else:
            print(f"  {service:<10} {url:<26} OpenAPI docs: {url}/docs")
    if admin:
        print(
            f"  admin      {config.admin_url:<26} OpenAPI: {config.admin_url}/openapi.json, sagas: {config.admin_url}/sagas"
        )
    else:
        print("  admin      not yet available (meanwhile: the SQL below)")
    print(f"""
Try it:
  curl -s -XPOST {config.url("orders")}/orders -H 'content-type: application/json' \\
       -d '{{"customer": "alice", "items": [{{"sku": "book", "qty": 2}}]}}'
  curl -s {config.url("orders")}/orders/ORDER_ID
  curl -s {config.url("payments")}/customers/alice ; curl -s {config.url("inventory")}/stock/book
  large orders (1000 credits or more) wait for approval, {config.approval_timeout_s:.0f} s at most:
  curl -s -XPOST {config.url("orders")}/orders/ORDER_ID/approval -H 'content-type: application/json' -d '{{"approved": true}}'
  Kafka trigger: JSON {{"order_id", "customer", "items"}} on topic {config.orders_topic}

Where to look:
  engine history  SAGA_ADMIN_URL={config.admin_url} .venv/bin/saga history SAGA_ID  (and saga show, list...)
  SQL             SELECT saga_id, status, current_step FROM {config.engine_db_schema}.sagas;
                  SELECT seq, kind, data FROM {config.engine_db_schema}.saga_events WHERE saga_id = '...';
  service data    schemas {", ".join(config.schema(s) for s in SERVICES)}
  logs            {config.logs}/{config.namespace}-*.log
""")


async def _serve(config: StackConfig) -> int:
    stack = DemoStack(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        print(f"starting the engine and {len(SERVICES)} services (namespace {config.namespace})...")
        t0 = time.monotonic()
        await stack.start()
        print(f"ready in {time.monotonic() - t0:.1f}s\n")
        print_urls(config, admin=await admin_available(config))
        print("Ctrl-C stops the engine and the services (Postgres and Kafka stay up: `make down`).")
        print(
            f"Kill the engine (kill -9 {stack.pid('engine')}) to see a new one recover its sagas."
        )
        restarts: list[float] = []
        while not stop.is_set():
            stack.check_alive(ignore=("engine",))
            engine = stack.procs["engine"]
            if engine.poll() is not None:
                # A supervisor's job: start a new engine, which recovers the open sagas.
                restarts = [t for t in restarts if t > time.monotonic() - 60] + [time.monotonic()]
                if len(restarts) > 5:
                    raise StackError(f"the engine keeps exiting:\n{stack.log_tail('engine')}")
                print(f"the engine exited (code {engine.returncode}); starting a new one...")
                recovered = await stack.restart_engine()
                print(
                    f"engine back (pid {stack.pid('engine')}): it recovered {recovered} open "
                    "saga(s) from their histories"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
        return 0
    except StackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        print("stopping the engine and the services...")
        stack.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--namespace", default="demo", help="schema and topic prefix")
    parser.add_argument(
        "--base-port", type=int, default=int(os.environ.get("SAGA_DEMO_BASE_PORT", "8100"))
    )
    parser.add_argument(
        "--approval-timeout",
        type=float,
        default=float(os.environ.get("SAGA_DEMO_APPROVAL_TIMEOUT_S", "300")),
        help="seconds a large order waits for its approval",
    )
    args = parser.parse_args(argv)
    config = StackConfig.from_env(
        args.namespace, base_port=args.base_port, approval_timeout_s=args.approval_timeout
    )
    return run(_serve(config))


if __name__ == "__main__":
    sys.exit(main())
