"""Bearer tokens and roles on every endpoint; refusing to serve unauthenticated in public."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaProducer
from pydantic import SecretStr

from saga_engine import PermanentError, SagaStatus
from saga_engine.admin import (
    AdminConfigError,
    InsecureAdminBinding,
    create_admin_app,
    serve_admin,
)
from saga_engine.settings import AdminSettings, KafkaSettings, Settings
from saga_engine.testing import SagaTestEnv
from saga_engine.worker import DeadLetterTopic
from tests.admin.conftest import (
    OPERATOR,
    OPERATOR_TOKEN,
    READER,
    READER_TOKEN,
    Admin,
    admin_settings,
    bearer,
    make_client,
)
from tests.admin.graph_sagas import Fulfil
from tests.admin.sagas import Noop, Transfer
from tests.conftest import TopicFactory

BODIES: dict[str, dict[str, Any]] = {
    "signal": {"name": "approve", "payload": {"by": "x"}},
    "cancel": {"reason": "auth matrix"},
    "resume": {"reason": "auth matrix"},
    "retry": {"step": "debit", "reason": "auth matrix"},
    "skip": {"step": "debit", "result": {}, "reason": "auth matrix"},
    "force-compensate": {"reason": "auth matrix"},
    "rerun": {"reason": "auth matrix"},
    "start": {"account": "a", "amount": 1},
    "rollout": {"version": 1, "percent": 0, "reason": "auth matrix"},
    "schedules": {"id": "auth-matrix-2", "saga": "noop", "every_s": 60},
    "batch-operations": {"filter": {"saga_type": "noop"}, "action": "cancel", "reason": "auth"},
    "annotate": {"input": {"text": "auth matrix"}},
    "replay": {"reason": "auth matrix"},
}


@pytest.fixture
async def admin_dlq(kafka_bootstrap: str, kafka_topic: TopicFactory) -> AsyncIterator[Admin]:
    """The conftest's app, with a dead-letter topic on the real Kafka holding one record
    (at partition 0, offset 0) whose origin is the topic's inbox."""
    inbox = await kafka_topic("inbox")
    dlq = await kafka_topic("dlq")
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        headers = [("dlq_reason", b"malformed_json"), ("dlq_topic", inbox.encode())]
        await producer.send_and_wait(dlq, b"{oops", key=b"s-1", headers=headers)
    finally:
        await producer.stop()
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=dlq.removesuffix(".dlq"))
    env = SagaTestEnv([Transfer, Noop, Fulfil], settings=admin_settings())
    app = create_admin_app(
        env.engine,
        env.settings,
        parts=env.parts,
        schedules=env.schedules,
        batches=env.batches,
        dead_letters=DeadLetterTopic(kafka),
    )
    async with make_client(app) as http:
        yield Admin(env, app, http)


async def endpoints(admin: Admin) -> list[tuple[str, str, dict[str, Any] | None]]:
    """Every operation in the OpenAPI description, with its path filled in."""
    saga_id = await admin.start(wait_for_approval=True)
    await admin.settle(saga_id)
    graph_id = await admin.env.engine.start(Fulfil, {"order": "o-auth"})  # for /graph
    await admin.env.settle()
    schedule = {"id": "auth-matrix", "saga": "noop", "every_s": 60}
    assert (await admin.http.post("/schedules", json=schedule, headers=OPERATOR)).is_success
    batch = await admin.http.post(
        "/batch-operations", json=BODIES["batch-operations"], headers=OPERATOR
    )
    assert batch.is_success, batch.text
    spec = (await admin.http.get("/openapi.json")).json()
    out: list[tuple[str, str, dict[str, Any] | None]] = []
    for template, operations in spec["paths"].items():
        for method in operations:
            saga = graph_id if template.endswith("/graph") else saga_id
            path = template.replace("{saga_id}", saga).replace("{schedule_id}", "auth-matrix")
            path = path.replace("{operation_id}", batch.json()["id"])
            path = path.replace("{partition}", "0").replace("{offset}", "0")
            name = "annotate" if "/updates/" in template else "kind"  # Transfer's
            name = "transfer" if template.startswith("/saga-types/") else name
            path = path.replace("{name}", name)
            body: dict[str, Any] | None
            if method == "post" and template == "/sagas/{saga}":
                path, body = "/sagas/transfer", BODIES["start"]
            else:
                path = path.replace("{saga}", saga_id).replace("{saga_type}", "transfer")
                body = BODIES.get(path.rsplit("/", 1)[-1]) if method == "post" else None
                body = BODIES["rollout"] if method == "put" else body
            if method == "delete" and template == "/flow/policies/rollout":
                path += "?reason=auth+matrix"
            if template.endswith("/stream"):
                path += "?follow=false"  # the items so far: the saga here stays open
            out.append((method.upper(), path, body))
    # GET /domain-events, the four batch-operations routes, GET /concurrency-keys, rerun,
    # GET /saga-types/{name}/insights, the three dead-letter routes, GET /saga-types/{name}
    # and GET /sagas/{saga_id}/graph; GET /saga-types/{name}/insights/policies; GET
    # /flow/policies, PUT and DELETE /flow/policies/rollout; GET /sagas/{saga_id}/stream;
    # POST /callbacks/{token} and its /fail
    assert len(out) == 47
    return out


#: No bearer token: liveness, and the callback URLs (their signed token is their
#: credential; test_callbacks.py walks their own refusals).
PUBLIC = {"/health", "/callbacks/{token}", "/callbacks/{token}/fail"}


@pytest.mark.integration
async def test_every_endpoint_needs_a_valid_token(admin_dlq: Admin) -> None:
    admin = admin_dlq
    for method, path, body in await endpoints(admin):
        if path in PUBLIC:
            continue
        for headers in [
            {},
            bearer("not-the-token-at-all-000000"),
            {"Authorization": "Basic b3A6cHc="},
        ]:
            response = await admin.http.request(method, path, json=body, headers=headers)
            assert response.status_code == 401, (method, path, headers)
            assert response.headers["www-authenticate"].startswith('Bearer realm="saga-admin"')
            assert response.json()["detail"]
        wrong = await admin.http.request(method, path, json=body, headers=bearer("x" * 40))
        assert 'error="invalid_token"' in wrong.headers["www-authenticate"]


@pytest.mark.integration
async def test_readers_may_read_but_not_act(admin_dlq: Admin) -> None:
    admin = admin_dlq
    for method, path, body in await endpoints(admin):
        if path in PUBLIC:
            continue  # no role applies; the callbacks' token is checked by its route
        response = await admin.http.request(method, path, json=body, headers=READER)
        if method == "GET":
            assert response.status_code == 200, (path, response.text)
        else:
            assert response.status_code == 403, (path, response.text)
            assert response.json() == {
                "detail": "'rita' has the reader role; this action needs an operator"
            }
    # Nothing happened: the reader's actions were refused before reaching the engine.
    listed = (await admin.http.get("/sagas?type=transfer", headers=READER)).json()["items"]
    assert [i["status"] for i in listed] == ["running"]


@pytest.mark.integration
async def test_operators_may_do_everything(admin_dlq: Admin) -> None:
    admin = admin_dlq
    results = {}
    for method, path, body in await endpoints(admin):
        if path in PUBLIC:
            continue
        response = await admin.http.request(method, path, json=body, headers=OPERATOR)
        results[(method, path.rsplit("/", 1)[-1])] = response.status_code
        assert response.status_code not in (401, 403), (path, response.text)
    assert results[("POST", "cancel")] in (200, 409)  # after the signal, maybe completed
    assert results[("POST", "transfer")] == 202


async def test_public_paths_need_no_token(admin: Admin) -> None:
    assert (await admin.http.get("/health")).status_code == 200
    assert (await admin.http.get("/openapi.json")).status_code == 200
    assert (await admin.http.get("/docs")).status_code == 401  # no docs page, and not public


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.10", "admin.example.com", ""])
def test_refuses_to_serve_beyond_loopback_without_tokens(host: str) -> None:
    env = SagaTestEnv([Transfer])
    settings = Settings(admin=AdminSettings(host=host))
    with pytest.raises(InsecureAdminBinding, match="refusing to serve the admin API") as caught:
        create_admin_app(env.engine, settings, parts=env.parts, schedules=env.schedules)
    assert isinstance(caught.value, PermanentError)
    assert "SAGA_ADMIN__OPERATORS" in str(caught.value)


async def test_serve_refuses_too() -> None:
    env = SagaTestEnv([Transfer])
    app = create_admin_app(
        env.engine, Settings(), parts=env.parts, schedules=env.schedules
    )  # loopback: fine
    with pytest.raises(InsecureAdminBinding):
        await serve_admin(app, Settings(admin=AdminSettings(host="0.0.0.0", port=0)))


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "localhost", "[::1]"])
async def test_auth_is_off_on_loopback_without_tokens(host: str) -> None:
    env = SagaTestEnv([Transfer, Noop])
    app = create_admin_app(
        env.engine,
        Settings(admin=AdminSettings(host=host)),
        parts=env.parts,
        schedules=env.schedules,
    )
    async with make_client(app) as http:
        started = await http.post(
            "/sagas/transfer", json={"account": "a", "amount": 1, "wait_for_approval": True}
        )
        assert started.status_code == 202
        saga_id = started.json()["saga_id"]
        await env.settle()
        cancel = await http.post(f"/sagas/{saga_id}/cancel", json={"reason": "local"})
        assert cancel.status_code == 200
        assert cancel.json()["principal"] == "local"
        await env.settle()
        assert (await http.get(f"/sagas/{saga_id}")).json()["status"] == SagaStatus.CANCELLED


async def test_tokens_switch_auth_on_even_on_loopback() -> None:
    env = SagaTestEnv([Transfer])
    app = create_admin_app(
        env.engine, admin_settings(host="127.0.0.1"), parts=env.parts, schedules=env.schedules
    )
    async with make_client(app) as http:
        assert (await http.get("/sagas")).status_code == 401
        assert (await http.get("/sagas", headers=OPERATOR)).status_code == 200


async def test_a_public_binding_with_tokens_is_allowed() -> None:
    env = SagaTestEnv([Transfer])
    app = create_admin_app(
        env.engine, admin_settings(host="0.0.0.0"), parts=env.parts, schedules=env.schedules
    )
    async with make_client(app) as http:
        assert (await http.get("/sagas")).status_code == 401
        assert (await http.get("/sagas", headers=READER)).status_code == 200


@pytest.mark.parametrize(
    ("admin", "says"),
    [
        ({"operators": {"olivia": SecretStr("short-CANARY")}}, "'olivia' is too weak"),
        ({"operators": {"olivia": SecretStr(" " + OPERATOR_TOKEN)}}, "too weak"),
        (
            {
                "operators": {"olivia": SecretStr(OPERATOR_TOKEN)},
                "readers": {"rita": SecretStr(OPERATOR_TOKEN)},
            },
            "also another principal's token",
        ),
        (
            {
                "operators": {"olivia": SecretStr(OPERATOR_TOKEN)},
                "readers": {"olivia": SecretStr(READER_TOKEN)},
            },
            "configured twice",
        ),
        ({"operators": {" ": SecretStr(OPERATOR_TOKEN)}}, "names must be 1 to 100"),
    ],
)
def test_unusable_tokens_are_refused_without_showing_them(admin: dict[str, Any], says: str) -> None:
    env = SagaTestEnv([Transfer])
    with pytest.raises(AdminConfigError, match=says) as caught:
        create_admin_app(
            env.engine,
            Settings(admin=AdminSettings(**admin)),
            parts=env.parts,
            schedules=env.schedules,
        )
    for table in admin.values():
        for secret in table.values():
            assert secret.get_secret_value().strip() not in str(caught.value)


@pytest.mark.parametrize("secret", ["short-CANARY", " CANARY-session-secret-0123456789"])
def test_a_weak_session_secret_is_refused_without_showing_it(secret: str) -> None:
    env = SagaTestEnv([Transfer])
    settings = admin_settings(session_secret=SecretStr(secret))
    with pytest.raises(AdminConfigError, match="SAGA_ADMIN__SESSION_SECRET is too weak") as caught:
        create_admin_app(env.engine, settings, parts=env.parts, schedules=env.schedules)
    assert "CANARY" not in str(caught.value)


async def test_served_by_uvicorn_on_the_running_loop() -> None:
    env = SagaTestEnv([Transfer])
    settings = admin_settings(port=0)
    app = create_admin_app(env.engine, settings, parts=env.parts, schedules=env.schedules)
    server = await serve_admin(app, settings)
    try:
        assert server.port > 0
        # IPPROTO_TCP on the listener, so asyncio sets TCP_NODELAY on each connection.
        assert [s.proto for s in server.server.servers[0].sockets] == [socket.IPPROTO_TCP]
        assert server.url == f"http://127.0.0.1:{server.port}"
        async with httpx.AsyncClient(base_url=server.url) as http:
            assert (await http.get("/health")).json() == {"status": "ok"}
            assert (await http.get("/sagas")).status_code == 401
            started = await http.post(
                "/sagas/transfer", json={"account": "a", "amount": 2}, headers=OPERATOR
            )
            assert started.status_code == 202
            await env.settle()
            got = await http.get(started.json()["status_url"], headers=READER)
            assert got.json()["status"] == "completed"
            assert "server" not in got.headers
        # The port is taken: a second server says so clearly.
        taken = admin_settings(port=server.port)
        with pytest.raises(
            AdminConfigError, match=f"cannot serve the admin API on 127.0.0.1:{server.port}"
        ):
            await serve_admin(app, taken)
    finally:
        await server.stop()
    assert not server.running
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient(base_url=server.url) as http:
            await http.get("/health")
