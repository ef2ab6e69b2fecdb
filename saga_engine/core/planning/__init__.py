"""The planners of features: flow policies, rollouts, batch operations, schedules,
triggers and replay checks. Each plans from definitions and histories; the runner carries
the plan out.

May import: ``saga_engine.core.runtime``, ``saga_engine.core.authoring``,
``saga_engine.core.history``, ``saga_engine.kernel``. Never ``saga_engine.core.views``.
"""
