"""The engine process: ``SagaWorker`` consumes the saga inbox on Kafka (``saga worker APP``).

An edge and the engine's composition root: it builds the Postgres store, the Kafka
sender and consumers and the engine's collaborators, and hands them to the engine and
the admin API. May import every layer but the CLI.

``DeadLetterTopic`` is the Kafka adapter the worker hands its admin API for the
``/dead-letters`` routes; hand one to ``create_admin_app(..., dead_letters=...)`` to
serve them from an app of your own.
"""

from saga_engine.transport._dlq import DeadLetterTopic
from saga_engine.worker._worker import SagaWorker

__all__ = ["DeadLetterTopic", "SagaWorker"]
