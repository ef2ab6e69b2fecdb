"""The kernel: what every layer may use and that uses nothing of ours.

Holds the error hierarchy (with ``PoisonReason``), serde (JSON, storable values, depth
limits), settings, back-off, crash points, instance names, Kafka partitioning (pure) and
the process main loop.

May import: the standard library and third-party libraries only; never another
``saga_engine`` subpackage.
"""
