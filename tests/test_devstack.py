"""``scripts/devstack.py`` with two stacks from one checkout (issue 22 §7).

A copy of the scripts in a scratch checkout starts two real Postgres clusters on free
ports, side by side (Kafka is the session's, given as SAGA_KAFKA__BOOTSTRAP_SERVERS, so no
broker is started); ``down`` of one leaves the other up, and a third stack that would
share a port with a running one is refused with that stack named. Everything started is
stopped, and the scratch checkout removed, whatever happens. And ``run`` starts a broker
with empty storage, so no run inherits the topics of the ones before. A stack of three
clusters (the shards of issue 43's tests) starts, stops and restarts one by its number.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from tests.conftest import PgTarget

pytestmark = pytest.mark.integration

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def checkout() -> Iterator[Path]:
    # Under /var/tmp, readable by all: the postgres user (the server's, under root) keeps
    # the clusters in the checkout's .dev/, so one rmtree removes them.
    root = Path(tempfile.mkdtemp(prefix="devstack-", dir="/var/tmp"))
    root.chmod(0o755)
    (root / "scripts").mkdir()
    for script in SCRIPTS.glob("devstack*.py"):
        shutil.copy(script, root / "scripts" / script.name)
    shutil.copytree(SCRIPTS / "kafka", root / "scripts" / "kafka")  # the broker's pom.xml
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _devstack(
    root: Path, command: str, pg_port: int, **ports: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_DEV_")}
    env.pop("SAGA_PG__DSN", None)  # a Postgres of its own; the session's Kafka
    env.update(SAGA_DEV_PG_PORT=str(pg_port), **ports)
    return subprocess.run(
        [sys.executable, str(root / "scripts" / "devstack.py"), *command.split()],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_two_stacks_of_one_checkout_start_and_stop_apart(
    checkout: Path, kafka_bootstrap: str
) -> None:
    first, second = _free_port(), _free_port()
    try:
        up = _devstack(checkout, "up", first)
        assert up.returncode == 0, up.stderr
        assert f"127.0.0.1:{first}/saga" in up.stdout
        assert "SAGA_DEV_PG_SHARD_DSNS" not in up.stdout  # one cluster unless asked
        # Another stack on other ports, while the first runs.
        up = _devstack(checkout, "up", second)
        assert up.returncode == 0, up.stderr
        assert f"postgres: started on 127.0.0.1:{second}" in up.stderr
        assert _accepts(first)
        assert _accepts(second)
        status = _devstack(checkout, "status", first)
        assert f"postgres: up on 127.0.0.1:{first}" in status.stderr

        # A third stack sharing the first one's Postgres port is refused, naming it.
        clash = _devstack(checkout, "up", first, SAGA_DEV_KAFKA_PORT=str(_free_port()))
        assert clash.returncode == 1
        assert f"port {first} is the running stack's of .dev/state-{first}-" in clash.stderr
        assert f"postgres on {first}" in clash.stderr

        # `down` stops only its own stack.
        down = _devstack(checkout, "down", second)
        assert down.returncode == 0, down.stderr
        assert not _accepts(second)
        assert _accepts(first)
        status = _devstack(checkout, "status", first)
        assert f"postgres: up on 127.0.0.1:{first}" in status.stderr
    finally:
        for port in (second, first):
            _devstack(checkout, "down", port)
    assert not _accepts(first)


_CREATE = """
import asyncio, os
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
async def main():
    admin = AIOKafkaAdminClient(bootstrap_servers=os.environ["SAGA_KAFKA__BOOTSTRAP_SERVERS"])
    await admin.start()
    try:
        if {create}:
            await admin.create_topics([NewTopic("left-behind", 1, 1)])
        print("topics:", sorted(t for t in await admin.list_topics() if not t.startswith("__")))
    finally:
        await admin.close()
asyncio.run(main())
"""


def test_a_broker_started_for_one_command_begins_empty(checkout: Path, pg: PgTarget) -> None:
    """``run`` formats the storage of a broker it starts: the suite leaves thousands of
    topics behind, and a broker that kept them all grew slower each run."""
    kafka, controller = _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
    env.update(
        SAGA_PG__DSN=pg.database_dsn,  # the session's Postgres: only a broker is started
        SAGA_DEV_PG_PORT=str(_free_port()),
        SAGA_DEV_KAFKA_PORT=str(kafka),
        SAGA_DEV_KAFKA_CONTROLLER_PORT=str(controller),
    )
    script = [sys.executable, str(checkout / "scripts" / "devstack.py"), "run", "--"]

    def run(create: bool) -> str:
        done = subprocess.run(
            [*script, sys.executable, "-c", _CREATE.format(create=create)],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"kafka: started on 127.0.0.1:{kafka}" in done.stderr, done.stderr
        return done.stdout

    assert "topics: ['left-behind']" in run(create=True)
    assert "topics: []" in run(create=False)
    assert not _accepts(kafka)


async def _remember(dsn: str, value: str | None = None) -> str | None:
    """Writes ``value`` into a table of the cluster's ``saga`` database, or reads it back."""
    conn = await asyncpg.connect(dsn, timeout=5)
    try:
        if value is None:
            found = await conn.fetchval("SELECT value FROM devstack_kept")
            return None if found is None else str(found)
        await conn.execute("CREATE TABLE devstack_kept (value text)")
        await conn.execute("INSERT INTO devstack_kept VALUES ($1)", value)
        return value
    finally:
        await conn.close()


@pytest.mark.timeout(300)
async def test_a_stack_of_three_clusters_starts_stops_and_restarts_one(
    checkout: Path, kafka_bootstrap: str
) -> None:
    """``SAGA_DEV_PG_CLUSTERS=3``: three clusters, each its own port and data; the env
    names the two past the first (SAGA_DEV_PG_SHARD_DSNS); ``pg-stop 2`` / ``pg-start 2``
    stop and start one on its data; ``status`` and ``down`` cover all three."""
    first, second, third = _free_port(), _free_port(), _free_port()
    ports = {"SAGA_DEV_PG_CLUSTERS": "3", "SAGA_DEV_PG_EXTRA_PORTS": f"{second},{third}"}

    def devstack(*command: str) -> subprocess.CompletedProcess[str]:
        return _devstack(checkout, " ".join(command), first, **ports)

    try:
        up = devstack("up")
        assert up.returncode == 0, up.stderr
        second_dsn = f"postgresql://postgres@127.0.0.1:{second}/saga"
        shards = f"{second_dsn},postgresql://postgres@127.0.0.1:{third}/saga"
        assert f"export SAGA_DEV_PG_SHARD_DSNS={shards}" in up.stdout
        assert f"127.0.0.1:{first}/saga" in up.stdout
        assert all(_accepts(port) for port in (first, second, third))
        assert (checkout / ".dev" / f"pg-{second}" / "data").is_dir()
        assert (checkout / ".dev" / f"pg-{third}" / "data").is_dir()
        status = devstack("status")  # (exit 1: the broker is the session's, not the stack's)
        assert f"postgres: up on 127.0.0.1:{first}" in status.stderr
        assert f"postgres 2: up on 127.0.0.1:{second}" in status.stderr
        assert f"postgres 3: up on 127.0.0.1:{third}" in status.stderr

        await _remember(second_dsn, "kept")
        stop = devstack("pg-stop", "2")
        assert stop.returncode == 0, stop.stderr
        assert not _accepts(second)
        assert _accepts(first)
        assert _accepts(third)
        status = devstack("status")
        assert "postgres 2: down" in status.stderr
        assert f"postgres 3: up on 127.0.0.1:{third}" in status.stderr
        again = devstack("pg-stop", "2")
        assert again.returncode == 1
        assert f"postgres 2: no cluster of this stack runs on 127.0.0.1:{second}" in again.stderr

        start = devstack("pg-start", "2")
        assert start.returncode == 0, start.stderr
        assert await _remember(second_dsn) == "kept"  # the same data

        down = devstack("down")
        assert down.returncode == 0, down.stderr
        assert not any(_accepts(port) for port in (first, second, third))
    finally:
        devstack("down")


def test_cluster_commands_say_what_is_wrong(checkout: Path) -> None:
    bad = _devstack(checkout, "status", _free_port(), SAGA_DEV_PG_CLUSTERS="many")
    assert bad.returncode == 1
    assert "SAGA_DEV_PG_CLUSTERS='many' is not a number from 1 to 9" in bad.stderr
    unknown = _devstack(checkout, "pg-stop 4", _free_port())
    assert unknown.returncode == 1
    assert "this stack has no cluster 4" in unknown.stderr


def test_run_starts_the_clusters_past_the_first_and_stops_them(
    checkout: Path, kafka_bootstrap: str, pg: PgTarget
) -> None:
    """What ``make test`` does (``SAGA_DEV_PG_CLUSTERS=3 devstack.py run -- pytest``): the
    command sees SAGA_DEV_PG_SHARD_DSNS, and the clusters ``run`` started are stopped
    after it. Here the first is the session's (SAGA_PG__DSN) and the broker too."""
    second, third = _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_DEV_")}
    env.update(
        SAGA_PG__DSN=pg.database_dsn,
        SAGA_DEV_PG_PORT=str(_free_port()),
        SAGA_DEV_PG_CLUSTERS="3",
        SAGA_DEV_PG_EXTRA_PORTS=f"{second},{third}",
    )
    show = "import os; print('shards:', os.environ['SAGA_DEV_PG_SHARD_DSNS'])"
    script = [sys.executable, str(checkout / "scripts" / "devstack.py"), "run", "--"]
    done = subprocess.run(
        [*script, sys.executable, "-c", show],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        f"shards: postgresql://postgres@127.0.0.1:{second}/saga,"
        f"postgresql://postgres@127.0.0.1:{third}/saga"
    ) in done.stdout
    assert f"postgres 3: started on 127.0.0.1:{third}" in done.stderr
    assert "postgres 3: stopped" in done.stderr
    assert not _accepts(second)
    assert not _accepts(third)
