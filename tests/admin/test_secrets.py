"""Canary secrets in settings never leave the process: not in logs, responses or metrics."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from saga_engine import SagaStatus
from saga_engine.admin import AdminConfigError, InsecureAdminBinding, create_admin_app, serve_admin
from saga_engine.settings import AdminSettings, PostgresSettings, Settings
from saga_engine.testing import SagaRun, SagaTestEnv
from tests.admin.sagas import Credit, Refund, Transfer

CANARY_OPERATOR = "CANARY-operator-token-5f0c9e27a1"
CANARY_READER = "CANARY-reader-token-8b3d4e61f2"
CANARY_PASSWORD = "CANARY-pg-password-c4a7e90d"
CANARIES = (CANARY_OPERATOR, CANARY_READER, CANARY_PASSWORD, "CANARY")


def canary_settings(**admin: Any) -> Settings:
    return Settings(
        pg=PostgresSettings(dsn=SecretStr(f"postgresql://saga:{CANARY_PASSWORD}@db:5432/saga")),
        admin=AdminSettings(
            operators={"olivia": SecretStr(CANARY_OPERATOR)},
            readers={"rita": SecretStr(CANARY_READER)},
            **admin,
        ),
    )


def assert_clean(text: str, where: str) -> None:
    for canary in CANARIES:
        assert canary not in text, f"a secret leaked into {where}"


async def exercise(http: httpx.AsyncClient, env: SagaTestEnv) -> list[httpx.Response]:
    """Every endpoint, with good, bad and missing tokens, happy and failing."""
    op = {"Authorization": f"Bearer {CANARY_OPERATOR}"}
    reader = {"Authorization": f"Bearer {CANARY_READER}"}
    near = {"Authorization": f"Bearer {CANARY_OPERATOR[:-1]}x"}
    out: list[httpx.Response] = []

    async def call(method: str, path: str, **kw: Any) -> httpx.Response:
        response = await http.request(method, path, **kw)
        out.append(response)
        return response

    env.participant("payee").on(Credit, reject="account closed")
    env.participant("ledger").on(Refund, reject="ledger locked", times=2)
    started = await call("POST", "/sagas/transfer", json={"account": "a", "amount": 1}, headers=op)
    saga_id = started.json()["saga_id"]
    assert (
        await env.run_until_settled(SagaRun(env, saga_id, Transfer))
        == SagaStatus.COMPENSATION_STUCK
    )
    for headers in (op, reader, near, {}, {"Authorization": CANARY_OPERATOR}):
        await call("GET", "/sagas", headers=headers)
        await call("GET", f"/sagas/{saga_id}", headers=headers)
        await call("GET", f"/sagas/{saga_id}/history?download=1", headers=headers)
        await call("GET", "/metrics", headers=headers)
        await call("GET", "/metrics", headers={**headers, "Accept": "text/plain"})
        await call("GET", "/saga-types", headers=headers)
        await call("POST", f"/sagas/{saga_id}/signal", json={"name": "n"}, headers=headers)
        await call("POST", f"/sagas/{saga_id}/cancel", json={"reason": "r"}, headers=headers)
        await call("POST", f"/sagas/{saga_id}/resume", json={"reason": "r"}, headers=headers)
        await call("POST", "/sagas/transfer", json={"amount": "x"}, headers=headers)
        await call("POST", "/sagas/transfer", content=b"{", headers=headers)
        await call("GET", "/sagas?limit=0&cursor=zz", headers=headers)
        await call("GET", "/sagas/missing", headers=headers)
        await call("DELETE", "/sagas/missing", headers=headers)
    await call("GET", "/openapi.json")
    await call("GET", "/health")
    return out


async def test_canary_secrets_never_leave_the_process(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.DEBUG)
    settings = canary_settings(port=0)
    env = SagaTestEnv([Transfer], settings=settings)
    app = create_admin_app(env.engine, settings, parts=env.parts, schedules=env.schedules)
    server = await serve_admin(app, settings)  # through uvicorn, with its logging
    try:
        async with httpx.AsyncClient(base_url=server.url) as http:
            responses = await exercise(http, env)

            async def broken(*_: Any, **__: Any) -> Any:
                raise RuntimeError(f"a bug that mentions {settings.admin!r} and {settings.pg!r}")

            monkeypatch.setattr(env.store, "list_sagas", broken)
            failed = await http.get("/sagas", headers={"Authorization": f"Bearer {CANARY_READER}"})
            assert failed.status_code == 500
            responses.append(failed)
    finally:
        await server.stop()

    assert {r.status_code for r in responses} >= {200, 202, 400, 401, 403, 404, 405, 409, 422, 500}
    for response in responses:
        where = f"{response.request.method} {response.request.url.path} ({response.status_code})"
        assert_clean(response.text, where)
        assert_clean(str(response.headers), where + " headers")
    metrics = next(
        r for r in responses if r.request.url.path == "/metrics" and r.status_code == 200
    )
    assert "saga_open_sagas" in metrics.text or "open_sagas" in metrics.text
    spec = next(r for r in responses if r.request.url.path == "/openapi.json")
    assert spec.status_code == 200
    assert_clean(spec.text, "/openapi.json")
    assert "admin API listening" in caplog.text  # the logs were captured...
    assert "a bug that mentions" in caplog.text  # ...the 500 among them
    assert_clean(caplog.text, "the logs")


def test_configuration_errors_do_not_show_secrets() -> None:
    env = SagaTestEnv([Transfer])
    weak = Settings(
        pg=PostgresSettings(dsn=SecretStr(f"postgresql://saga:{CANARY_PASSWORD}@db/saga")),
        admin=AdminSettings(operators={"olivia": SecretStr("CANARY-short")}),
    )
    with pytest.raises(AdminConfigError) as caught:
        create_admin_app(env.engine, weak, parts=env.parts, schedules=env.schedules)
    assert_clean(str(caught.value), "the weak-token error")
    public = Settings(
        pg=PostgresSettings(dsn=SecretStr(f"postgresql://saga:{CANARY_PASSWORD}@db/saga")),
        admin=AdminSettings(host="0.0.0.0"),
    )
    with pytest.raises(InsecureAdminBinding) as refused:
        create_admin_app(env.engine, public, parts=env.parts, schedules=env.schedules)
    assert_clean(str(refused.value), "the refusal")
    assert_clean(repr(canary_settings()), "repr(settings)")
