"""aiokafka's records of errors it retries itself are logged below ERROR; its other
records keep their level."""

from __future__ import annotations

import logging

import pytest

from saga_engine.kernel._settings import KafkaSettings
from saga_engine.transport._kafka import make_producer
from saga_engine.transport._kafka_logs import RETRIED_ERRORS, quiet_retried_kafka_errors


@pytest.mark.parametrize("error", RETRIED_ERRORS)
def test_a_retried_error_is_demoted_to_info(error: str, caplog: pytest.LogCaptureFixture) -> None:
    quiet_retried_kafka_errors()
    with caplog.at_level(logging.INFO):
        logging.getLogger("aiokafka.consumer.group_coordinator").error(
            "Group Coordinator Request failed: [Error 15] %s", error
        )
    (record,) = caplog.records
    assert (record.levelno, record.levelname) == (logging.INFO, "INFO")


def test_other_errors_keep_their_level(caplog: pytest.LogCaptureFixture) -> None:
    quiet_retried_kafka_errors()
    with caplog.at_level(logging.INFO):
        logging.getLogger("aiokafka.producer.sender").error(
            "Unexpected error during InitProducerIdRequest: %s", "ClusterAuthorizationFailedError"
        )
        logging.getLogger("aiokafka.cluster").error("Topic %s is not authorized", "t")
    assert [r.levelno for r in caplog.records] == [logging.ERROR, logging.ERROR]


async def test_building_a_client_installs_it_once(caplog: pytest.LogCaptureFixture) -> None:
    for _ in range(2):
        await make_producer(KafkaSettings()).stop()  # never started: nothing to close
    logger = logging.getLogger("aiokafka.producer.sender")
    assert len([f for f in logger.filters if type(f).__name__ == "_Demote"]) == 1
    with caplog.at_level(logging.INFO):
        logger.warning("Got error produce response: NotLeaderForPartitionError, retrying")
    (record,) = [r for r in caplog.records if r.name == logger.name]
    assert record.levelno == logging.INFO


def test_dropped_where_aiokafka_logs_only_warnings(caplog: pytest.LogCaptureFixture) -> None:
    quiet_retried_kafka_errors()
    logger = logging.getLogger("aiokafka")
    level = logger.level
    logger.setLevel(logging.WARNING)  # what `saga worker` sets
    try:
        with caplog.at_level(logging.INFO, logger="saga_engine"):
            logger.error("Failed fetch messages from 1: NotLeaderForPartitionError")
            logger.error("Failed fetch messages from 1: [Error 7] RequestTimedOutError")
    finally:
        logger.setLevel(level)
    assert [(r.levelno, r.getMessage()[-20:]) for r in caplog.records if r.name == "aiokafka"] == [
        (logging.ERROR, "RequestTimedOutError")
    ]
