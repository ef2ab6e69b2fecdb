"""Telemetry setup at the edge: without the instrumentation extra, without an endpoint.
(The W3C headers a Kafka trigger record may carry: tests/internal/telemetry/test_carrier.py.)"""

from __future__ import annotations

import logging
import sys

import httpx
import pytest
from fastapi import FastAPI

from saga_engine.telemetry import Telemetry, configure_from_env


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
