"""Health checks for containers (the images have no curl):

    python -m services_demo.health http://127.0.0.1:8101/health   # a service answers 200
    python -m services_demo.health --engine                       # an engine is in its group

``--engine`` asks Kafka whether the engines' consumer group (``SAGA_KAFKA__GROUP_ID``) is
stable with at least one member: an engine that is up and owns inbox partitions.
"""

from __future__ import annotations

import asyncio
import sys

import httpx
from aiokafka.admin import AIOKafkaAdminClient

from saga_engine import Settings


async def engine_in_group(settings: Settings) -> bool:
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka.bootstrap_servers)
    await admin.start()
    try:
        responses = await admin.describe_consumer_groups([settings.kafka.group_id])
    finally:
        await admin.close()
    groups = [g for r in responses for g in r.to_object()["groups"]]
    return any(g["state"] == "Stable" and g["members"] for g in groups)


def main(argv: list[str]) -> int:
    if argv == ["--engine"]:
        return 0 if asyncio.run(engine_in_group(Settings())) else 1
    if len(argv) == 1:
        try:
            return 0 if httpx.get(argv[0], timeout=3.0).status_code == 200 else 1
        except httpx.HTTPError:
            return 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
