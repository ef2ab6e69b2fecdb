"""The engine process: ``SagaWorker`` consumes the saga inbox on Kafka (``saga worker APP``).

An edge and the engine's composition root: it builds the Postgres store, the Kafka
sender and consumers and the engine's collaborators, and hands them to the engine and
the admin API. May import every layer but the CLI.
"""

from saga_engine.worker._worker import SagaWorker

__all__ = ["SagaWorker"]
