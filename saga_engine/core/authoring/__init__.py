"""What a saga's author touches: the ``Saga`` class and its registry, ``SagaContext``,
signals, updates and queries, and domain-event sources.

May import: ``saga_engine.core.history``, ``saga_engine.kernel``. Temporal draws the same
line between ``temporalio.workflow`` and its worker's runtime.
"""
