"""Pins the public names: removing or renaming one is a breaking change."""

from __future__ import annotations

import saga_engine
import saga_engine.events
import saga_engine.participant
import saga_engine.replay
import saga_engine.store
import saga_engine.telemetry
import saga_engine.testing

PUBLIC = {
    "TRANSITIONS", "ConcurrencyError", "DefinitionError", "Engine", "EngineSettings", "HttpRequest",
    "IdempotencyConflict", "InvalidPayload", "InvalidTransition", "Signal", "UnstorableValue", "KafkaSettings", "NondeterminismError", "OutboundCommand",
    "PayloadTooLarge", "PermanentError", "PostgresSettings", "RetryPolicy", "Saga",
    "ResultTimeout", "SagaContext", "SagaError", "SagaNotFound", "SagaRegistry", "SagaStatus",
    "SagaUnsuccessful",
    "SerializationError", "Settings", "SignalTimeout", "StepFailed", "StepTimedOut",
    "TransientError", "UnknownSagaType", "run", "saga_id_for",
}  # fmt: skip


def test_top_level_names_are_pinned() -> None:
    assert set(saga_engine.__all__) == PUBLIC
    for name in PUBLIC:
        assert getattr(saga_engine, name) is not None


def test_subpackages_expose_their_documented_names() -> None:
    assert {"SagaTestEnv", "ScriptedParticipant", "SagaRun", "InMemoryCommandBus"} <= set(
        saga_engine.testing.__all__
    )
    assert {"EventStore", "InMemoryEventStore", "PostgresEventStore", "migrate"} <= set(
        saga_engine.store.__all__
    )
    assert {"replay", "load_history", "export_history", "load_sagas"} <= set(
        saga_engine.replay.__all__
    )
    assert set(saga_engine.participant.__all__) == {
        "HandlerResult",
        "Participant",
        "Rejected",
        "Retryable",
        "Transaction",
    }
    assert len(saga_engine.events.EVENT_TYPES) == 24
    assert set(saga_engine.telemetry.__all__) == {
        "Telemetry",
        "configure_from_env",
        "default_telemetry",
        "instrument_asyncpg",
    }


def test_error_hierarchy_tells_how_to_react() -> None:
    e = saga_engine
    assert issubclass(e.ConcurrencyError, e.TransientError)
    assert issubclass(e.StepTimedOut, e.StepFailed)
    for permanent in (e.DefinitionError, e.NondeterminismError, e.SagaNotFound,
                      e.InvalidTransition, e.SerializationError, e.PayloadTooLarge,
                      e.InvalidPayload, e.UnstorableValue, e.IdempotencyConflict):  # fmt: skip
        assert issubclass(permanent, e.PermanentError)
    for cls in (e.TransientError, e.StepFailed, e.PermanentError):
        assert issubclass(cls, e.SagaError)


def test_core_modules_do_no_io() -> None:
    import ast
    from pathlib import Path

    core = [
        "_context", "_decision", "_definition", "_events", "_loop", "_operations",
        "_policy", "_runtime", "_serde", "_status", "_store", "_memstore", "_replay",
    ]  # fmt: skip
    root = Path(saga_engine.__file__).parent
    for module in core:
        tree = ast.parse((root / f"{module}.py").read_text())
        imported = {
            alias.name.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
        } | {
            (node.module or "").split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
        }
        assert not imported & {"asyncpg", "aiokafka", "httpx", "socket"}, module
