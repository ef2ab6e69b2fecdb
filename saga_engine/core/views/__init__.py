"""The operator's read models: one saga's view (what it waits for, what is owed), its
timeline's segments, one line per history event, and the insights per saga type.

May import: ``saga_engine.core.runtime``, ``saga_engine.core.authoring``,
``saga_engine.core.history``, ``saga_engine.kernel``. Never ``saga_engine.core.planning``.
"""
