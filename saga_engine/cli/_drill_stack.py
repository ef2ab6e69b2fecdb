"""The drill's processes: the user's engine workers (``saga worker SAGAS``) and
participants, started on the stack the ``SAGA_*`` settings name, in a namespace of their
own (topic prefix ``{ns}``, engine schema ``{ns}_engine``, participant schemas
``{ns}_{participant}``), and killed, frozen and restarted by the scenarios.

``--participants MODULE`` names a module with ``drill_participants()``: a mapping of each
participant's name to the arguments of a Python process that runs it, such as
``["-m", "myapp.services", "payments"]``. The drill runs it with the stack's ``SAGA_*``
environment, ``SAGA_PARTICIPANT__DB_SCHEMA={ns}_{name}`` and
``SAGA_PARTICIPANT__DRILL_LEDGER=1`` (the kit then records each applied command). An
optional ``drill_env()`` in the same module returns more environment for every process
the drill starts, engines and participants (a service's port, ``SAGA_HTTP__ENDPOINTS``
pointing at it, the callback keys...). Each engine serves its admin API on a port of its
own, kept across its restarts, and its callback URLs name it
(``SAGA_CALLBACKS__BASE_URL``)."""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from saga_engine.kernel._errors import CliError
from saga_engine.kernel._settings import Settings

__all__ = ["DrillParticipants", "DrillStack", "load_participants"]

_TOOK = re.compile(
    r"^(?P<at>\S+ \S+) .*took partitions \[(?P<took>[^\]]*)\] \(kept \[(?P<kept>[^\]]*)\]\)"
)
#: A killed engine's partitions move after the session timeout: the broker's minimum.
SESSION_TIMEOUT_MS = 6000


@dataclass(frozen=True)
class DrillParticipants:
    args: dict[str, list[str]]  # participant name -> Python arguments
    env: dict[str, str]  # drill_env(): for every process


def load_participants(module_name: str) -> DrillParticipants:
    """``module.drill_participants()`` and ``module.drill_env()`` (optional)."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CliError(f"--participants {module_name}: cannot import it ({exc})") from exc
    fn = getattr(module, "drill_participants", None)
    if not callable(fn):
        raise CliError(
            f"--participants {module_name}: the module has no drill_participants() "
            "returning {name: [python arguments]}"
        )
    found = fn()
    if not isinstance(found, Mapping) or not all(
        isinstance(v, list | tuple) and all(isinstance(a, str) for a in v) for v in found.values()
    ):
        raise CliError(f"{module_name}.drill_participants() must return {{name: [str, ...]}}")
    env_fn = getattr(module, "drill_env", None)
    env = env_fn() if callable(env_fn) else {}
    if not isinstance(env, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise CliError(f"{module_name}.drill_env() must return {{str: str}}")
    return DrillParticipants({str(k): list(v) for k, v in found.items()}, dict(env))


@dataclass
class DrillStack:
    settings: Settings
    namespace: str
    sagas_module: str
    participants: dict[str, list[str]]
    logs: Path
    pg_dsn: str = ""  # the engines' DSN: the proxy's, for pg-cut
    #: The engines' SAGA_PG__SHARDS (JSON): each shard through its proxy, for shard-down.
    pg_shards: str = ""
    #: The engines' and the participants' Kafka bootstrap: their link proxies', for the
    #: Kafka link faults (the stack's own when empty).
    kafka_engines: str = ""
    kafka_participants: str = ""
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    frozen: set[str] = field(default_factory=set)
    #: Each engine's admin port, kept across its restarts: the callback URLs it hands
    #: out name its admin API (``SAGA_CALLBACKS__BASE_URL``), so they work again once a
    #: killed engine is back.
    admin_ports: dict[str, int] = field(default_factory=dict)

    @property
    def engine_schema(self) -> str:
        return f"{self.namespace}_engine"

    def participant_schema(self, name: str) -> str:
        return f"{self.namespace}_{name}"

    def env(self, **extra: str) -> dict[str, str]:
        kafka = self.settings.kafka
        dsn = self.settings.pg.dsn.get_secret_value()
        # The user's other settings (codec keys, HTTP endpoints...) pass through; the
        # drill's namespace and the stack's servers override theirs.
        env = dict(os.environ)
        env.update(
            PYTHONPATH=os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p),
            PYTHONUNBUFFERED="1",
            SAGA_PG__DSN=self.pg_dsn or dsn,
            **({"SAGA_PG__SHARDS": self.pg_shards} if self.pg_shards else {}),
            SAGA_PG__DB_SCHEMA=self.engine_schema,
            SAGA_KAFKA__BOOTSTRAP_SERVERS=kafka.bootstrap_servers,
            SAGA_KAFKA__TOPIC_PREFIX=self.namespace,
            SAGA_KAFKA__GROUP_ID=f"{self.namespace}-engines",
            SAGA_KAFKA__PARTITIONS=str(kafka.partitions),
            SAGA_KAFKA__SESSION_TIMEOUT_MS=str(SESSION_TIMEOUT_MS),
            SAGA_KAFKA__HEARTBEAT_INTERVAL_MS="500",
            SAGA_PARTICIPANT__DSN=dsn,
            SAGA_PARTICIPANT__DRILL_LEDGER="1",
            # Several engines run at once: each serves its admin API on a port of its own
            # (an engine's: ``start_engine``; nothing else serves one).
            SAGA_ADMIN__PORT="0",
        )
        env.update(extra)
        return env

    def _spawn(self, name: str, args: list[str], env: dict[str, str]) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
        self.procs[name] = subprocess.Popen(
            [sys.executable, *args],
            env=env,
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def start_engine(self, name: str) -> None:
        args = ["-m", "saga_engine", "worker", self.sagas_module, "--log-level", "INFO"]
        port = self.admin_ports.setdefault(name, _free_port())
        admin = {
            "SAGA_ADMIN__PORT": str(port),
            "SAGA_CALLBACKS__BASE_URL": f"http://127.0.0.1:{port}",
        }
        self._spawn(name, args, self.env(**_bootstrap(self.kafka_engines), **admin))

    def start_participant(self, name: str) -> None:
        env = self.env(
            SAGA_PARTICIPANT__DB_SCHEMA=self.participant_schema(name),
            **_bootstrap(self.kafka_participants),
        )
        self._spawn(f"participant-{name}", self.participants[name], env)

    def alive(self, name: str) -> bool:
        proc = self.procs.get(name)
        return proc is not None and proc.poll() is None

    def signal(self, name: str, sig: signal.Signals) -> None:
        proc = self.procs[name]
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
        if sig == signal.SIGSTOP:
            self.frozen.add(name)
        elif sig == signal.SIGCONT:
            self.frozen.discard(name)

    def kill(self, name: str) -> None:
        self.signal(name, signal.SIGKILL)
        self.procs[name].wait(timeout=10)
        self.frozen.discard(name)

    def died(self) -> list[str]:
        """The processes that exited unasked (a crash at start-up, say)."""
        return [n for n, p in self.procs.items() if p.poll() is not None]

    def takeovers(self) -> list[float]:
        """The wall times at which an engine took partitions it did not hold (from the
        worker's log line "took partitions [...] (kept [...])")."""
        times: list[float] = []
        for path in self.logs.glob("engine-*.log"):
            for line in path.read_text(errors="replace").splitlines():
                found = _TOOK.match(line)
                if found and set(found["took"].split(", ")) - set(found["kept"].split(", ")):
                    # The worker's log stamps local time, as datetime's naive times are.
                    stamp = datetime.strptime(found["at"], "%Y-%m-%d %H:%M:%S,%f")
                    times.append(stamp.timestamp())
        return times

    def log_tail(self, name: str, lines: int = 20) -> str:
        path = self.logs / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def stop_all(self) -> None:
        for name in list(self.frozen):
            self.signal(name, signal.SIGCONT)
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def _bootstrap(servers: str) -> dict[str, str]:
    return {"SAGA_KAFKA__BOOTSTRAP_SERVERS": servers} if servers else {}
