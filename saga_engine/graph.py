"""Graph sagas: declare a saga's steps and what each depends on (docs/graphs.md).

``GraphSaga`` is a ``Saga`` whose ``run`` is its graph; ``node`` declares one node, and
``step``, ``http`` and ``each`` the work it does. ``Graph`` and ``GraphNode`` are the
checked declaration (``GraphSaga.graph``), as the API and the console show it.
"""

from saga_engine.core.authoring._graph import (
    Graph,
    GraphNode,
    GraphSaga,
    each,
    http,
    node,
    step,
)

__all__ = ["Graph", "GraphNode", "GraphSaga", "each", "http", "node", "step"]
