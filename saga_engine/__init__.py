"""saga-engine: durable sagas for microservice transactions.

Sagas are Python classes. Their history is event-sourced into Postgres, their steps
travel as Kafka commands and replies, and after a crash they are recovered by
deterministic replay.
"""

from saga_engine.settings import KafkaSettings, PostgresSettings, Settings

__all__ = ["KafkaSettings", "PostgresSettings", "Settings"]
__version__ = "0.1.0"
