"""Start, stop and inspect the local stack of real servers: PostgreSQL 15 and Apache Kafka 4.

Usage (normally through the Makefile):

    python scripts/devstack.py up        # start both (idempotent), wait until they answer
    python scripts/devstack.py down      # stop what `up` started, by pid
    python scripts/devstack.py restart-kafka   # stop this stack's broker and start it again,
                                               # same data (what a drill's broker-restart runs)
    python scripts/devstack.py pg-stop 2     # stop the stack's second Postgres cluster
    python scripts/devstack.py pg-start 2    # and start it again on its data (chaos tests)
    python scripts/devstack.py status
    python scripts/devstack.py env       # print the SAGA_* connection settings
    python scripts/devstack.py run -- CMD ...   # up, run CMD with the settings, stop what it started
                                                # (a broker it starts begins with empty storage)
    python scripts/devstack.py tools     # install the test suite's tools when missing

More Postgres clusters (for a sharded store's tests): SAGA_DEV_PG_CLUSTERS=3 starts two
more, on ports 10 and 20 above the first (or SAGA_DEV_PG_EXTRA_PORTS=p2,p3), each with its
own data directory under .dev/ and its entry in the state file; `env` then also prints
SAGA_DEV_PG_SHARD_DSNS, their `saga` databases' addresses, comma-separated. `status` and
`down` cover every cluster the stack started. One cluster is the default.

When SAGA_PG__DSN or SAGA_KAFKA__BOOTSTRAP_SERVERS is already set, that server is used
as it is and nothing is started for it: this is how the project is pointed at existing
infrastructure (SAGA_DEV_PG_SHARD_DSNS likewise for the clusters past the first).

The ports are SAGA_DEV_PG_PORT, SAGA_DEV_KAFKA_PORT and SAGA_DEV_KAFKA_CONTROLLER_PORT
(54329, 19092, 19093). Each set of ports is a stack of its own in this checkout, with its
own state file and data directories under .dev/ (the default ports keep .dev/state.json,
.dev/pg and .dev/kafka): `up`, `status` and `down` with the same ports act on that stack
only. `up` refuses a port on which another stack of the checkout runs a server, naming it.

Every failure is one line on stderr naming the component and the reason, and a
non-zero exit. `tools` is the exception: a tool it cannot install is one line on
stderr saying why and what that costs, and it still exits 0 so the tests run.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from devstack_base import (
    DEV,
    ENV_FILE,
    KAFKA_CONTROLLER_PORT,
    KAFKA_HOME,
    KAFKA_POM,
    KAFKA_PORT,
    PG_PORT,
    ROOT,
    AptError,
    StackError,
    State,
    apt_install,
    is_root,
    kill_and_wait,
    kraft_cluster_id,
    pg_cluster_dir,
    pg_cluster_ports,
    pid_alive,
    port_open,
    refuse_shared_ports,
    run_quiet,
    say,
)
from devstack_tools import tools

PG_DATABASE = "saga"
PG_VERSION = "15"
START_TIMEOUT_S = float(os.environ.get("SAGA_DEV_START_TIMEOUT", "90"))

# --------------------------------------------------------------------------- postgres


def as_postgres(cmd: list[str]) -> list[str]:
    """The Debian server refuses to run as root, so root runs it as the postgres user."""
    return ["runuser", "-u", "postgres", "--", *cmd] if is_root() else cmd


def apt_install_postgres(packages: list[str]) -> None:
    try:
        apt_install(packages, "postgres")
    except AptError as exc:
        raise StackError(
            f"postgres: {' '.join(packages)} is not installed and cannot be ({exc.reason}); "
            "install it with apt-get, or set SAGA_PG__DSN to an existing server"
        ) from None


def postgres_bindir() -> Path:
    bindir = Path(f"/usr/lib/postgresql/{PG_VERSION}/bin")
    if (bindir / "initdb").exists():
        return bindir
    # Stop the package from creating and starting a default cluster on port 5432:
    # the project runs its own cluster and must leave no stray server behind.
    apt_install_postgres(["postgresql-common"])
    conf = Path("/etc/postgresql-common/createcluster.conf")
    if conf.exists():
        text = conf.read_text()
        if "create_main_cluster = false" not in text:
            conf.write_text(text + "\ncreate_main_cluster = false\n")
    apt_install_postgres([f"postgresql-{PG_VERSION}"])
    if not (bindir / "initdb").exists():
        raise StackError(
            f"postgres: {bindir}/initdb missing after installing postgresql-{PG_VERSION}"
        )
    return bindir


@dataclass(frozen=True)
class Cluster:
    """One Postgres cluster of this stack: the first (index 1, SAGA_DEV_PG_PORT, what the
    stack always ran) or one past it (SAGA_DEV_PG_CLUSTERS), each with its own port and
    data directory."""

    index: int
    port: int

    def dsn(self, database: str = PG_DATABASE) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def record(self, state: State) -> tuple[int | None, str | None]:
        """The pid and data directory the state file has for this cluster."""
        if self.index == 1:
            return state.postgres_pid, state.postgres_datadir
        for extra in state.extra_postgres:
            if extra.get("index") == self.index:
                return extra.get("pid"), extra.get("datadir")
        return None, None

    def remember(self, state: State, pid: int | None, datadir: str | None) -> None:
        if self.index == 1:
            state.postgres_pid, state.postgres_datadir = pid, datadir
        else:
            state.extra_postgres = [
                e for e in state.extra_postgres if e.get("index") != self.index
            ] + [{"index": self.index, "port": self.port, "pid": pid, "datadir": datadir}]
            state.extra_postgres.sort(key=lambda e: int(e["index"]))
        state.save()


def clusters() -> list[Cluster]:
    """This stack's clusters as SAGA_DEV_PG_CLUSTERS asks (one by default)."""
    return [Cluster(i + 1, port) for i, port in enumerate(pg_cluster_ports())]


def known_cluster(state: State, index: int) -> Cluster:
    """Cluster ``index`` (1 = the first) as the settings or the state file know it."""
    for cluster in clusters():
        if cluster.index == index:
            return cluster
    for extra in state.extra_postgres:
        if extra.get("index") == index:
            return Cluster(index, int(extra["port"]))
    raise StackError(
        f"postgres: this stack has no cluster {index} "
        "(SAGA_DEV_PG_CLUSTERS says how many it runs; the first is 1)"
    )


def postgres_datadir(cluster: Cluster) -> Path:
    """The cluster lives under .dev/ unless the postgres user cannot reach the checkout."""
    name = pg_cluster_dir(cluster.port)
    base = DEV / name
    if not is_root():
        return base
    probe = subprocess.run(
        ["runuser", "-u", "postgres", "--", "test", "-x", str(ROOT)], check=False
    )
    if probe.returncode == 0:
        return base
    digest = hashlib.sha1(str(ROOT).encode()).hexdigest()[:10]
    return Path(f"/var/tmp/saga-engine-dev-{digest}/{name}")


def pg_dsn(database: str = PG_DATABASE) -> str:
    return Cluster(1, PG_PORT).dsn(database)


async def _pg_ready(dsn: str, create_db: bool) -> None:
    import asyncpg

    admin_dsn = dsn.rsplit("/", 1)[0] + "/postgres" if create_db else dsn
    conn = await asyncpg.connect(admin_dsn, timeout=3)
    try:
        await conn.fetchval("SELECT 1")
        if create_db:
            exists = await conn.fetchval(
                "SELECT 1 FROM pg_database WHERE datname = $1", PG_DATABASE
            )
            if not exists:
                await conn.execute(f'CREATE DATABASE "{PG_DATABASE}"')
    finally:
        await conn.close()


def wait_postgres(dsn: str, create_db: bool, deadline: float) -> None:
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            asyncio.run(_pg_ready(dsn, create_db))
            return
        except Exception as exc:  # connection refused, starting up, ...
            last = exc
            time.sleep(0.3)
    raise StackError(f"postgres: did not accept a connection at {dsn}: {last}")


def postmaster_pid(datadir: Path) -> int | None:
    try:
        return int((datadir / "data" / "postmaster.pid").read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return None


def _named(cluster: Cluster) -> str:
    return "postgres" if cluster.index == 1 else f"postgres {cluster.index}"


def start_postgres(state: State) -> bool:
    """Starts the first cluster unless SAGA_PG__DSN names a server; True when this call
    started it."""
    if os.environ.get("SAGA_PG__DSN"):
        dsn = os.environ["SAGA_PG__DSN"]
        wait_postgres(dsn, create_db=False, deadline=time.monotonic() + 15)
        say("postgres: using SAGA_PG__DSN (external server), nothing started")
        return False
    return start_cluster(state, Cluster(1, PG_PORT))


def start_cluster(state: State, cluster: Cluster) -> bool:
    """Starts one cluster of this stack on its data (made the first time); True when this
    call started it, False when it was up already."""
    name = _named(cluster)
    pid, _ = cluster.record(state)
    if pid_alive(pid):
        wait_postgres(cluster.dsn(), create_db=True, deadline=time.monotonic() + 15)
        say(f"{name}: already up on 127.0.0.1:{cluster.port} (pid {pid})")
        return False

    t0 = time.monotonic()
    bindir = postgres_bindir()
    base = postgres_datadir(cluster)
    data = base / "data"
    sock = base / "run"
    base.mkdir(parents=True, exist_ok=True)
    if is_root():
        shutil.chown(base, "postgres", "postgres")
        os.chmod(base, 0o700)
    leftover = postmaster_pid(base)
    if leftover and pid_alive(leftover):
        # A server of ours from an earlier run whose state file was lost: adopt it.
        cluster.remember(state, leftover, str(base))
        wait_postgres(cluster.dsn(), create_db=True, deadline=time.monotonic() + 15)
        say(f"{name}: already up on 127.0.0.1:{cluster.port} (pid {leftover})")
        return False
    if port_open(cluster.port):
        raise StackError(
            f"{name}: port {cluster.port} on 127.0.0.1 is taken by another process; stop it "
            "or set SAGA_DEV_PG_PORT (and SAGA_DEV_PG_EXTRA_PORTS for the clusters past the first)"
        )
    if not (data / "PG_VERSION").exists():
        run_quiet(
            as_postgres(
                [
                    str(bindir / "initdb"),
                    "-D",
                    str(data),
                    "-U",
                    "postgres",
                    "-E",
                    "UTF8",
                    "--locale=C.UTF-8",
                    # Trust on loopback only: this is a throwaway development cluster
                    # that listens on 127.0.0.1 and a private socket directory.
                    "--auth=trust",
                ]
            ),
            f"{name}: initdb failed",
        )
    sock.mkdir(exist_ok=True)
    if is_root():
        shutil.chown(sock, "postgres", "postgres")
    opts = (
        f"-p {cluster.port} -k {sock} -c listen_addresses=127.0.0.1 -c max_connections=300 "
        "-c shared_buffers=128MB"
    )
    run_quiet(
        as_postgres(
            [
                str(bindir / "pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(base / "postgres.log"),
                "-o",
                opts,
                "-w",
                "-t",
                "60",
                "start",
            ]
        ),
        f"{name}: pg_ctl start failed (see {base / 'postgres.log'})",
    )
    cluster.remember(state, postmaster_pid(base), str(base))
    wait_postgres(cluster.dsn(), create_db=True, deadline=time.monotonic() + START_TIMEOUT_S)
    say(
        f"{name}: started on 127.0.0.1:{cluster.port} (pid {cluster.record(state)[0]}) "
        f"in {time.monotonic() - t0:.1f}s"
    )
    return True


def stop_cluster(state: State, cluster: Cluster) -> None:
    pid, datadir = cluster.record(state)
    if not pid or not datadir:
        return
    base = Path(datadir)
    if pid_alive(pid):
        bindir = Path(f"/usr/lib/postgresql/{PG_VERSION}/bin")
        subprocess.run(
            as_postgres(
                [
                    str(bindir / "pg_ctl"),
                    "-D",
                    str(base / "data"),
                    "-m",
                    "fast",
                    "-w",
                    "-t",
                    "30",
                    "stop",
                ]
            ),
            capture_output=True,
            check=False,
        )
        kill_and_wait(pid, 10)
        say(f"{_named(cluster)}: stopped (pid {pid})")
    cluster.remember(state, None, datadir)


def stop_postgres(state: State) -> None:
    """Stops every cluster of this stack the state file names (the first and the rest)."""
    for extra in list(state.extra_postgres):
        stop_cluster(state, Cluster(int(extra["index"]), int(extra["port"])))
    stop_cluster(state, Cluster(1, PG_PORT))


def start_extra_clusters(state: State) -> list[Cluster]:
    """The clusters past the first that SAGA_DEV_PG_CLUSTERS asks for, started unless
    SAGA_DEV_PG_SHARD_DSNS names servers already; the ones this call started."""
    extra = clusters()[1:]
    if not extra:
        return []
    if os.environ.get("SAGA_DEV_PG_SHARD_DSNS"):
        say("postgres: using SAGA_DEV_PG_SHARD_DSNS (external servers), no more started")
        return []
    started: list[Cluster] = []
    try:
        for cluster in extra:
            if start_cluster(state, cluster):
                started.append(cluster)
    except BaseException:
        for cluster in started:
            stop_cluster(state, cluster)
        raise
    return started


def shard_dsns() -> str | None:
    """SAGA_DEV_PG_SHARD_DSNS: the clusters past the first, for the sharded tests."""
    given = os.environ.get("SAGA_DEV_PG_SHARD_DSNS")
    if given:
        return given
    extra = clusters()[1:]
    return ",".join(cluster.dsn() for cluster in extra) if extra else None


# --------------------------------------------------------------------------- kafka


def kafka_libs() -> Path:
    libs = DEV / "kafka" / "libs"
    stamp = libs / ".pom-sha1"
    digest = hashlib.sha1(KAFKA_POM.read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text() == digest:
        return libs
    if shutil.which("mvn") is None:
        raise StackError(
            "kafka: Maven (mvn) is not installed; it is needed to fetch the Kafka jars"
        )
    t0 = time.monotonic()
    say("kafka: resolving org.apache.kafka:kafka_2.13 and its dependencies with Maven ...")
    if libs.exists():
        shutil.rmtree(libs)
    proc = subprocess.run(
        [
            "mvn",
            "-q",
            "-B",
            "-f",
            str(KAFKA_POM),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={libs}",
            "-DincludeScope=runtime",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        errors = [ln for ln in proc.stdout.splitlines() if "[ERROR]" in ln]
        reason = errors[0].replace("[ERROR]", "").strip() if errors else "mvn failed"
        raise StackError(
            f"kafka: Maven could not fetch the Kafka jars (Maven Central unreachable?): {reason[:300]}"
        )
    stamp.write_text(digest)
    say(f"kafka: jars resolved in {time.monotonic() - t0:.1f}s")
    return libs


def java_bin() -> str:
    java = shutil.which("java")
    if java is None:
        raise StackError("kafka: no java on PATH; Kafka 4 needs Java 17 or newer")
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False).stderr
    try:
        version = out.split('"')[1]
        major = int(version.split(".")[0])
    except (IndexError, ValueError):
        raise StackError(f"kafka: cannot read the Java version from: {out.strip()[:120]}") from None
    if major < 17:
        raise StackError(f"kafka: Java {version} found; Kafka 4 needs Java 17 or newer")
    return java


SERVER_PROPERTIES = """\
# Written by scripts/devstack.py: a single-node KRaft cluster on loopback only.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller_port}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs={logdir}
num.partitions=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
# Fewer offsets partitions: the first consumer group of a fresh cluster is ready sooner.
offsets.topic.num.partitions=8
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
# Tests create many short-lived groups; no reason to delay the first rebalance.
group.initial.rebalance.delay.ms=0
message.max.bytes=2097152
"""

LOG4J2 = """\
Configuration:
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: WARN
      AppenderRef:
        - ref: STDOUT
"""


async def _kafka_ready(bootstrap: str) -> None:
    from aiokafka.admin import AIOKafkaAdminClient

    # Refused connections are expected while the broker starts; we report our own line.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000)
    await admin.start()
    try:
        await admin.list_topics()  # a real metadata request
    finally:
        await admin.close()


def wait_kafka(
    bootstrap: str, deadline: float, pid: int | None = None, log: Path | None = None
) -> None:
    last: Exception | None = None
    while time.monotonic() < deadline:
        if pid is not None and not pid_alive(pid):
            tail = log.read_text().strip().splitlines()[-1:] if log and log.exists() else []
            raise StackError(f"kafka: the broker exited during start-up: {' '.join(tail)[:300]}")
        try:
            asyncio.run(_kafka_ready(bootstrap))
            return
        except Exception as exc:
            last = exc
            time.sleep(0.5)
    raise StackError(f"kafka: did not answer a metadata request at {bootstrap}: {last}")


def start_kafka(state: State, *, fresh: bool = False) -> bool:
    """Starts this stack's broker unless one is named or already up; ``fresh`` formats
    its storage anew first (see ``run``)."""
    if os.environ.get("SAGA_KAFKA__BOOTSTRAP_SERVERS"):
        wait_kafka(os.environ["SAGA_KAFKA__BOOTSTRAP_SERVERS"], time.monotonic() + 20)
        say("kafka: using SAGA_KAFKA__BOOTSTRAP_SERVERS (external broker), nothing started")
        return False
    bootstrap = f"127.0.0.1:{KAFKA_PORT}"
    if pid_alive(state.kafka_pid):
        wait_kafka(bootstrap, time.monotonic() + 20, state.kafka_pid)
        say(f"kafka: already up on {bootstrap} (pid {state.kafka_pid})")
        return False
    t0 = time.monotonic()
    java = java_bin()
    for port in (KAFKA_PORT, KAFKA_CONTROLLER_PORT):
        if port_open(port):
            raise StackError(
                f"kafka: port {port} on 127.0.0.1 is taken by another process; stop it or set "
                "SAGA_DEV_KAFKA_PORT / SAGA_DEV_KAFKA_CONTROLLER_PORT"
            )
    libs = kafka_libs()
    home = KAFKA_HOME
    home.mkdir(parents=True, exist_ok=True)
    logdir = home / "data"
    props = home / "server.properties"
    props.write_text(
        SERVER_PROPERTIES.format(
            port=KAFKA_PORT, controller_port=KAFKA_CONTROLLER_PORT, logdir=logdir
        )
    )
    (home / "log4j2.yaml").write_text(LOG4J2)
    jvm = [
        java,
        "-Xms256m",
        "-Xmx512m",
        "-XX:+UseG1GC",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={home / 'log4j2.yaml'}",
        f"-Dkafka.logs.dir={home / 'logs'}",
        "-cp",
        f"{libs}/*",
    ]
    if fresh or not (logdir / "meta.properties").exists():
        if logdir.exists():
            shutil.rmtree(logdir)
        cluster_id = kraft_cluster_id()
        run_quiet(
            [*jvm, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props)],
            "kafka: formatting the KRaft storage failed",
        )
    log = home / "kafka.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [*jvm, "kafka.Kafka", str(props)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # survives the `make up` shell; stopped by pid in `down`
        )
    state.kafka_pid = proc.pid
    state.save()
    wait_kafka(bootstrap, time.monotonic() + START_TIMEOUT_S, proc.pid, log)
    say(f"kafka: started on {bootstrap} (pid {proc.pid}) in {time.monotonic() - t0:.1f}s")
    return True


def stop_kafka(state: State) -> None:
    if state.kafka_pid and pid_alive(state.kafka_pid):
        kill_and_wait(state.kafka_pid, 30)
        say(f"kafka: stopped (pid {state.kafka_pid})")
    state.kafka_pid = None
    state.save()


# --------------------------------------------------------------------------- commands


def settings_env() -> dict[str, str]:
    env = {
        "SAGA_PG__DSN": os.environ.get("SAGA_PG__DSN") or pg_dsn(),
        "SAGA_KAFKA__BOOTSTRAP_SERVERS": os.environ.get("SAGA_KAFKA__BOOTSTRAP_SERVERS")
        or f"127.0.0.1:{KAFKA_PORT}",
    }
    shards = shard_dsns()
    if shards:
        env["SAGA_DEV_PG_SHARD_DSNS"] = shards
    return env


def print_env() -> None:
    lines = [f"export {k}={v}" for k, v in settings_env().items()]
    DEV.mkdir(parents=True, exist_ok=True)
    ENV_FILE.write_text("\n".join(lines) + "\n")
    for line in lines:
        print(line, flush=True)


@dataclass
class Started:
    """What one `up` started (and a `run` then stops): the clusters by index, the broker."""

    clusters: list[Cluster]
    kafka: bool


def up(*, fresh_kafka: bool = False) -> Started:
    extra = () if os.environ.get("SAGA_DEV_PG_SHARD_DSNS") else pg_cluster_ports()[1:]
    refuse_shared_ports(
        pg=not os.environ.get("SAGA_PG__DSN"),
        kafka=not os.environ.get("SAGA_KAFKA__BOOTSTRAP_SERVERS"),
        pg_extra=extra,
    )
    state = State.load()
    started: list[Cluster] = []
    try:
        if start_postgres(state):
            started.append(Cluster(1, PG_PORT))
        started += start_extra_clusters(state)
        started_kafka = start_kafka(state, fresh=fresh_kafka)
    except BaseException:
        for cluster in started:
            stop_cluster(state, cluster)
        raise
    return Started(started, started_kafka)


def restart_kafka() -> None:
    """Stops this stack's broker (by pid) and starts it again on its data: a restart,
    not a new cluster. Refused for a broker the stack did not start."""
    named = os.environ.get("SAGA_KAFKA__BOOTSTRAP_SERVERS")
    if named and named != f"127.0.0.1:{KAFKA_PORT}":
        raise StackError(
            f"kafka: SAGA_KAFKA__BOOTSTRAP_SERVERS names {named}, not this stack's broker "
            f"(127.0.0.1:{KAFKA_PORT}); not restarting it"
        )
    state = State.load()
    if not pid_alive(state.kafka_pid):
        raise StackError(
            f"kafka: no broker of this stack runs on 127.0.0.1:{KAFKA_PORT}; run `up` first"
        )
    stop_kafka(state)
    # start_kafka waits for an external broker when the variable is set: this one is ours.
    os.environ.pop("SAGA_KAFKA__BOOTSTRAP_SERVERS", None)
    start_kafka(state)


def _cluster_index(rest: list[str], cmd: str) -> int:
    if len(rest) != 1 or not rest[0].isdigit() or int(rest[0]) < 1:
        raise StackError(f"{cmd}: give the cluster's number (1 is the first), e.g. `{cmd} 2`")
    return int(rest[0])


def pg_stop(index: int) -> None:
    """Stops cluster ``index`` of this stack (a chaos test's "this shard is down"); its
    data stays for `pg-start`. Refused for a cluster the stack does not run."""
    state = State.load()
    cluster = known_cluster(state, index)
    pid, _ = cluster.record(state)
    if not pid_alive(pid):
        raise StackError(
            f"{_named(cluster)}: no cluster of this stack runs on 127.0.0.1:{cluster.port}; "
            "run `up` first (with SAGA_DEV_PG_CLUSTERS for the clusters past the first)"
        )
    stop_cluster(state, cluster)


def pg_start(index: int) -> None:
    """Starts cluster ``index`` of this stack again, on the data it had."""
    state = State.load()
    start_cluster(state, known_cluster(state, index))


def down(started: Started | None = None) -> None:
    """Stops what ``started`` names, or everything of this stack (the broker, then every
    cluster the state file names)."""
    state = State.load()
    if started is None:
        stop_kafka(state)
        stop_postgres(state)
        return
    if started.kafka:
        stop_kafka(state)
    for cluster in started.clusters:
        stop_cluster(State.load(), cluster)  # re-read: a test may have restarted it


def status() -> int:
    state = State.load()
    ok = True
    wanted = {c.index: c for c in clusters()}
    for extra in state.extra_postgres:
        wanted.setdefault(int(extra["index"]), Cluster(int(extra["index"]), int(extra["port"])))
    for cluster in sorted(wanted.values(), key=lambda c: c.index):
        pid, _ = cluster.record(state)
        alive = pid_alive(pid)
        ok &= alive
        name = _named(cluster)
        say(f"{name}: up on 127.0.0.1:{cluster.port} (pid {pid})" if alive else f"{name}: down")
    alive = pid_alive(state.kafka_pid)
    ok &= alive
    say(f"kafka: up on 127.0.0.1:{KAFKA_PORT} (pid {state.kafka_pid})" if alive else "kafka: down")
    return 0 if ok else 1


def _run(rest: list[str]) -> int:
    if rest[:1] == ["--"]:
        rest = rest[1:]
    if not rest:
        raise StackError("run: give a command after --")
    # A broker started for one command begins empty: the suite leaves thousands of
    # topics behind, and a broker that kept every earlier run's (16,000 partitions
    # after six runs) grew slower each run and ran out of its 512 MB heap.
    started = up(fresh_kafka=True)
    t0 = time.monotonic()
    try:
        return subprocess.call(rest, env={**os.environ, **settings_env()})
    finally:
        say(f"devstack: command finished in {time.monotonic() - t0:.1f}s")
        down(started)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    cmd, rest = argv[0], argv[1:]
    try:
        if cmd == "up":
            up()
            print_env()
            return 0
        if cmd == "down":
            down()
            return 0
        if cmd == "restart-kafka":
            restart_kafka()
            return 0
        if cmd == "pg-stop":
            pg_stop(_cluster_index(rest, cmd))
            return 0
        if cmd == "pg-start":
            pg_start(_cluster_index(rest, cmd))
            return 0
        if cmd == "status":
            return status()
        if cmd == "env":
            print_env()
            return 0
        if cmd == "tools":
            tools()
            return 0
        if cmd == "run":
            return _run(rest)
    except StackError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        return 130
    print(
        f"error: unknown command {cmd!r}; use up, down, restart-kafka, pg-stop, pg-start, "
        "status, env, run or tools",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
