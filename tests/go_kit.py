"""The Go participant kit (kits/go) for the tests that run its binaries: the kit built
once per session (modules fetched from the Go module proxy on first use), and each
command's binary built from that warm cache. Tests that take ``go_built`` bound their
own run with ``@pytest.mark.timeout(..., func_only=True)``: a cold build on a busy
machine takes minutes, and is bounded on its own (``scaled(900)``)."""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from tests.waiting import scaled

KIT = Path(__file__).resolve().parents[1] / "kits" / "go"


def _go() -> str:
    go = shutil.which("go")
    assert go, "Go is needed for kits/go (Go 1.26 is on the machine list)"
    return go


@pytest.fixture(scope="session")
def go_built() -> str:
    """The kit and its test binaries compiled, before any test's clock starts; the
    ``go`` command's path."""
    go = _go()
    for step in (["build", "./..."], ["test", "-count=1", "-run", "^$", "./..."]):
        done = subprocess.run(
            [go, *step], cwd=KIT, capture_output=True, text=True, timeout=scaled(900)
        )
        assert done.returncode == 0, (
            f"go {' '.join(step)}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    return go


async def build_binary(go: str, package: str, out: Path) -> Path:
    """``go build -o out package`` in the kit (``package``: ``./cmd/...``)."""
    build = await asyncio.create_subprocess_exec(
        go,
        "build",
        "-o",
        str(out),
        package,
        cwd=KIT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, errors = await asyncio.wait_for(build.communicate(), timeout=scaled(900))
    assert build.returncode == 0, errors.decode()[-3000:]
    return out


@asynccontextmanager
async def running(binary: Path, env: Mapping[str, str]) -> AsyncIterator[None]:
    """``binary`` (a Go participant) running with ``env`` for the block; stopped with
    SIGTERM after it, which it must take cleanly (exit 0; its stderr's end says why not)."""
    proc = await asyncio.create_subprocess_exec(
        str(binary),
        env=dict(env),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        yield
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(proc.communicate(), timeout=scaled(60))
    assert proc.returncode == 0, stderr.decode()[-3000:]
