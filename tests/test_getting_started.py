"""docs/getting-started.md works as written, from an empty folder.

Every Python and TOML block of the guide names its file on its first line
(``# myapp/sagas.py``); the tests write them into an empty folder and then:

- run the guide's tests there with pytest, under the guide's pytest settings (the
  Postgres-backed one on this session's database);
- run its participant and its worker as processes on the real Postgres and Kafka,
  namespaced with the settings its "Several apps" section lists, start and approve
  transfers with its client functions, and publish messages to its trigger's topic;
- check that every ``saga`` command its shell blocks show exists with those options, that
  the extras it installs exist, and that every ``SAGA_*__*`` variable it names is a setting.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import re
import signal
import subprocess
import sys
import tomllib
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import pytest
import typer
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from pydantic import BaseModel
from typer.testing import CliRunner

from saga_engine import Settings, saga_id_for
from saga_engine.cli import app
from tests.doc_blocks import ROOT, CodeBlock, code_blocks, shell_commands
from tests.waiting import eventually

GUIDE = ROOT / "docs" / "getting-started.md"
_FILE = re.compile(r"# ([\w./-]+\.(?:py|toml))")


def _files() -> dict[str, CodeBlock]:
    return {
        m.group(1): b
        for b in code_blocks(GUIDE)
        if b.lang in ("python", "toml") and (m := _FILE.fullmatch(b.first_line))
    }


def _write_project(folder: Path) -> Path:
    for name, block in _files().items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(block.code)
    return folder


def _test_count() -> int:
    return sum(
        len(re.findall(r"^async def test_", b.code, re.M))
        for name, b in _files().items()
        if name.startswith("tests/")
    )


def test_every_code_block_is_a_file_of_the_project_or_a_shell_command() -> None:
    blocks = code_blocks(GUIDE)
    assert {b.lang for b in blocks} == {"python", "toml", "sh"}
    unnamed = [b.line for b in blocks if b.lang != "sh" and not _FILE.fullmatch(b.first_line)]
    assert not unnamed, f"blocks at lines {unnamed} do not name their file"
    assert {"pyproject.toml", "myapp/sagas.py", "myapp/accounts.py", "myapp/client.py"} <= set(
        _files()
    )
    assert _test_count() >= 4


def _env(**settings: str) -> dict[str, str]:
    """This process's environment without a PYTHONPATH (the project stands alone)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(settings)
    return env


async def test_the_guides_tests_pass(tmp_path: Path, pg_database: str) -> None:
    project = _write_project(tmp_path)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        cwd=project,
        env=_env(SAGA_PG__DSN=pg_database),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=100)
    report = out.decode()
    assert proc.returncode == 0, report
    summary = report.strip().splitlines()[-1]
    assert re.match(rf"{_test_count()} passed in ", summary), report


# ------------------------------------------------------------------ the project, running


class _Processes:
    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.cwd, self.env = cwd, env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *args: str) -> None:
        with (self.cwd / f"{name}.log").open("wb") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, *args], cwd=self.cwd, env=self.env, stdout=log, stderr=log
            )

    def logs(self) -> str:
        return "\n".join(
            f"--- {name}.log\n" + (self.cwd / f"{name}.log").read_text()[-3000:]
            for name in self.procs
        )

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                pytest.fail(f"{name} exited with {proc.returncode}\n{self.logs()}")

    def stop(self) -> None:
        """Interrupts each, as Ctrl-C would."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def _imported(project: Path, env: dict[str, str]) -> Iterator[Any]:
    """The project's ``myapp.client``, imported in this process under ``env``."""
    saved_env = dict(os.environ)
    os.environ.update(env)
    sys.path.insert(0, str(project))
    try:
        yield importlib.import_module("myapp.client")
    finally:
        sys.path.remove(str(project))
        for name in [m for m in sys.modules if m == "myapp" or m.startswith("myapp.")]:
            del sys.modules[name]
        os.environ.clear()
        os.environ.update(saved_env)


@contextlib.asynccontextmanager
async def _topics_removed(bootstrap: str, prefix: str) -> AsyncIterator[None]:
    try:
        yield
    finally:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            ours = [t for t in await admin.list_topics() if t.startswith(f"{prefix}.")]
            if ours:
                await admin.delete_topics(ours)
        finally:
            await admin.close()


async def _dead_letters(env: dict[str, str], within_s: float) -> list[dict[str, Any]]:
    """``saga dlq list --json`` (the guide's way to see them), once it lists something."""

    async def listed() -> list[dict[str, Any]]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "saga_engine",
            "dlq",
            "list",
            "--json",
            "--timeout",
            "10",
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        rows: list[dict[str, Any]] = orjson.loads(out)
        return rows

    return await eventually(listed, timeout=within_s, interval=0.5, what="a dead letter listed")


@pytest.mark.integration
@pytest.mark.timeout(240)
async def test_the_guides_project_runs_on_postgres_and_kafka(
    tmp_path: Path, pg_database: str, kafka_bootstrap: str
) -> None:
    project = _write_project(tmp_path)
    uid = uuid.uuid4().hex[:8]
    prefix = f"gs{uid}"
    # The guide's "Several apps on one Postgres and one Kafka" settings, all of them.
    namespace = {
        "SAGA_PG__DSN": pg_database,
        "SAGA_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
        "SAGA_PG__DB_SCHEMA": f"engine_{uid}",
        "SAGA_PARTICIPANT__DB_SCHEMA": f"accounts_{uid}",
        "SAGA_KAFKA__TOPIC_PREFIX": prefix,
        "SAGA_KAFKA__GROUP_ID": f"{prefix}-engine",
        "SAGA_KAFKA__PARTITIONS": "2",
        "SAGA_ADMIN__PORT": "0",
    }
    trigger_topic = f"{prefix}.transfers.requested"
    processes = _Processes(project, _env(**namespace))
    db = await asyncpg.connect(pg_database)
    async with _topics_removed(kafka_bootstrap, prefix):
        try:
            processes.start("accounts", "-m", "myapp.accounts")
            processes.start("worker", "-m", "myapp.worker")

            with _imported(project, namespace) as client:
                small = await client.request_transfer("t-1", "alice", "bob", 30)
                big = await client.request_transfer("t-2", "alice", "bob", 5000)
                assert await client.request_transfer("t-1", "alice", "bob", 30) == small
                await client.approve(big, "carol")  # kept until the saga waits for it
            assert small == saga_id_for("transfer", "transfer-t-1")

            admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
            await admin.start()
            try:  # as the producing team would; the worker creates it too
                await admin.create_topics([NewTopic(trigger_topic, 1, 1)])
            finally:
                await admin.close()
            producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
            await producer.start()
            try:
                message = {"transfer_id": "t-3", "source": "alice", "target": "bob", "amount": 40}
                for value in (orjson.dumps(message), orjson.dumps(message), b"{not json"):
                    await producer.send_and_wait(trigger_topic, value, key=b"t-3")
            finally:
                await producer.stop()
            by_trigger = saga_id_for("transfer", "transfer-t-3")

            sagas = f'"engine_{uid}".sagas'

            async def statuses() -> dict[str, str]:
                processes.check_alive()
                with contextlib.suppress(asyncpg.UndefinedTableError):
                    rows = await db.fetch(f"SELECT saga_id, status FROM {sagas}")
                    return {r["saga_id"]: r["status"] for r in rows}
                return {}

            await eventually(
                statuses,
                until=lambda found: found == dict.fromkeys((small, big, by_trigger), "completed"),
                timeout=120,
                interval=0.3,
                what="the three sagas completed",
                context=processes.logs,
            )

            rows = await db.fetch(f'SELECT id, balance FROM "accounts_{uid}".accounts')
            balances = {r["id"]: r["balance"] for r in rows}
            assert balances == {"alice": 10000 - 30 - 5000 - 40, "bob": 30 + 5000 + 40}

            dead = await _dead_letters(processes.env, within_s=30)
            assert [(d["reason"], d["origin_topic"]) for d in dead] == [
                ("malformed_json", trigger_topic)
            ], dead
        finally:
            processes.stop()
            await db.close()
    # The worker of the guide stops cleanly on SIGINT (or SIGTERM).
    assert processes.procs["worker"].returncode == 0, processes.logs()


# ------------------------------------------------------------------ commands and settings


def _cli_command(path: list[str]) -> tuple[Any, list[str]]:
    """The (typer) command ``saga <path...>`` names, and the words that named it."""
    command: Any = typer.main.get_command(app)
    named: list[str] = []
    for word in path:
        subcommands = getattr(command, "commands", None)
        if subcommands is None or word.startswith("-"):
            break
        assert word in subcommands, f"`saga {' '.join([*named, word])}` is not a command"
        command, named = subcommands[word], [*named, word]
    return command, named


def _saga_commands() -> list[list[str]]:
    return [
        argv[1:]
        for block in code_blocks(GUIDE, "sh")
        for argv in shell_commands(block)
        if argv[0] == "saga"
    ]


def test_every_saga_command_in_the_guide_exists_with_its_options() -> None:
    commands = _saga_commands()
    assert len(commands) >= 8
    runner = CliRunner()
    for args in commands:
        command, named = _cli_command(args)
        assert named, f"`saga {' '.join(args)}` names no command"
        result = runner.invoke(app, [*named, "--help"])
        assert result.exit_code == 0, (named, result.output)
        options = {opt for param in command.params for opt in param.opts}
        for word in args:
            if word.startswith("--"):
                assert word.split("=")[0] in options, f"`saga {' '.join(named)}` has no {word}"


def test_the_guide_names_every_cli_command_of_the_paths_table() -> None:
    """The "which path" table covers every operator command of the CLI."""
    commands: dict[str, Any] = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    section = GUIDE.read_text().split("## Which path each command takes", 1)[1]
    section = section.split("\n## ", 1)[0]
    not_operator = {"version", "worker"}
    for name in sorted(set(commands) - not_operator):
        assert f"`{name}`" in section or f"`saga {name}" in section, name


def test_the_modules_extras_and_settings_the_guide_names_exist() -> None:
    text = GUIDE.read_text()
    files = _files()
    for module in re.findall(r"python -m (myapp\.\w+)", text):
        assert module.replace(".", "/") + ".py" in files, module
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for named in re.findall(r"saga-engine\[([\w,]+)\]", text):
        assert set(named.split(",")) <= set(extras), named
    variables = set(re.findall(r"\bSAGA_([A-Z]+)__([A-Z_]+)\b", text))
    assert len(variables) >= 8
    for section, field in variables:
        model = Settings.model_fields[section.lower()].annotation
        assert isinstance(model, type), section
        assert issubclass(model, BaseModel), section
        assert field.lower() in model.model_fields, f"SAGA_{section}__{field}"


def test_the_guide_installs_the_engine_from_a_checkout() -> None:
    """saga-engine is on no package index: a bare ``pip install saga-engine[...]`` fails
    with "No matching distribution found" (issue 39, 8.7)."""
    installs = [
        argv
        for block in code_blocks(GUIDE, "sh")
        for argv in shell_commands(block)
        if argv[:2] == ["pip", "install"]
    ]
    named = [word for argv in installs for word in argv if "saga-engine" in word]
    assert named, "the guide installs no saga-engine"
    for word in named:
        path, _, extras = word.partition("[")
        assert "/" in path, f"{word!r} asks a package index, where saga-engine is not"
        assert path.rstrip("/").endswith("saga-engine"), word
        assert extras, f"{word!r}: the guide's install names the fast extra"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "saga-engine"  # what a checkout installs


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_links_of_the_guide_and_the_readme_resolve() -> None:
    for document in (GUIDE, ROOT / "README.md"):
        for target in re.findall(r"\]\(([^)\s]+)\)", document.read_text()):
            if re.match(r"\w+://", target):
                continue
            file, _, anchor = target.partition("#")
            path = (document.parent / file).resolve() if file else document
            assert path.exists(), f"{document.name}: {target}"
            if anchor:
                headings = re.findall(r"^#+ (.*)$", path.read_text(), re.M)
                assert anchor in {_slug(h) for h in headings}, f"{document.name}: {target}"
