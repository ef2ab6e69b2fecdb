"""Operator metrics: open sagas by status, the oldest parked saga, dead letters.

Served as JSON, or in the Prometheus text format (version 0.0.4) when the client asks
for ``text/plain`` or OpenMetrics, as a Prometheus scraper does.
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import UTC, datetime

from saga_engine._engine import Engine
from saga_engine._status import SagaStatus
from saga_engine.admin.schemas import MetricsBody

#: At most this many open sagas are counted per scrape (the rest is flagged truncated).
MAX_OPEN_SCAN = 200_000
_PAGE = 1_000
OPEN_STATUSES = tuple(s for s in SagaStatus if s.is_open)
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _aware(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


async def collect(engine: Engine) -> MetricsBody:
    by_status: Counter[str] = Counter({s.value: 0 for s in OPEN_STATUSES})
    oldest_parked: datetime | None = None
    after: str | None = None
    scanned = 0
    truncated = False
    while True:
        rows = await engine.store.list_sagas(statuses=OPEN_STATUSES, limit=_PAGE, after_id=after)
        for row in rows:
            by_status[row.status.value] += 1
            if row.status.is_parked:
                updated = _aware(row.updated_at)
                if oldest_parked is None or updated < oldest_parked:
                    oldest_parked = updated
        scanned += len(rows)
        if len(rows) < _PAGE:
            break
        if scanned >= MAX_OPEN_SCAN:
            truncated = True
            break
        after = rows[-1].saga_id
    age = None
    if oldest_parked is not None:
        age = max(0.0, (_aware(engine.clock.now()) - oldest_parked).total_seconds())
    counters = {name: int(value) for name, value in sorted(engine.stats.counts.items())}
    return MetricsBody(
        open_sagas=dict(by_status),
        open_total=sum(by_status.values()),
        oldest_stuck_age_seconds=age,
        dead_lettered=counters.get("dead_lettered", 0),
        counters=counters,
        scan_truncated=truncated,
    )


def wants_text(accept: str | None) -> bool:
    """Prometheus asks for OpenMetrics or text/plain; browsers and tools get JSON."""
    if not accept:
        return False
    accept = accept.lower()
    if "application/json" in accept:
        return False
    return "text/plain" in accept or "openmetrics" in accept


_NAME = re.compile(r"[^a-zA-Z0-9_]")


def _metric_name(counter: str) -> str:
    name = _NAME.sub("_", counter).strip("_") or "unnamed"
    return f"saga_engine_{name}_total"


def render_prometheus(body: MetricsBody) -> str:
    lines = [
        "# HELP saga_open_sagas Open sagas by status.",
        "# TYPE saga_open_sagas gauge",
    ]
    lines += [f'saga_open_sagas{{status="{s}"}} {n}' for s, n in sorted(body.open_sagas.items())]
    lines += [
        "# HELP saga_oldest_stuck_age_seconds Seconds since the longest-parked saga last changed "
        "(0 when none is parked).",
        "# TYPE saga_oldest_stuck_age_seconds gauge",
        f"saga_oldest_stuck_age_seconds {body.oldest_stuck_age_seconds or 0.0}",
        "# HELP saga_dead_lettered_total Messages this engine sent to the dead-letter topic.",
        "# TYPE saga_dead_lettered_total counter",
        f"saga_dead_lettered_total {body.dead_lettered}",
        "# HELP saga_open_scan_truncated 1 when there were too many open sagas to count.",
        "# TYPE saga_open_scan_truncated gauge",
        f"saga_open_scan_truncated {int(body.scan_truncated)}",
    ]
    seen: set[str] = set()
    for counter, value in body.counters.items():
        name = _metric_name(counter)
        if name in seen:
            continue
        seen.add(name)
        lines += [
            f"# HELP {name} The engine counter {_NAME.sub('_', counter)}.",
            f"# TYPE {name} counter",
            f"{name} {value}",
        ]
    return "\n".join(lines) + "\n"
