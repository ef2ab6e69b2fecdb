"""The engine process: ``SagaWorker`` consumes the saga inbox on Kafka (``saga worker APP``)."""

from saga_engine.worker._worker import SagaWorker

__all__ = ["SagaWorker"]
