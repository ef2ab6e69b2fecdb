"""The runner: the engine and the collaborators that do its I/O.

- ``_engine``: ``Engine``, the front door of every input, and ``_path``/``_effects``: the
  one path each input takes (a batch; a single input is a batch of one): decide, write,
  send, settle, let go. ``_work``: what goes in (``Start``, ``Deliver``, ``FireTimers``,
  ``Load``) and what comes out (``Outcome``).
- ``_parts``: ``EngineParts``, the engine's collaborators, built once by a composition
  root and handed to the engine and to whoever else works on its sagas: live sagas and
  their locks and timers (``_cache``), the observer (``_observer``: spans and counters),
  flow control (``_flow_sender``), ownership (``_owners``), waiters (``_waiters``), the
  step span's context on each command (``_tracing``).
- Around the engine: child links (``_children``), HTTP steps (``_http``), a worker's
  ownership of inbox partitions (``_ownership``), housekeeping, retention, the scheduler
  loop, rollouts, the trigger consumer, and the testing kit (``_testing``).

May import: ``saga_engine.store``, ``saga_engine.transport``, ``saga_engine.telemetry``,
``saga_engine.core``, ``saga_engine.kernel``. Ports only: concrete adapters are chosen by
the composition roots (``saga_engine.worker``, ``saga_engine.participant``), or passed
in, except the in-memory ones the testing kit is made of.
"""
