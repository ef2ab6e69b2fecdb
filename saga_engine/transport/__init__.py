"""Transport: the message bus port, the wire envelope, topics, and the Kafka adapters.

Holds the ``CommandSender`` port, the envelope and its codecs on the wire, child-saga
messages, topic names, and the aiokafka producer, consumers and guarded fetch.

May import: ``saga_engine.telemetry``, ``saga_engine.core``, ``saga_engine.kernel``.
Never ``saga_engine.store``.
"""
