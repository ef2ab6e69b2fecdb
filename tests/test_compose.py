"""docker-compose.yml stays valid. `docker-compose config -q` needs no Docker engine."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _compose_cmd() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
        if probe.returncode == 0:
            return ["docker", "compose"]
    return None


def test_compose_file_validates() -> None:
    cmd = _compose_cmd()
    if cmd is None:
        pytest.skip("neither docker-compose nor the docker compose plugin is installed")
    proc = subprocess.run(
        [*cmd, "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr


def test_compose_declares_the_stack() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    for needle in (
        "image: postgres:15",
        "image: apache/kafka:4",
        "jaegertracing/jaeger:2",
        "pg_isready",
        "healthcheck",
    ):
        assert needle in text
