"""Engine configuration: one Settings object, read from ``SAGA_*`` environment variables.

The environment is read only when a Settings object is constructed, at the edge of the
program (the CLI, a test fixture, the user's ``main``). Nested fields use ``__``:
``SAGA_PG__DSN``, ``SAGA_KAFKA__BOOTSTRAP_SERVERS``.
"""

from saga_engine.kernel._settings import (
    AdminSettings,
    BatchSettings,
    BlobSettings,
    CallbackSettings,
    CodecSettings,
    EngineSettings,
    FlowLimit,
    FlowPolicy,
    HttpSettings,
    KafkaSettings,
    LimitsSettings,
    ParticipantSettings,
    PostgresSettings,
    RetentionSettings,
    ScheduleSettings,
    Settings,
)

__all__ = [
    "AdminSettings",
    "BatchSettings",
    "BlobSettings",
    "CallbackSettings",
    "CodecSettings",
    "EngineSettings",
    "FlowLimit",
    "FlowPolicy",
    "HttpSettings",
    "KafkaSettings",
    "LimitsSettings",
    "ParticipantSettings",
    "PostgresSettings",
    "RetentionSettings",
    "ScheduleSettings",
    "Settings",
]
