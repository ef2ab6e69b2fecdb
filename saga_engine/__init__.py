"""saga-engine: durable sagas for microservice transactions.

Sagas are Python classes. Their history is event-sourced into Postgres, their steps
travel as Kafka commands and replies, and after a crash they are recovered by
deterministic replay.

This module holds what defining a saga needs (``Saga``, ``SagaContext``, ``Signal``,
``EventSource``, ``RetryPolicy``, the errors, the settings, the payload codecs) and loads nothing else: ``Engine`` and ``run``
are imported on first use, so ``import saga_engine`` loads neither the engine nor
OpenTelemetry, asyncpg, aiokafka or FastAPI.

Public modules besides this one: ``saga_engine.events`` (the history event types),
``saga_engine.store`` (event-store adapters and migrations), ``saga_engine.testing``
(the in-memory testing kit), ``saga_engine.participant`` (the participant kit),
``saga_engine.client`` (start, signal and cancel sagas through Kafka),
``saga_engine.worker`` (the engine process), ``saga_engine.triggers`` (Kafka triggers),
``saga_engine.replay`` (replay checks), ``saga_engine.telemetry`` (OpenTelemetry setup),
``saga_engine.settings``, ``saga_engine.protocol`` (the wire format on Kafka),
``saga_engine.admin`` (the admin HTTP API and web page) and ``saga_engine.cli`` (the
``saga`` command). Every other module is private (``_``-prefixed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from saga_engine.core.authoring._context import Callback, HttpRequest, SagaContext, Winner
from saga_engine.core.authoring._definition import Saga, SagaRegistry, Signal
from saga_engine.core.authoring._domain_events import EventSource
from saga_engine.core.authoring._update import query, update
from saga_engine.core.history._codec import (
    AesGcmCodec,
    CodecChain,
    GzipCodec,
    NoopCodec,
    PayloadCodec,
    ZstdCodec,
)
from saga_engine.core.history._concurrency_keys import ConcurrencyLimit
from saga_engine.core.history._cost import Cost
from saga_engine.core.history._decision import OutboundCommand, saga_id_for
from saga_engine.core.history._policy import RetryPolicy
from saga_engine.core.history._status import TRANSITIONS, SagaStatus
from saga_engine.kernel._errors import (
    CallbackConflict,
    CallbackFailed,
    CallbackGone,
    CallbackTimeout,
    CallbackTokenInvalid,
    CodecError,
    CodecFailure,
    ConcurrencyError,
    DefinitionError,
    DependencyUnavailable,
    EventTimeout,
    IdempotencyConflict,
    InvalidPayload,
    InvalidTransition,
    KafkaUnavailable,
    NewerEventError,
    NewerVersionError,
    NondeterminismError,
    OutcomeUnknown,
    PastPivot,
    PayloadTooLarge,
    PermanentError,
    QueryFailed,
    ResultTimeout,
    SagaError,
    SagaNotFound,
    SagaTimeout,
    SagaUnsuccessful,
    SerializationError,
    SignalTimeout,
    StepFailed,
    StepTimedOut,
    TransientError,
    UnknownSagaType,
    UnknownSagaVersion,
    UnstorableValue,
    UpdateFailed,
    UpdateRefused,
)
from saga_engine.kernel._settings import (
    CallbackSettings,
    CodecSettings,
    EngineSettings,
    KafkaSettings,
    PostgresSettings,
    Settings,
)
from saga_engine.kernel._version import __version__ as __version__

__all__ = [
    "TRANSITIONS",
    "AesGcmCodec",
    "Callback",
    "CallbackConflict",
    "CallbackFailed",
    "CallbackGone",
    "CallbackSettings",
    "CallbackTimeout",
    "CallbackTokenInvalid",
    "CodecChain",
    "CodecError",
    "CodecFailure",
    "CodecSettings",
    "ConcurrencyError",
    "ConcurrencyLimit",
    "Cost",
    "DefinitionError",
    "DependencyUnavailable",
    "Engine",
    "EngineSettings",
    "EventSource",
    "EventTimeout",
    "GzipCodec",
    "HttpRequest",
    "IdempotencyConflict",
    "InvalidPayload",
    "InvalidTransition",
    "KafkaSettings",
    "KafkaUnavailable",
    "NewerEventError",
    "NewerVersionError",
    "NondeterminismError",
    "NoopCodec",
    "OutboundCommand",
    "OutcomeUnknown",
    "PastPivot",
    "PayloadCodec",
    "PayloadTooLarge",
    "PermanentError",
    "PostgresSettings",
    "QueryFailed",
    "ResultTimeout",
    "RetryPolicy",
    "Saga",
    "SagaContext",
    "SagaError",
    "SagaNotFound",
    "SagaRegistry",
    "SagaStatus",
    "SagaTimeout",
    "SagaUnsuccessful",
    "SerializationError",
    "Settings",
    "Signal",
    "SignalTimeout",
    "StepFailed",
    "StepTimedOut",
    "TransientError",
    "UnknownSagaType",
    "UnknownSagaVersion",
    "UnstorableValue",
    "UpdateFailed",
    "UpdateRefused",
    "Winner",
    "ZstdCodec",
    "query",
    "run",
    "saga_id_for",
    "update",
]

if TYPE_CHECKING:
    from saga_engine.kernel._mainloop import run
    from saga_engine.runner._engine import Engine

#: Loaded on first use (PEP 562), so that defining a saga does not load the engine.
_LAZY = {"Engine": "saga_engine.runner._engine", "run": "saga_engine.kernel._mainloop"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
