"""``devstack.py tools``: the test suite's tools (Debian's chromium and docker-compose),
installed with apt-get when missing."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from devstack_base import AptError, apt_install, say

# The browser test drives Debian's chromium (never `playwright install`: no browser
# download); tests/test_compose.py validates docker-compose.yml offline with Debian's
# docker-compose. Both come from apt-get, like Postgres.
CHROMIUM = os.environ.get("SAGA_TEST_CHROMIUM", "/usr/bin/chromium")


def chromium_present() -> bool:
    return Path(CHROMIUM).is_file()


def compose_present() -> bool:
    # As tests/test_compose.py looks for it: docker-compose, or the docker compose plugin.
    if shutil.which("docker-compose"):
        return True
    if shutil.which("docker") is None:
        return False
    try:
        probe = subprocess.run(
            ["docker", "compose", "version"], capture_output=True, check=False, timeout=15
        )
    except subprocess.TimeoutExpired:
        return False
    return probe.returncode == 0


@dataclass(frozen=True)
class Tool:
    name: str  # also its Debian package
    present: Callable[[], bool]
    without: str  # what the test run loses when it is missing


TOOLS = [
    Tool("chromium", chromium_present, "the admin web page's browser test will fail"),
    Tool("docker-compose", compose_present, "the compose validation test will skip"),
]


def tools() -> None:
    """Installs the test tools that are missing with apt-get, as root or through
    passwordless sudo. When it cannot, one line each on stderr says why and what the
    run loses; it never fails, so the tests run either way."""
    missing = [tool for tool in TOOLS if not tool.present()]
    if not missing:
        say(f"tools: {' and '.join(tool.name for tool in TOOLS)} present")
        return
    installable = []
    for tool in missing:
        if tool.name == "chromium" and "SAGA_TEST_CHROMIUM" in os.environ:
            # Debian's package would not put a browser at that path.
            say(
                f"tools: no chromium at {CHROMIUM} (SAGA_TEST_CHROMIUM); {tool.without}: "
                "point SAGA_TEST_CHROMIUM at a Chromium, or unset it to use Debian's"
            )
        else:
            installable.append(tool)
    if not installable:
        return
    t0 = time.monotonic()
    try:
        apt_install([tool.name for tool in installable], "tools", sudo=True)
    except (AptError, OSError) as exc:
        reason = exc.reason if isinstance(exc, AptError) else str(exc)
        for tool in installable:
            say(
                f"tools: {tool.name} is missing and cannot be installed ({reason}); "
                f"{tool.without}: install Debian's {tool.name}"
            )
        return
    installed = []
    for tool in installable:
        if tool.present():
            installed.append(tool.name)
        else:
            say(f"tools: {tool.name} is still missing after apt-get installed it; {tool.without}")
    if installed:
        say(f"tools: {' and '.join(installed)} installed in {time.monotonic() - t0:.1f}s")
