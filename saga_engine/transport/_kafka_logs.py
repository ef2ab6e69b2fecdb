"""aiokafka's log records of errors it retries itself, logged by us below ERROR.

On a fresh cluster (topics just created, the group coordinator still loading) and
during a broker's failover, aiokafka logs retriable protocol errors such as
``NotLeaderForPartitionError`` or ``GroupCoordinatorNotAvailableError`` at ERROR and
then retries them. They are what an operator sees first at start-up, and they say
nothing is wrong. A stall that lasts is reported by the engine's own checks (the
consumer-group watch, health), not by these lines, so they are demoted to INFO.
Anything else aiokafka logs keeps its level.
"""

from __future__ import annotations

import logging
from typing import Final

__all__ = ["RETRIED_ERRORS", "quiet_retried_kafka_errors"]

#: The retriable errors' names, as aiokafka formats them into its messages.
RETRIED_ERRORS: Final = (
    "NotLeaderForPartitionError",
    "LeaderNotAvailableError",
    "GroupCoordinatorNotAvailableError",
    "CoordinatorNotAvailableError",
    "NotCoordinatorForGroupError",
    "NotCoordinatorError",
    "GroupLoadInProgressError",
    "CoordinatorLoadInProgressError",
    "RebalanceInProgressError",
    "UnknownTopicOrPartitionError",
)

#: The aiokafka loggers that log them (filters on a logger are not inherited by its
#: children, so each gets the filter).
_LOGGERS: Final = (
    "aiokafka",
    "aiokafka.client",
    "aiokafka.cluster",
    "aiokafka.conn",
    "aiokafka.consumer.consumer",
    "aiokafka.consumer.fetcher",
    "aiokafka.consumer.group_coordinator",
    "aiokafka.producer.producer",
    "aiokafka.producer.sender",
)


class _Demote(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING and _retried(record):
            record.levelno, record.levelname = logging.INFO, "INFO"
            # As if logged at INFO: dropped where aiokafka's level is above it (the
            # worker sets WARNING).
            return logging.getLogger(record.name).isEnabledFor(logging.INFO)
        return True


def _retried(record: logging.LogRecord) -> bool:
    text = record.getMessage()
    if "UnknownTopicOrPartition" in text or "not found in cluster metadata" in text:
        return True  # a topic being created: its metadata arrives on the next refresh
    return any(name in text for name in RETRIED_ERRORS)


_FILTER: Final = _Demote()


def quiet_retried_kafka_errors() -> None:
    """Demotes aiokafka's records of errors it retries to INFO (idempotent)."""
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
