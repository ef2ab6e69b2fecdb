"""Creates the demo's Kafka topics: ``python -m services_demo.create_topics`` (a one-shot job).

The engine and the services create the topics they need when they start; in a
deployment with topic auto-creation off and services starting in any order, this job
creates them all first: ``{prefix}.inbox``, ``{prefix}.dlq``, a command topic per
participant and the trigger topic ``{prefix}.orders.requested``. It waits up to a minute
for Kafka to answer, and is idempotent.
"""

from __future__ import annotations

import asyncio
import sys
import time

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from saga_engine import Settings
from services_demo.config import SERVICES, DemoSettings, orders_topic


def demo_topics(settings: Settings, demo: DemoSettings) -> list[str]:
    prefix = settings.kafka.topic_prefix
    participants = [f"{prefix}.cmd.{s}" for s in SERVICES if s != "fraud"]  # fraud is HTTP
    return [f"{prefix}.inbox", f"{prefix}.dlq", *participants, orders_topic(prefix, demo)]


async def create_topics(
    settings: Settings, demo: DemoSettings, within_s: float = 60.0
) -> list[str]:
    """Creates the missing topics; returns the ones it created."""
    kafka = settings.kafka
    deadline = time.monotonic() + within_s
    while True:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
        try:
            await admin.start()
            existing = set(await admin.list_topics())
            missing = [t for t in demo_topics(settings, demo) if t not in existing]
            if missing:
                await admin.create_topics(
                    [NewTopic(t, kafka.partitions, kafka.replication_factor) for t in missing]
                )
            return missing
        except KafkaError as exc:
            if time.monotonic() > deadline:
                raise SystemExit(f"error: Kafka at {kafka.bootstrap_servers}: {exc!r}") from exc
            await asyncio.sleep(1.0)
        finally:
            await admin.close()


def main() -> int:
    settings, demo = Settings(), DemoSettings()
    created = asyncio.run(create_topics(settings, demo))
    topics = demo_topics(settings, demo)
    print(f"topics ready: {', '.join(topics)} (created {len(created)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
