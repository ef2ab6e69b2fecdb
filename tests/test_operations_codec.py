"""docs/operations.md, "Encrypting payloads": its Python example runs as written, and its
environment variables configure the codec they describe."""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from saga_engine import AesGcmCodec, CodecChain, Settings
from tests.doc_blocks import ROOT, code_blocks, exec_blocks

OPERATIONS = ROOT / "docs" / "operations.md"
HEADING = "## Encrypting payloads"


def test_the_python_example_runs() -> None:
    blocks = code_blocks(OPERATIONS, "python", under=HEADING)
    assert len(blocks) == 1
    namespace: dict[str, Any] = {"__name__": "operations_codec_example"}
    exec_blocks(blocks, OPERATIONS, namespace)
    assert isinstance(namespace["rotated"], CodecChain)


def test_the_environment_example_configures_the_codec(monkeypatch: pytest.MonkeyPatch) -> None:
    [block] = code_blocks(OPERATIONS, "bash", under=HEADING)
    exported = 0
    for line in block.code.splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["export"]:
            name, _, value = words[1].partition("=")
            monkeypatch.setenv(name, value)
            exported += 1
    assert exported == 4
    chain = CodecChain.from_settings(Settings().codec)
    assert chain is not None
    assert chain.name == "zstd,aes-gcm"
    assert AesGcmCodec.key_id_of(chain.encode(b"{}")) == "key-2025"
    assert chain.decode(chain.encode(b'{"x": 1}' * 500)) == b'{"x": 1}' * 500
