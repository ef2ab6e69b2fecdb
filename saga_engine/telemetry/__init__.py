"""OpenTelemetry for sagas: one trace per saga across the engine and its participants.

``configure_from_env()`` at process start sets OTLP/HTTP exporters from the standard
``OTEL_*`` variables and the asyncpg instrumentation; ``Telemetry`` holds the providers
(the global ones by default) for an ``Engine``, a ``SagaWorker`` or a ``Participant``, and
instruments FastAPI apps and httpx clients with the contrib instrumentations.
"""

from saga_engine.telemetry._telemetry import (
    Telemetry,
    configure_from_env,
    default_telemetry,
    instrument_asyncpg,
)

__all__ = ["Telemetry", "configure_from_env", "default_telemetry", "instrument_asyncpg"]
