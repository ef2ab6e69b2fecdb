"""What every part of the development stack (``devstack.py``) shares: where a stack of
this checkout keeps its state and data (keyed by its ports), the one-line errors, and
process and apt-get helpers."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEV = ROOT / ".dev"
KAFKA_POM = ROOT / "scripts" / "kafka" / "pom.xml"

DEFAULT_PG_PORT, DEFAULT_KAFKA_PORT, DEFAULT_KAFKA_CONTROLLER_PORT = 54329, 19092, 19093
PG_PORT = int(os.environ.get("SAGA_DEV_PG_PORT", str(DEFAULT_PG_PORT)))
KAFKA_PORT = int(os.environ.get("SAGA_DEV_KAFKA_PORT", str(DEFAULT_KAFKA_PORT)))
KAFKA_CONTROLLER_PORT = int(
    os.environ.get("SAGA_DEV_KAFKA_CONTROLLER_PORT", str(DEFAULT_KAFKA_CONTROLLER_PORT))
)


def keyed(name: str, *ports: int, defaults: tuple[int, ...]) -> str:
    """``name`` for the default ports (what a checkout always had), ``name-<ports>``
    for others: each stack of a checkout keeps its own state and data, so that two
    can run side by side and `down` stops only its own."""
    return name if ports == defaults else f"{name}-{'-'.join(map(str, ports))}"


_PORTS = (PG_PORT, KAFKA_PORT, KAFKA_CONTROLLER_PORT)
_DEFAULTS = (DEFAULT_PG_PORT, DEFAULT_KAFKA_PORT, DEFAULT_KAFKA_CONTROLLER_PORT)
STATE_FILE = DEV / f"{keyed('state', *_PORTS, defaults=_DEFAULTS)}.json"
ENV_FILE = DEV / keyed("env", *_PORTS, defaults=_DEFAULTS)
PG_DIR = keyed("pg", PG_PORT, defaults=(DEFAULT_PG_PORT,))
KAFKA_HOME = DEV / keyed("kafka", KAFKA_PORT, defaults=(DEFAULT_KAFKA_PORT,))
#: Between the ports of a stack's Postgres clusters past the first (SAGA_DEV_PG_CLUSTERS).
CLUSTER_PORT_STEP = 10


def pg_cluster_ports() -> tuple[int, ...]:
    """The ports of this stack's Postgres clusters: SAGA_DEV_PG_PORT, then (with
    ``SAGA_DEV_PG_CLUSTERS=N``) one more per cluster, SAGA_DEV_PG_EXTRA_PORTS if given,
    else 10 apart from the first (54339, 54349, ... for the default port)."""
    raw = os.environ.get("SAGA_DEV_PG_CLUSTERS", "1").strip() or "1"
    if not raw.isdigit() or not 1 <= int(raw) <= 9:
        raise StackError(f"postgres: SAGA_DEV_PG_CLUSTERS={raw!r} is not a number from 1 to 9")
    count = int(raw)
    given = os.environ.get("SAGA_DEV_PG_EXTRA_PORTS", "").strip()
    if not given:
        return tuple(PG_PORT + CLUSTER_PORT_STEP * i for i in range(count))
    parts = [p.strip() for p in given.split(",")]
    if not all(p.isdigit() for p in parts) or len(parts) < count - 1:
        raise StackError(
            f"postgres: SAGA_DEV_PG_EXTRA_PORTS={given!r} must list {count - 1} port(s), "
            "separated by commas (one per cluster past the first, SAGA_DEV_PG_CLUSTERS)"
        )
    return (PG_PORT, *(int(p) for p in parts[: count - 1]))


def pg_cluster_dir(port: int) -> str:
    """The name of a cluster's directory under .dev/: keyed by its port, the first
    cluster's as it always was."""
    return keyed("pg", port, defaults=(DEFAULT_PG_PORT,))


class StackError(Exception):
    """A component could not be started or reached; the message is the one line we print."""


def kraft_cluster_id(raw: bytes | None = None) -> str:
    """A KRaft cluster id: 16 random bytes (``raw``, else drawn) in URL-safe base64, as
    Kafka's ``Uuid.randomUuid`` makes one, and like it never starting with "-": the
    storage tool reads such an id as an option ("--cluster-id: expected one argument"),
    which failed one ``make up`` in 64."""
    while True:
        text = base64.urlsafe_b64encode(raw or uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text
        raw = None  # drawn again


def say(msg: str) -> None:
    # Status goes to stderr: stdout carries only what callers consume (the settings for
    # `eval`, or the JSON of a benchmark run under `devstack.py run`).
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- state


@dataclass
class State:
    """What one stack (one set of SAGA_DEV_* ports) of this checkout started."""

    postgres_pid: int | None = None
    postgres_datadir: str | None = None
    kafka_pid: int | None = None
    # A state file written before stacks were keyed by ports has none: the defaults.
    pg_port: int = DEFAULT_PG_PORT
    kafka_port: int = DEFAULT_KAFKA_PORT
    kafka_controller_port: int = DEFAULT_KAFKA_CONTROLLER_PORT
    #: The clusters past the first (SAGA_DEV_PG_CLUSTERS): ``{"index": 2, "port": ...,
    #: "pid": ..., "datadir": ...}`` each, the index counting the first as 1.
    extra_postgres: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path = STATE_FILE) -> State:
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError):
            raw = {}
        if path == STATE_FILE:  # this stack's file: its ports are the ones asked for
            raw.update(
                pg_port=PG_PORT, kafka_port=KAFKA_PORT, kafka_controller_port=KAFKA_CONTROLLER_PORT
            )
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if raw.get(k) is not None})

    def save(self) -> None:
        DEV.mkdir(parents=True, exist_ok=True)
        STATE_FILE.write_text(json.dumps(self.__dict__, indent=2))

    def running(self) -> dict[str, tuple[int, ...]]:
        """The ports of the servers of this stack that are up, by component."""
        up: dict[str, tuple[int, ...]] = {}
        if pid_alive(self.postgres_pid):
            up["postgres"] = (self.pg_port,)
        for extra in self.extra_postgres:
            if pid_alive(extra.get("pid")):
                up[f"postgres {extra['index']}"] = (int(extra["port"]),)
        if pid_alive(self.kafka_pid):
            up["kafka"] = (self.kafka_port, self.kafka_controller_port)
        return up

    def describe(self) -> str:
        parts = [f"{name} on {'/'.join(map(str, ports))}" for name, ports in self.running().items()]
        return ", ".join(parts) or "nothing running"


def refuse_shared_ports(pg: bool, kafka: bool, pg_extra: tuple[int, ...] = ()) -> None:
    """Refuses to start a server on a port another stack of this checkout runs one on:
    its data directory would be that stack's, and this stack's `down` would stop it.
    ``pg_extra``: the ports of the clusters past the first this stack will start."""
    mine = {"postgres": (PG_PORT,), "kafka": (KAFKA_PORT, KAFKA_CONTROLLER_PORT)}
    wanted = {
        p for name, ports in mine.items() if {"postgres": pg, "kafka": kafka}[name] for p in ports
    } | set(pg_extra)
    for path in sorted(DEV.glob("state*.json")):
        if path == STATE_FILE:
            continue
        other = State.load(path)
        taken = wanted & {p for ports in other.running().values() for p in ports}
        if taken:
            raise StackError(
                f"port {', '.join(map(str, sorted(taken)))} is the running stack's of "
                f".dev/{path.name} ({other.describe()}); give this one other SAGA_DEV_* "
                "ports, or point SAGA_PG__DSN / SAGA_KAFKA__BOOTSTRAP_SERVERS at that stack"
            )


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); treat it as dead.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def run_quiet(cmd: list[str], what: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, **kw)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()
        reason = tail[-1] if tail else f"exit code {proc.returncode}"
        raise StackError(f"{what}: {reason}")
    return proc


# --------------------------------------------------------------------------- apt


def is_root() -> bool:
    return os.geteuid() == 0


class AptError(StackError):
    """apt-get cannot install here or failed; `reason` is the cause alone."""

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(f"{what}: {reason}")
        self.reason = reason


def can_sudo() -> bool:
    """Passwordless sudo only: nothing here may stop to ask for a password."""
    if shutil.which("sudo") is None:
        return False
    probe = subprocess.run(["sudo", "-n", "true"], capture_output=True, check=False)
    return probe.returncode == 0


def apt_install(packages: list[str], what: str, *, sudo: bool = False) -> None:
    """Installs Debian packages with apt-get as root, or through passwordless sudo when
    `sudo` is true; raises AptError saying why it could not."""
    if shutil.which("apt-get") is None:
        raise AptError(what, "apt-get is not available on this machine")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    prefix: list[str] = []
    if not is_root():
        if not (sudo and can_sudo()):
            raise AptError(
                what, "not root and no passwordless sudo" if sudo else "not running as root"
            )
        prefix = ["sudo", "-n", "env", "DEBIAN_FRONTEND=noninteractive"]
    say(f"{what}: installing {' '.join(packages)} with apt-get{' (sudo)' if prefix else ''} ...")
    for args, step in (
        (["update", "-q"], "apt-get update failed"),
        (["install", "-y", "-q", "--no-install-recommends", *packages], "apt-get install failed"),
    ):
        try:
            run_quiet([*prefix, "apt-get", *args], step, env=env)
        except StackError as exc:
            raise AptError(what, str(exc)) from None


# --------------------------------------------------------------------------- processes


def kill_and_wait(pid: int, grace_s: float) -> None:
    if not pid_alive(pid):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reap it if it is our child
        if not pid_alive(pid):
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
