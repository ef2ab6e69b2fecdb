"""proto/asyncapi.json: generated from the wire models (no drift) and valid AsyncAPI 3.0
for @asyncapi/parser, the AsyncAPI initiative's own parser (installed with npm from the
lock file in scripts/asyncapi on first use)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "scripts" / "asyncapi"
DOCUMENT = ROOT / "proto" / "asyncapi.json"


def _generator() -> ModuleType:
    sys.path.insert(0, str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location(
        "gen_asyncapi", ROOT / "scripts" / "gen_asyncapi.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen_asyncapi = _generator()


def test_the_committed_document_matches_the_models() -> None:
    assert DOCUMENT.read_text(encoding="utf-8") == gen_asyncapi.rendered(), (
        "proto/asyncapi.json is out of date: run `python scripts/gen_asyncapi.py` and commit it"
    )


@pytest.fixture(scope="module")
def parser() -> Path:
    npm = shutil.which("npm")
    assert npm, "npm is needed to validate proto/asyncapi.json (Node.js is on the machine list)"
    if not (TOOL / "node_modules" / "@asyncapi" / "parser").is_dir():
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=TOOL,
            check=True,
            timeout=600,
        )
    return TOOL / "validate.mjs"


def _validate(script: Path, document: Path) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        ["node", str(script), str(document)], capture_output=True, text=True, timeout=120
    )
    return done.returncode, json.loads(done.stdout)


def test_the_document_is_valid_asyncapi_3(parser: Path) -> None:
    code, result = _validate(parser, DOCUMENT)
    assert result == {"errors": [], "warnings": [], "parsed": True}
    assert code == 0


def test_the_validator_refuses_a_broken_reference(parser: Path, tmp_path: Path) -> None:
    broken = tmp_path / "asyncapi.json"
    text = DOCUMENT.read_text(encoding="utf-8")
    broken.write_text(text.replace('"#/components/schemas/Reply"', '"#/components/schemas/Nope"'))
    code, result = _validate(parser, broken)
    assert code == 1
    assert [e["code"] for e in result["errors"]] == ["invalid-ref"]


def test_every_message_type_and_header_is_in_the_document() -> None:
    document = json.loads(DOCUMENT.read_text(encoding="utf-8"))
    from saga_engine.protocol import HEADERS, MessageType

    names = {m["name"] for m in document["components"]["messages"].values()}
    assert {t.value for t in MessageType} <= names
    headers = document["components"]["schemas"]["Headers"]["properties"]
    assert set(HEADERS.values()) <= set(headers)
