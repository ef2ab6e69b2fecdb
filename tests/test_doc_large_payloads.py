"""docs/large-payloads.md: its settings block names real settings, and its Python
examples file a 4 MB invoice through a worker, and send one to a participant and back
by reference, on the real Postgres and Kafka."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import SecretStr

from saga_engine import Settings
from saga_engine.settings import ParticipantSettings
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
    key = "bWFjLWtleS1tYWMta2V5LW1hYy1rZXktbWFjLWtleQ=="
    assert "<base64" in assigned["SAGA_CODEC__BLOBS__MAC_KEYS"]
    assigned["SAGA_CODEC__BLOBS__MAC_KEYS"] = json.dumps({"mac-2026": key})
    assigned["SAGA_CODEC__BLOBS__STORE"] = "directory"
    for name, value in assigned.items():
        monkeypatch.setenv(name, value)
    blobs = Settings().codec.blobs
    assert blobs.enabled
    assert blobs.mac_key_texts() == {"mac-2026": key}
    assert blobs.current_mac_key_id == "mac-2026"
    for name, value in assigned.items():
        field = name.removeprefix("SAGA_CODEC__BLOBS__").lower()
        if field == "mac_keys":
            continue
        shown = getattr(blobs, field)
        assert str(shown) == value or float(shown) == float(value), name


@pytest.mark.integration
async def test_the_example_files_a_4_mb_invoice(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    blocks = code_blocks(DOC, "python")
    assert len(blocks) == 2
    namespace: dict[str, Any] = {"__name__": "doc_large_payloads"}
    exec_blocks(blocks, DOC, namespace)
    settings = real_settings(pg, kafka_bootstrap, unique_id, enabled=False)
    filed = await namespace["file_a_large_invoice"](settings)
    assert filed.pdf_chars > settings.kafka.max_message_bytes
    participant = ParticipantSettings(dsn=SecretStr(pg.database_dsn), db_schema=f"{pg.schema}_p")
    settings = settings.model_copy(update={"participant": participant})
    archived = await namespace["archive_a_large_invoice"](settings)
    assert archived.pdf.startswith("ARCHIVED")
    assert len(archived.pdf) > settings.kafka.max_message_bytes
