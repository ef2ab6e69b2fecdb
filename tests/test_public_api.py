"""Pins the public names: removing or renaming one is a breaking change.

The rule (docs/architecture.md, "Public names"): all code lives in ``_``-prefixed
modules; a public module only re-exports names from private ones, lists them in
``__all__`` and has a docstring saying what it is for. The front doors are pinned here,
and every public module is checked to follow the rule.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import saga_engine
import saga_engine.events

PUBLIC = {
    "TRANSITIONS",
    "ConcurrencyError",
    "DefinitionError",
    "DependencyUnavailable",
    "Engine",
    "EngineSettings",
    "HttpRequest",
    "IdempotencyConflict",
    "InvalidPayload",
    "InvalidTransition",
    "KafkaUnavailable",
    "Signal",
    "UnstorableValue",
    "KafkaSettings",
    "NondeterminismError",
    "OutboundCommand",
    "PayloadTooLarge",
    "PermanentError",
    "PostgresSettings",
    "RetryPolicy",
    "Saga",
    "ResultTimeout",
    "SagaContext",
    "SagaError",
    "SagaNotFound",
    "SagaRegistry",
    "SagaStatus",
    "SagaUnsuccessful",
    "SerializationError",
    "Settings",
    "SignalTimeout",
    "StepFailed",
    "StepTimedOut",
    "TransientError",
    "UnknownSagaType",
    "run",
    "saga_id_for",
    "NewerVersionError",
    "NewerEventError",
    "UnknownSagaVersion",
    # Per-key concurrency (issue 26 section 5).
    "ConcurrencyLimit",
    # Step costs (issue 40 section 2).
    "Cost",
    # Pivot steps (issue 26 section 6).
    "PastPivot",
    # Payload codecs (issue 14 section 4).
    "AesGcmCodec",
    "CodecChain",
    "CodecError",
    "CodecFailure",
    "CodecSettings",
    "GzipCodec",
    "NoopCodec",
    "PayloadCodec",
    "ZstdCodec",
    # Waiting for other services' domain events (issue 26 section 1).
    "EventSource",
    "EventTimeout",
    # Updates and queries (issue 26 section 2).
    "update",
    "query",
    "UpdateRefused",
    "UpdateFailed",
    "QueryFailed",
    # An answer that says what happened (issue 39 section 8.4).
    "OutcomeUnknown",
    # Races and timeout scopes (issue 41 section 1).
    "SagaTimeout",
    "Winner",
    # Callbacks: a webhook completes a wait (issue 41 section 2).
    "Callback",
    "CallbackConflict",
    "CallbackFailed",
    "CallbackGone",
    "CallbackSettings",
    "CallbackTimeout",
    "CallbackTokenInvalid",
}

#: Every public module but the root, and exactly what it exports.
FRONT_DOORS: dict[str, set[str]] = {
    "saga_engine.events": set(saga_engine.events.__all__),  # the event types: pinned below
    "saga_engine.store": {
        "Append",
        "EventStore",
        "GroupCommitConfig",
        "InMemoryEventStore",
        "LearnedCost",
        "LoadedSaga",
        "MigrationBusy",
        "MigrationError",
        "NewSaga",
        "PostgresEventStore",
        "Projection",
        "SagaFilter",
        "SagaRecord",
        "StoreUnavailable",
        "StoredEvent",
        "migrate",
        "migration_sql",
        "shipped_migrations",
    },
    "saga_engine.testing": {"InMemoryCommandBus", "SagaRun", "SagaTestEnv", "ScriptedParticipant"},
    "saga_engine.graph": {"Graph", "GraphNode", "GraphSaga", "each", "http", "node", "step"},
    "saga_engine.participant": {
        "BatchCommand",
        "CommandBatch",
        "HandlerResult",
        "Participant",
        "Rejected",
        "Retryable",
        "Transaction",
    },
    "saga_engine.client": {"SagaClient", "ProgressItem", "CallbackAnswer"},
    "saga_engine.conformance": {"CASE_NAMES", "CaseResult", "Report", "run_suite"},
    "saga_engine.worker": {"DeadLetterTopic", "SagaWorker"},
    "saga_engine.replay": {
        "FORMAT",
        "HistoryExport",
        "ReplayResult",
        "export_history",
        "load_history",
        "load_event_sources",
        "load_sagas",
        "load_triggers",
        "replay",
    },
    "saga_engine.telemetry": {
        "Telemetry",
        "configure_from_env",
        "default_telemetry",
        "instrument_asyncpg",
    },
    "saga_engine.settings": {
        "AdminSettings",
        "CallbackSettings",
        "CodecSettings",
        "EngineSettings",
        "HttpSettings",
        "KafkaSettings",
        "ParticipantSettings",
        "PostgresSettings",
        "RetentionSettings",
        "ScheduleSettings",
        "Settings",
        "FlowLimit",
        "FlowPolicy",
        "LimitsSettings",
        "BatchSettings",
        "BlobSettings",
    },
    "saga_engine.schedules": {"CatchUp", "Overlap", "Schedule", "ScheduleState"},
    "saga_engine.triggers": {"KafkaTrigger"},
    "saga_engine.cli": {"AdminCallError", "CliError", "app", "main"},
    "saga_engine.admin": {
        "AdminConfigError",
        "AdminServer",
        "DeadLetter",
        "DeadLetterReader",
        "InsecureAdminBinding",
        "Principal",
        "Role",
        "StartSaga",
        "create_admin_app",
        "serve_admin",
    },
    "saga_engine.protocol": {
        "BODY_MODELS",
        "CE_SPECVERSION",
        "CODEC_HEADER",
        "CODEC_MARKER",
        "HEADERS",
        "REQUIRED_HEADERS",
        "SCHEMA_VERSION",
        "STEP_PROGRESS_MAX_BYTES",
        "CancelBody",
        "Envelope",
        "Headers",
        "MessageType",
        "PoisonMessage",
        "PoisonReason",
        "ReloadBody",
        "ReplyBody",
        "SignalBody",
        "StartBody",
        "StepProgressRecord",
        "Topics",
        "UndoBody",
        "command_id_for",
        "decode",
        "encode",
        "key_hash",
        "partition_for",
        "saga_id_for",
    },
}

#: The layers (docs/architecture.md): packages that say what they hold and may import, and
#: export nothing. Users never import from them.
LAYERS = {
    "saga_engine.kernel",
    "saga_engine.core",
    "saga_engine.core.history",
    "saga_engine.core.authoring",
    "saga_engine.core.runtime",
    "saga_engine.core.views",
    "saga_engine.core.planning",
    "saga_engine.transport",
    "saga_engine.runner",
}

PACKAGE = Path(saga_engine.__file__).parent


def test_top_level_names_are_pinned() -> None:
    assert set(saga_engine.__all__) == PUBLIC
    for name in PUBLIC:
        assert getattr(saga_engine, name) is not None


def test_the_front_doors_export_their_documented_names() -> None:
    for name, exported in FRONT_DOORS.items():
        module = importlib.import_module(name)
        assert set(module.__all__) == exported, name
        assert len(module.__all__) == len(exported), f"{name}: a name listed twice"
        for attribute in exported:
            assert getattr(module, attribute) is not None, f"{name}.{attribute}"
    assert len(saga_engine.events.EVENT_TYPES) == 39


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_public(name: str) -> bool:
    return not any(part.startswith("_") for part in name.split("."))


def public_modules() -> list[str]:
    return sorted(
        name
        for name in map(_module_name, PACKAGE.rglob("*.py"))
        if _is_public(name) and name != "saga_engine" and name not in LAYERS
    )


def test_every_public_module_is_a_pinned_front_door() -> None:
    assert public_modules() == sorted(FRONT_DOORS)


def _private_source(node: ast.ImportFrom) -> bool:
    module = node.module or ""
    return node.level == 0 and module.startswith("saga_engine.") and not _is_public(module)


def _lazy_machinery(node: ast.stmt) -> bool:
    """The root's own statements: its version, and Engine and run loaded on first use."""
    if isinstance(node, ast.If):  # if TYPE_CHECKING: the lazy names, for type checkers
        return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
    if isinstance(node, ast.FunctionDef):
        return node.name in {"__getattr__", "__dir__"}
    targets = node.targets if isinstance(node, ast.Assign) else []
    return [t.id for t in targets if isinstance(t, ast.Name)] == ["_LAZY"]


def _deprecation_alias(node: ast.stmt) -> bool:
    """A front door's aliases of renamed names: the ``_RENAMED`` table, the module
    ``__getattr__`` that warns, and the standard-library imports it needs."""
    if isinstance(node, ast.FunctionDef):
        return node.name == "__getattr__"
    if isinstance(node, ast.Import):
        return [a.name for a in node.names] == ["warnings"]
    if isinstance(node, ast.ImportFrom):
        return node.module == "typing"
    targets: list[ast.expr] = [node.target] if isinstance(node, ast.AnnAssign) else []
    targets += node.targets if isinstance(node, ast.Assign) else []
    return [t.id for t in targets if isinstance(t, ast.Name)] == ["_RENAMED"]


def _check_re_exports_only(name: str, path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    problems = []
    if not ast.get_docstring(tree):
        problems.append("no docstring saying what it is for")
    imported: set[str] = set()
    listed: set[str] = set()
    for node in tree.body[1:] if ast.get_docstring(tree) else tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            continue
        if isinstance(node, ast.ImportFrom) and _private_source(node):
            # The version is read from the kernel, and not a name of __all__.
            imported |= {alias.asname or alias.name for alias in node.names} - {"__version__"}
        elif isinstance(node, ast.Import | ast.ImportFrom) and name == "saga_engine":
            continue  # typing's TYPE_CHECKING and Any, for the lazy names
        elif isinstance(node, ast.Assign | ast.AnnAssign) and any(
            isinstance(t, ast.Name) and t.id == "__all__"
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        ):
            assert node.value is not None
            listed = set(ast.literal_eval(node.value))
        elif (name == "saga_engine" and _lazy_machinery(node)) or _deprecation_alias(node):
            continue
        else:
            problems.append(f"line {node.lineno}: code, not a re-export from a private module")
    lazy = {"Engine", "run"} if name == "saga_engine" else set()
    if imported | lazy != listed:
        problems.append(f"imports {sorted(imported | lazy)} but __all__ lists {sorted(listed)}")
    return problems


def test_layers_say_what_they_hold_and_export_nothing() -> None:
    for name in LAYERS:
        tree = ast.parse(Path(importlib.import_module(name).__file__ or "").read_text())
        assert ast.get_docstring(tree), f"{name}: no docstring saying what it holds"
        assert "May import" in (ast.get_docstring(tree) or ""), name
        assert len(tree.body) == 1, f"{name}: a layer's package exports nothing"


def test_public_modules_only_re_export_from_private_ones() -> None:
    found = {
        name: problems
        for path in sorted(PACKAGE.rglob("*.py"))
        if _is_public(name := _module_name(path)) and name not in LAYERS
        if (problems := _check_re_exports_only(name, path))
    }
    assert not found, found


def test_what_the_front_doors_export_is_defined_in_private_modules() -> None:
    for name in ["saga_engine", *FRONT_DOORS]:
        module = importlib.import_module(name)
        for attribute in module.__all__:
            value = getattr(module, attribute)
            if inspect.isclass(value) or inspect.isfunction(value):
                assert not _is_public(value.__module__), f"{name}.{attribute}"


def test_error_hierarchy_tells_how_to_react() -> None:
    e = saga_engine
    assert issubclass(e.ConcurrencyError, e.TransientError)
    assert issubclass(e.StepTimedOut, e.StepFailed)
    for permanent in (
        e.DefinitionError,
        e.NondeterminismError,
        e.SagaNotFound,
        e.InvalidTransition,
        e.SerializationError,
        e.PayloadTooLarge,
        e.InvalidPayload,
        e.UnstorableValue,
        e.IdempotencyConflict,
    ):
        assert issubclass(permanent, e.PermanentError)
    assert issubclass(e.PastPivot, e.InvalidTransition)  # a 409, like any refused action
    for cls in (e.TransientError, e.StepFailed, e.PermanentError):
        assert issubclass(cls, e.SagaError)


def test_a_renamed_public_name_still_imports_with_a_deprecation_warning() -> None:
    import warnings

    import saga_engine.admin

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = saga_engine.admin.DeadLetters
    assert old is saga_engine.admin.DeadLetterReader
    assert [w.category for w in caught] == [DeprecationWarning]
    assert "DeadLetterReader" in str(caught[0].message)
