"""Retention with a payload codec (Postgres): what it archives, to ``saga_archive`` or to
files, is sealed whole, because it archives histories it read decoded; it reads back
with the key, and without it fails clearly."""

from __future__ import annotations

import base64
import gzip
import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest
from pydantic import SecretStr

from saga_engine.cli._store import archive_file_histories
from saga_engine.core.history._codec import AesGcmCodec, CodecChain, open_archive
from saga_engine.core.history._events import Event, SagaCompleted, SagaStarted
from saga_engine.core.history._status import SagaStatus
from saga_engine.core.planning._replay import load_history
from saga_engine.kernel._errors import CliError, CodecError
from saga_engine.runner._retention import Retention
from saga_engine.settings import PostgresSettings, RetentionSettings
from saga_engine.store._migrations import migrate
from saga_engine.store._pgstore import PostgresEventStore
from saga_engine.store._store import NewSaga, Projection
from tests.conftest import PgTarget

pytestmark = pytest.mark.integration

CANARY = "canary-archive-0042"
KEY = os.urandom(32)


def chain() -> CodecChain:
    return CodecChain(AesGcmCodec({"k1": KEY}, "k1"))


async def _finished_saga(store: PostgresEventStore, saga_id: str) -> None:
    at = datetime.now(UTC) - timedelta(days=3)
    events: list[Event] = [
        SagaStarted(at=at, saga_type="order", input={"name": CANARY}),
        SagaCompleted(at=at, output={"name": CANARY}),
    ]
    assert await store.create(NewSaga(saga_id, "order", events, Projection(SagaStatus.COMPLETED)))


@pytest.mark.parametrize("mode", ["table", "directory"])
async def test_archives_are_sealed_and_read_back_with_the_key(
    pg: PgTarget, tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await migrate(pg.database_dsn, pg.schema)
    codec = chain()
    store = await PostgresEventStore.connect(
        PostgresSettings(dsn=SecretStr(pg.database_dsn), db_schema=pg.schema), codec=codec
    )
    try:
        await _finished_saga(store, "s-1")
        settings = RetentionSettings(days=1, archive=mode, directory=str(tmp_path))
        report = await Retention(settings, store, codec).run(datetime.now(UTC))
        assert report.deleted == 1
        if mode == "table":
            blob = await store.archived_history("s-1")
            assert blob is not None
            conn = await asyncpg.connect(pg.dsn)
            try:
                raw = await conn.fetchval("SELECT history FROM saga_archive")
            finally:
                await conn.close()
            assert bytes(raw).startswith(b"saga-codec:aes-gcm\n")
            assert CANARY.encode() not in bytes(raw)
            history = load_history(gzip.decompress(open_archive(codec, blob)))
            assert history.events[0].input == {"name": CANARY}  # type: ignore[union-attr]
            with pytest.raises(CodecError, match="no codec configured"):
                open_archive(None, blob)
        else:
            [file] = report.files
            data = Path(file).read_bytes()  # noqa: ASYNC240 - a test, a small file
            assert data.startswith(b"saga-codec:aes-gcm\n")
            assert CANARY.encode() not in data
            # saga replay reads archive files with the key from the environment...
            monkeypatch.setenv(
                "SAGA_CODEC__KEYS", json.dumps({"k1": base64.b64encode(KEY).decode()})
            )
            [history] = archive_file_histories(Path(file))
            assert history.events[-1].output == {"name": CANARY}  # type: ignore[union-attr]
            # ...and without it says why, on one line.
            monkeypatch.delenv("SAGA_CODEC__KEYS")
            with pytest.raises(CliError, match="no codec configured"):
                archive_file_histories(Path(file))
    finally:
        await store.close()
