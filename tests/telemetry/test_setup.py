"""Telemetry setup at the edge: without the instrumentation extra, without an endpoint,
and the W3C headers a Kafka trigger record may carry."""

from __future__ import annotations

import logging
import sys

import httpx
import pytest
from fastapi import FastAPI

from saga_engine._telemetry import carrier_from_headers
from saga_engine.telemetry import Telemetry, configure_from_env

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_without_the_instrumentation_extra_nothing_fails(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for module in ("fastapi", "httpx"):
        # None in sys.modules makes the import raise ImportError, as if not installed.
        monkeypatch.setitem(sys.modules, f"opentelemetry.instrumentation.{module}", None)
    caplog.set_level(logging.INFO, "saga_engine.telemetry")
    telemetry = Telemetry()
    app = FastAPI()
    telemetry.instrument_app(app)
    telemetry.instrument_client(httpx.AsyncClient())
    assert "install saga-engine[instrumentation]" in caplog.text


def test_no_endpoint_means_no_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    assert configure_from_env("test") is False
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert configure_from_env("test") is False


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([("traceparent", TRACEPARENT.encode())], {"traceparent": TRACEPARENT}),
        (
            [("traceparent", TRACEPARENT.encode()), ("tracestate", b"k=v")],
            {"traceparent": TRACEPARENT, "tracestate": "k=v"},
        ),
        ([("traceparent", TRACEPARENT.upper().encode())], {}),  # W3C wants lower case
        ([("traceparent", b"00-nonsense")], {}),
        ([("traceparent", b"\xff\xfe")], {}),
        ([("traceparent", None), ("other", b"x")], {}),
        ([], {}),
    ],
)
def test_trace_headers_of_a_record_are_checked(
    headers: list[tuple[str, bytes | None]], expected: dict[str, str]
) -> None:
    assert carrier_from_headers(headers) == expected
