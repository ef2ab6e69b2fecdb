"""The history model: the events a saga's history holds and their versions, statuses
and their transitions, the one fold of history, what a decision takes and gives
(``_decision``), payload codecs, and the values events carry (retry policies,
concurrency-key declarations).

May import: ``saga_engine.kernel``. The lowest sub-layer of ``core``.
"""
