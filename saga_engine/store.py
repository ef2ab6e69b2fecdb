"""Event stores: the port, its two adapters, and the schema migrations."""

from saga_engine._errors import MigrationBusy, MigrationError, StoreUnavailable
from saga_engine._memstore import InMemoryEventStore
from saga_engine._migrations import migrate, migration_sql, shipped_migrations
from saga_engine._pgstore import GroupCommitConfig, PostgresEventStore
from saga_engine._store import (
    Append,
    EventStore,
    LoadedSaga,
    NewSaga,
    Projection,
    SagaRecord,
    StoredEvent,
)

__all__ = [
    "Append",
    "EventStore",
    "GroupCommitConfig",
    "InMemoryEventStore",
    "LoadedSaga",
    "MigrationBusy",
    "MigrationError",
    "NewSaga",
    "PostgresEventStore",
    "Projection",
    "SagaRecord",
    "StoreUnavailable",
    "StoredEvent",
    "migrate",
    "migration_sql",
    "shipped_migrations",
]
