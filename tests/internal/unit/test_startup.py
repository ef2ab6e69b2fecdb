"""Start-up pieces without servers: the static member name a process claims, the
participant's database default, and the retry loop's rules (what it retries, for how
long, and what it cleans up). The real-server tests (tests/integration/test_startup.py)
start an engine and a participant against Kafka and Postgres that come up late."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from pathlib import Path

import pytest

from saga_engine import Settings
from saga_engine.kernel._errors import DependencyUnavailable, KafkaUnavailable
from saga_engine.kernel._instance import InstanceName
from saga_engine.kernel._startup import start_with_retry, unreachable_as_unavailable
from saga_engine.settings import KafkaSettings, ParticipantSettings, PostgresSettings
from saga_engine.store._pgbase import POSTGRES
from saga_engine.transport._kafka import KAFKA


def kafka(tmp_path: Path, **options: object) -> KafkaSettings:
    return KafkaSettings.model_validate({"instance_lock_dir": str(tmp_path), **options})


def test_live_processes_never_share_a_name_and_a_restart_takes_its_name_back(
    tmp_path: Path,
) -> None:
    settings = kafka(tmp_path)
    first = InstanceName.claim(settings, "engines")
    second = InstanceName.claim(settings, "engines")
    other_group = InstanceName.claim(settings, "participants")
    host = socket.gethostname()
    assert (first.name, second.name) == (f"{host}-0", f"{host}-1")
    assert other_group.name == f"{host}-0"  # numbered per group
    first.release()  # the process ended (the kernel drops its lock however it ends)
    again = InstanceName.claim(settings, "engines")
    assert again.name == f"{host}-0"
    for claim in (second, other_group, again):
        claim.release()


def test_a_configured_name_is_used_and_static_membership_can_be_turned_off(
    tmp_path: Path,
) -> None:
    assert InstanceName.claim(kafka(tmp_path, group_instance_id="pod-7"), "g").name == "pod-7"
    assert InstanceName.claim(kafka(tmp_path, static_membership=False), "g").name is None
    with pytest.raises(ValueError, match="group_instance_id"):
        kafka(tmp_path, group_instance_id="has spaces")


def test_the_participant_database_follows_the_engine_database(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("SAGA_PG__DSN", "SAGA_PARTICIPANT__DSN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SAGA_PG__DSN", "postgresql://app@db.internal/orders")
    assert Settings().participant.dsn.get_secret_value() == "postgresql://app@db.internal/orders"
    monkeypatch.setenv("SAGA_PARTICIPANT__DSN", "postgresql://app@db.internal/payments")
    assert Settings().participant.dsn.get_secret_value() == "postgresql://app@db.internal/payments"
    monkeypatch.delenv("SAGA_PARTICIPANT__DSN")
    monkeypatch.delenv("SAGA_PG__DSN")
    built = Settings(
        pg=PostgresSettings(dsn="postgresql://app@db.internal/shop"),
        participant=ParticipantSettings(db_schema="payments"),
    )
    assert built.participant.dsn.get_secret_value() == "postgresql://app@db.internal/shop"
    assert built.participant.db_schema == "payments"


async def test_retries_an_unreachable_dependency_then_starts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    attempts: list[int] = []
    undone: list[int] = []

    async def attempt() -> None:
        attempts.append(1)
        if len(attempts) < 3:
            with unreachable_as_unavailable(KAFKA):
                raise KafkaUnavailable("no broker at 127.0.0.1:1")

    async def undo() -> None:
        undone.append(1)

    with caplog.at_level(logging.WARNING, logger="saga_engine.startup"):
        await asyncio.wait_for(start_with_retry("engine e1", attempt, undo, None), 10)
    assert len(attempts) == 3
    assert len(undone) == 2
    lines = [r.getMessage() for r in caplog.records if "attempt" in r.getMessage()]
    assert len(lines) == 2  # one line per failed attempt
    assert "Kafka is not reachable: no broker at 127.0.0.1:1" in lines[0]


async def test_gives_up_after_the_startup_timeout_saying_how_long_it_waited() -> None:
    async def attempt() -> None:
        with unreachable_as_unavailable(POSTGRES):
            raise ConnectionRefusedError(111, "Connection refused")

    async def undo() -> None:
        return None

    with pytest.raises(DependencyUnavailable) as raised:
        await asyncio.wait_for(start_with_retry("participant p", attempt, undo, 1.0), 10)
    assert raised.value.dependency == "Postgres"
    assert "still unreachable after" in str(raised.value)
    assert "startup_timeout_s=1" in str(raised.value)


async def test_anything_but_unreachability_fails_at_once() -> None:
    attempts: list[int] = []
    undone: list[int] = []

    async def attempt() -> None:
        attempts.append(1)
        with unreachable_as_unavailable(POSTGRES):
            raise ValueError("relation 'sagas' has a column we do not know")

    async def undo() -> None:
        undone.append(1)

    with pytest.raises(ValueError, match="column we do not know"):
        await start_with_retry("engine e1", attempt, undo, None)
    assert attempts == [1]
    assert undone == [1]


async def test_a_certificate_that_fails_verification_is_not_waited_for() -> None:
    async def attempt() -> None:
        with unreachable_as_unavailable(POSTGRES):
            raise ssl.SSLCertVerificationError(1, "certificate verify failed")

    async def undo() -> None:
        return None

    with pytest.raises(ssl.SSLCertVerificationError):
        await asyncio.wait_for(start_with_retry("engine e1", attempt, undo, None), 10)
