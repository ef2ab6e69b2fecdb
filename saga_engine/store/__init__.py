"""Event stores: the port, its two adapters, and the schema migrations.

The layer: the ``EventStore`` and ``ScheduleStore`` ports, their in-memory and Postgres
adapters (the Postgres ones with their statements), and the migrations. May import
``saga_engine.telemetry``, ``saga_engine.core`` and ``saga_engine.kernel``; never the
transport.
"""

from saga_engine.kernel._errors import MigrationBusy, MigrationError, StoreUnavailable
from saga_engine.store._insight_store import LearnedCost
from saga_engine.store._memstore import InMemoryEventStore
from saga_engine.store._migrations import migrate, migration_sql, shipped_migrations
from saga_engine.store._pgstore import GroupCommitConfig, PostgresEventStore
from saga_engine.store._store import (
    Append,
    EventStore,
    LoadedSaga,
    NewSaga,
    Projection,
    SagaFilter,
    SagaRecord,
    StoredEvent,
)

__all__ = [
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
]
