"""Data, no code: the participant kit's SQL migrations (``0001_participant.sql``...), which
``saga_engine.store.migrate`` applies to a participant's own database when given
``package="saga_engine.participant_migrations"`` (``Participant`` does it at start)."""

__all__: list[str] = []
