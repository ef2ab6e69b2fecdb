"""The runner: the engine and the collaborators that do its I/O.

Holds the engine, live sagas and their locks and timers, child links, flow sending, HTTP
steps, ownership, housekeeping, retention, the scheduler loop, rollouts, the trigger
consumer, the observer, and the testing kit.

May import: ``saga_engine.store``, ``saga_engine.transport``, ``saga_engine.telemetry``,
``saga_engine.core``, ``saga_engine.kernel``. Ports only: concrete adapters are chosen by
the composition roots (``saga_engine.worker``, ``saga_engine.participant``), or passed
in, except the in-memory ones the testing kit is made of.
"""
