"""The admin API over encrypted histories (Postgres): decoded when the process holds the
key; shown as encrypted, with the key id, when it does not, never a 500; an action on a
saga it cannot read is refused with the reason (409)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from pydantic import SecretStr

from saga_engine import AesGcmCodec, CodecChain, SagaStatus
from saga_engine.admin import create_admin_app
from saga_engine.settings import PostgresSettings
from saga_engine.store import PostgresEventStore, migrate
from saga_engine.testing import SagaTestEnv
from tests.admin.conftest import OPERATOR, READER, admin_settings, make_client
from tests.admin.sagas import Transfer
from tests.conftest import PgTarget

pytestmark = pytest.mark.integration

SECRET_ACCOUNT = "acct-canary-5521"
KEY = os.urandom(32)

Opener = Callable[[CodecChain | None], Awaitable[PostgresEventStore]]


@pytest.fixture
async def open_store(pg: PgTarget) -> AsyncIterator[Opener]:
    await migrate(pg.database_dsn, pg.schema)
    opened: list[PostgresEventStore] = []

    async def connect(codec: CodecChain | None) -> PostgresEventStore:
        store = await PostgresEventStore.connect(
            PostgresSettings(dsn=SecretStr(pg.database_dsn), db_schema=pg.schema), codec=codec
        )
        opened.append(store)
        return store

    yield connect
    for store in opened:
        await store.close()


async def test_admin_decodes_with_the_key_and_shows_encrypted_without(
    open_store: Opener,
) -> None:
    settings = admin_settings()
    codec = CodecChain(AesGcmCodec({"key-2024": KEY}, "key-2024"))
    holder = SagaTestEnv([Transfer], settings=settings, store=await open_store(codec))
    saga_id = await holder.engine.start(
        Transfer, {"account": SECRET_ACCOUNT, "amount": 5, "wait_for_approval": True}
    )
    await holder.settle()  # debited and credited, waiting for the approval signal

    async with make_client(
        create_admin_app(holder.engine, settings, parts=holder.parts, schedules=holder.schedules)
    ) as http:
        detail = await http.get(f"/sagas/{saga_id}", headers=READER)
        assert detail.status_code == 200, detail.text
        assert detail.json()["input"]["account"] == SECRET_ACCOUNT

    # Another process, configured without the key (none at all here).
    blind = SagaTestEnv([Transfer], settings=settings, store=await open_store(None))
    async with make_client(
        create_admin_app(blind.engine, settings, parts=blind.parts, schedules=blind.schedules)
    ) as http:
        detail = await http.get(f"/sagas/{saga_id}", headers=READER)
        assert detail.status_code == 200, detail.text
        body = detail.json()
        assert SECRET_ACCOUNT not in detail.text
        assert body["input"] == {
            "$encrypted": {"failure": "not_configured", "codec": "aes-gcm", "key_id": "key-2024"}
        }
        assert body["status"] == SagaStatus.RUNNING.value
        history = await http.get(f"/sagas/{saga_id}/history", headers=READER)
        assert history.status_code == 200, history.text
        assert '"key_id":"key-2024"' in history.text.replace(" ", "")
        assert SECRET_ACCOUNT not in history.text
        page = await http.get(f"/ui/sagas/{saga_id}", headers=READER)
        assert page.status_code == 200
        assert SECRET_ACCOUNT not in page.text
        # Acting on it needs its history decoded: refused with the reason, not a 500.
        cancel = await http.post(
            f"/sagas/{saga_id}/cancel", json={"reason": "test"}, headers=OPERATOR
        )
        assert cancel.status_code == 409, cancel.text
        assert "no codec configured" in cancel.text
