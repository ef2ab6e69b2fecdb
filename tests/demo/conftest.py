"""The demo stack, on the real servers: the engine and the five services as processes.

Each test gets its own engine schema (the ``pg`` fixture's), service schemas and topics
named after ``unique_id``, and free ports, so it never meets another test's data nor a
``make demo-up`` left running.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services_demo.demo_kit import Demo, Target
from services_demo.run import DemoStack, StackConfig, free_base_port
from tests.conftest import PgTarget

#: Long enough for the crash scenario's kill and restart, short enough for CI.
APPROVAL_TIMEOUT_S = 20.0


def stack_config(pg: PgTarget, kafka_bootstrap: str, unique_id: str, tmp_path: Path) -> StackConfig:
    """A test's stack: its ``pg`` schema for the engine, its names, free ports."""
    return StackConfig(
        dsn=pg.database_dsn,
        bootstrap=kafka_bootstrap,
        namespace=f"t{unique_id}",
        engine_schema=pg.schema,
        base_port=free_base_port(),
        approval_timeout_s=APPROVAL_TIMEOUT_S,
        logs=tmp_path,
    )


@pytest.fixture
async def stack(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str, tmp_path: Path
) -> AsyncIterator[DemoStack]:
    demo_stack = DemoStack(stack_config(pg, kafka_bootstrap, unique_id, tmp_path))
    try:
        await demo_stack.start()
        yield demo_stack
    finally:
        demo_stack.stop()
        await demo_stack.drop_data()


@pytest.fixture
async def demo(stack: DemoStack) -> AsyncIterator[Demo]:
    async with Demo(Target.of_stack(stack), approval_timeout_s=APPROVAL_TIMEOUT_S) as d:
        yield d
