"""The core: saga definitions, history events, and the decision logic, without I/O.

Holds the definition and context users write against, the runtime's deterministic loop,
the operations and inputs, the one fold of history into state and view, statuses and
their transitions, events and their versions, codecs, start requests, schedule plans,
flow gates, triggers, rollouts and replay.

May import: ``saga_engine.kernel``. Never asyncpg, aiokafka or httpx: the runner feeds
events in and gets commands out.
"""
