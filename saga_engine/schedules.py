"""Durable schedules: start a saga type on a cron expression or a fixed interval.

Declare them in code (``SagaWorker(settings, sagas, schedules=[Schedule(...)])``, created
or updated at the worker's start), or create them through the admin API
(``POST /schedules``) and the CLI (``saga schedule create``). See docs/operations.md,
"Schedules".
"""

from saga_engine.core.planning._schedule import CatchUp, Overlap, Schedule, ScheduleState

__all__ = ["CatchUp", "Overlap", "Schedule", "ScheduleState"]
