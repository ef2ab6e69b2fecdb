"""The admin API on the real engine over in-memory adapters, called through httpx."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from pydantic import SecretStr

from saga_engine import SagaStatus
from saga_engine.admin import create_admin_app
from saga_engine.settings import AdminSettings, Settings
from saga_engine.testing import SagaRun, SagaTestEnv
from tests.admin.sagas import Noop, Transfer

OPERATOR_TOKEN = "operator-token-0123456789-abcdef"
READER_TOKEN = "reader-token-0123456789-abcdefgh"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


OPERATOR = bearer(OPERATOR_TOKEN)
READER = bearer(READER_TOKEN)


def admin_settings(**overrides: Any) -> Settings:
    admin: dict[str, Any] = {
        "operators": {"olivia": SecretStr(OPERATOR_TOKEN)},
        "readers": {"rita": SecretStr(READER_TOKEN)},
    }
    admin.update(overrides)
    return Settings(admin=AdminSettings(**admin))


@dataclass
class Admin:
    env: SagaTestEnv
    app: FastAPI
    http: httpx.AsyncClient

    async def settle(self, saga_id: str) -> SagaStatus:
        """Lets the scripted participants answer and virtual time pass until it settles."""
        return await self.env.run_until_settled(SagaRun(self.env, saga_id, Transfer))

    async def start(self, **payload: Any) -> str:
        body = {"account": "acc-1", "amount": 10, **payload}
        response = await self.http.post("/sagas/transfer", json=body, headers=OPERATOR)
        assert response.status_code == 202, response.text
        saga_id: str = response.json()["saga_id"]
        return saga_id


def make_client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://admin")


@pytest.fixture
async def admin() -> AsyncIterator[Admin]:
    env = SagaTestEnv([Transfer, Noop], settings=admin_settings())
    app = create_admin_app(
        env.engine, env.settings, parts=env.parts, schedules=env.schedules, batches=env.batches
    )
    async with make_client(app) as http:
        yield Admin(env, app, http)
