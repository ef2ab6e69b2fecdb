"""docs/large-payloads.md: its settings block names real settings, and its Python
example files a 4 MB invoice through a worker on the real Postgres and Kafka."""

from __future__ import annotations

from typing import Any

import pytest

from saga_engine import Settings
from tests.conftest import PgTarget
from tests.doc_blocks import ROOT, code_blocks, exec_blocks
from tests.served_worker import real_settings

DOC = ROOT / "docs" / "large-payloads.md"


def test_the_settings_block_names_real_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    [block] = code_blocks(DOC, "sh", under="## Turning it on")
    assigned = {}
    for line in block.code.splitlines():
        name, _, value = line.split("#")[0].strip().partition("=")
        assigned[name] = value
    assert all(name.startswith("SAGA_CODEC__BLOBS__") for name in assigned)
    assigned["SAGA_CODEC__BLOBS__MAC_KEY"] = "bWFjLWtleS1tYWMta2V5LW1hYy1rZXktbWFjLWtleQ=="
    assigned["SAGA_CODEC__BLOBS__STORE"] = "directory"
    for name, value in assigned.items():
        monkeypatch.setenv(name, value)
    blobs = Settings().codec.blobs
    assert blobs.enabled
    for name, value in assigned.items():
        field = name.removeprefix("SAGA_CODEC__BLOBS__").lower()
        shown = getattr(blobs, field)
        shown = shown.get_secret_value() if hasattr(shown, "get_secret_value") else shown
        assert str(shown) == value or float(shown) == float(value), name


@pytest.mark.integration
async def test_the_example_files_a_4_mb_invoice(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    blocks = code_blocks(DOC, "python")
    assert len(blocks) == 1
    namespace: dict[str, Any] = {"__name__": "doc_large_payloads"}
    exec_blocks(blocks, DOC, namespace)
    settings = real_settings(pg, kafka_bootstrap, unique_id, enabled=False)
    filed = await namespace["file_a_large_invoice"](settings)
    assert filed.pdf_chars > settings.kafka.max_message_bytes
