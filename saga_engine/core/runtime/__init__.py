"""The decision runtime: a saga's code run on a deterministic loop, fed inputs and
giving back intents; the state the decisions fold, the operations ``ctx`` performs, the
compensation stack's lifecycle, an input's way in, updates, awaits and start requests.

May import: ``saga_engine.core.authoring``, ``saga_engine.core.history``,
``saga_engine.kernel``.
"""
