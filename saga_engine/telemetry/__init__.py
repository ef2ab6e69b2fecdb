"""OpenTelemetry for sagas: one trace per saga across the engine and its participants.

``configure_from_env()`` at process start sets OTLP/HTTP exporters from the standard
``OTEL_*`` variables and the asyncpg instrumentation; ``Telemetry`` holds the providers
(the global ones by default) for an ``Engine``, a ``SagaWorker`` or a ``Participant``, and
instruments FastAPI apps and httpx clients with the contrib instrumentations.

The layer: OpenTelemetry setup and metrics, the engine's saga and step spans, health
and the consumer-group watch. May import ``saga_engine.core`` and ``saga_engine.kernel``.
"""

from saga_engine.telemetry._telemetry import (
    Telemetry,
    configure_from_env,
    default_telemetry,
    instrument_asyncpg,
)

__all__ = ["Telemetry", "configure_from_env", "default_telemetry", "instrument_asyncpg"]
