"""Deterministic crash points for fault-injection tests.

``SAGA_CRASH_AT="before_send:3"`` makes the process SIGKILL itself the 3rd time it
passes the ``before_send`` point (``:1`` when no count is given; several points may be
listed, comma-separated). The engine passes ``after_append``, ``before_send``,
``before_send_compensation`` and ``after_send``, and ``after_batch_append`` (a batch's
events of two sagas or more durable, none of its commands sent); the worker
``before_offset_commit`` and ``schedule_after_fire`` (a schedule claim's start requests
acknowledged by Kafka, its ``next_fire_at`` not yet moved), ``event_after_store`` (a
domain event kept, the sagas waiting for it not yet told) and ``batch_after_action`` (a
batch operation's action on a saga durable, its progress not yet recorded); participants
``after_commit``, ``after_publish``,
``after_batch_commit`` (a batch of two commands or more committed, none of its replies
sent) and ``in_batch_handler`` (a batch handler returned, its transaction not committed).
"""

from __future__ import annotations

import collections
import os
import signal
import sys
from collections.abc import Callable

CrashHook = Callable[[str], None]


def parse_crash_spec(spec: str) -> dict[str, int]:
    points: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, count = part.partition(":")
        try:
            points[name] = int(count) if count else 1
        except ValueError:
            raise ValueError(f"bad crash spec {part!r}: use point[:count]") from None
        if points[name] < 1:
            raise ValueError(f"bad crash spec {part!r}: count must be >= 1")
    return points


def crash_hook(spec: str | None) -> CrashHook | None:
    """A hook that SIGKILLs this process at the chosen hit of a crash point (None: no hook)."""
    if not spec:
        return None
    targets = parse_crash_spec(spec)
    hits: collections.Counter[str] = collections.Counter()

    def hook(point: str) -> None:
        if point not in targets:
            return
        hits[point] += 1
        if hits[point] == targets[point]:
            sys.stderr.write(f"crash point {point} reached (hit {hits[point]}): SIGKILL\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    return hook
