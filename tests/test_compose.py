"""docker-compose.yml describes a stack that can start: the right images, ports that agree
with what each container listens on, settings that point at the services that exist,
and a start order (depends_on and healthchecks) with no gap.

The file is read as YAML (anchors and merge keys resolved); ``docker compose config -q``
also validates it when Docker's compose is installed (it needs no Docker engine).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import typer
import yaml

from saga_engine.cli import app

ROOT = Path(__file__).resolve().parent.parent
INFRA = {"postgres", "kafka", "jaeger"}
JOBS = {"migrate", "topics"}
DEMO = {"orders": 8101, "payments": 8102, "inventory": 8103, "fraud": 8104, "shipping": 8105}
APP = JOBS | {"engine"} | set(DEMO)


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    result: dict[str, dict[str, Any]] = compose["services"]
    return result


def _compose_cmd() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
        if probe.returncode == 0:
            return ["docker", "compose"]
    return None


def test_compose_file_validates() -> None:
    cmd = _compose_cmd()
    if cmd is None:
        pytest.skip("neither docker-compose nor the docker compose plugin is installed")
    proc = subprocess.run(
        [*cmd, "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr


def test_the_stack_is_the_servers_the_jobs_the_engine_and_the_demo(
    services: dict[str, dict[str, Any]],
) -> None:
    assert set(services) == INFRA | APP
    assert services["postgres"]["image"] == "postgres:15"
    assert services["kafka"]["image"].startswith("apache/kafka:4.")
    assert services["jaeger"]["image"].startswith("jaegertracing/jaeger:2.")
    for name in APP:  # one image, built from the checkout, never pulled
        assert services[name]["build"] == ".", name
        assert services[name]["image"] == "saga-engine-demo:latest", name


def _published(service: dict[str, Any]) -> dict[int, int]:
    """Container port -> host port; every port is published on loopback only."""
    ports: dict[int, int] = {}
    for spec in service.get("ports", []):
        address, host, container = str(spec).split(":")
        assert address == "127.0.0.1", spec
        ports[int(container)] = int(host)
    return ports


def test_ports_are_on_loopback_distinct_and_where_each_container_listens(
    services: dict[str, dict[str, Any]],
) -> None:
    published = {name: _published(service) for name, service in services.items()}
    hosts = [port for ports in published.values() for port in ports.values()]
    assert len(hosts) == len(set(hosts))
    assert published["postgres"] == {5432: 54329}
    assert published["kafka"] == {19092: 19092}
    assert published["jaeger"] == {16686: 16686, 4318: 4318}
    admin_port = int(services["engine"]["environment"]["SAGA_ADMIN__PORT"])
    assert published["engine"] == {admin_port: 8100}
    for name, port in DEMO.items():
        command = services[name]["command"]
        assert command[command.index("--port") + 1] == str(port), name
        assert published[name] == {port: port}
        assert services[name]["healthcheck"]["test"][-1] == f"http://127.0.0.1:{port}/health"


def _kafka_listener(kafka: dict[str, Any], name: str) -> str:
    advertised: str = kafka["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    listeners = dict(item.split("://") for item in advertised.split(","))
    return listeners[name]


def test_every_app_container_reaches_the_servers_of_the_stack(
    services: dict[str, dict[str, Any]],
) -> None:
    pg = services["postgres"]["environment"]
    kafka = services["kafka"]
    # The machine's clients use the HOST listener, the containers the INTERNAL one.
    assert _kafka_listener(kafka, "HOST") == "127.0.0.1:19092"
    for name in APP:
        env = services[name]["environment"]
        for key in ("SAGA_PG__DSN", "SAGA_PARTICIPANT__DSN"):
            dsn = urlsplit(env[key])
            assert (dsn.hostname, dsn.port, dsn.path) == ("postgres", 5432, f"/{pg['POSTGRES_DB']}")
            assert (dsn.username, dsn.password) == (pg["POSTGRES_USER"], pg["POSTGRES_PASSWORD"])
        assert env["SAGA_KAFKA__BOOTSTRAP_SERVERS"] == _kafka_listener(kafka, "INTERNAL")
        otlp = urlsplit(env["OTEL_EXPORTER_OTLP_ENDPOINT"])
        assert otlp.hostname == "jaeger"
        assert otlp.port in _published(services["jaeger"])
    schemas = [services[name]["environment"]["SAGA_PARTICIPANT__DB_SCHEMA"] for name in DEMO]
    engine_schema = services["engine"]["environment"]["SAGA_PG__DB_SCHEMA"]
    assert len({*schemas, engine_schema}) == len(DEMO) + 1  # each owns its tables
    assert {services[n]["environment"]["OTEL_SERVICE_NAME"] for n in DEMO} == set(DEMO)


def test_each_container_waits_for_what_it_needs(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        for needed, how in service.get("depends_on", {}).items():
            if how["condition"] == "service_healthy":
                assert "healthcheck" in services[needed], (name, needed)
            else:  # only a one-shot job completes
                assert how["condition"] == "service_completed_successfully", (name, needed)
                assert needed in JOBS, (name, needed)
                assert services[needed]["restart"] == "no", (name, needed)
    assert set(services["migrate"]["depends_on"]) == {"postgres"}
    assert set(services["topics"]["depends_on"]) == {"kafka", "migrate"}
    for name in {"engine"} | set(DEMO):
        assert {"postgres", "kafka", "topics"} <= set(services[name]["depends_on"]), name
    # The engine does not migrate on start-up: the migrate job did it.
    assert "migrate" in services["engine"]["depends_on"]
    assert services["engine"]["environment"]["SAGA_ENGINE__AUTO_MIGRATE"] == "false"
    _start_order(services)  # no cycle


def _start_order(services: dict[str, dict[str, Any]]) -> list[str]:
    order: list[str] = []
    while len(order) < len(services):
        ready = [
            name
            for name, service in services.items()
            if name not in order and set(service.get("depends_on", {})) <= set(order)
        ]
        assert ready, f"depends_on has a cycle among {set(services) - set(order)}"
        order += sorted(ready)
    return order


def test_every_long_running_container_has_a_healthcheck(
    services: dict[str, dict[str, Any]],
) -> None:
    for name in set(services) - JOBS:
        check = services[name]["healthcheck"]
        assert check["test"][0] in {"CMD", "CMD-SHELL"}, name
        assert check["retries"] > 0, name
    pg = services["postgres"]["environment"]
    assert services["postgres"]["healthcheck"]["test"] == [
        "CMD-SHELL",
        f"pg_isready -U {pg['POSTGRES_USER']} -d {pg['POSTGRES_DB']}",
    ]
    internal = _kafka_listener(services["kafka"], "INTERNAL").split(":")[1]
    assert f"localhost:{internal}" in services["kafka"]["healthcheck"]["test"][1]
    assert services["engine"]["healthcheck"]["test"][-2:] == ["services_demo.health", "--engine"]


def test_the_commands_run_what_exists(services: dict[str, dict[str, Any]]) -> None:
    saga_commands = set(typer.main.get_group(app).commands)
    for name in ("migrate", "engine"):
        program, command, *_ = services[name]["command"]
        assert program == "saga", name
        assert command in saga_commands, name
    assert services["engine"]["command"][2:] == ["services_demo.sagas"]
    modules = [services["topics"]["command"][2], "services_demo.sagas", "services_demo.health"]
    python = set(DEMO) - {"shipping"}
    for name in python:
        assert services[name]["command"][0] == "uvicorn", name
        modules.append(services[name]["command"][1].split(":")[0])
    for module in modules:
        assert (ROOT / (module.replace(".", "/") + ".py")).is_file(), module
    # Shipping is the Go service, built into the image by the Dockerfile's first stage.
    program = services["shipping"]["command"][0]
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "COPY services_demo/shipping_go ./services_demo/shipping_go" in dockerfile
    assert f"go build -trimpath -o /out/{program} ." in dockerfile
    assert f"COPY --from=shipping /out/{program} /usr/local/bin/{program}" in dockerfile
    assert (ROOT / "services_demo" / "shipping_go" / "main.go").is_file()
