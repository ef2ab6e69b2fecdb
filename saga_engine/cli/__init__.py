"""The ``saga`` command line (typer + rich).

``main`` is the ``saga`` console script (and ``python -m saga_engine``); ``app`` is the
typer application, for ``typer.testing.CliRunner`` or to mount in a larger CLI.

Every command takes ``--json`` for machine-readable output. Errors are one line on
stderr and a non-zero exit; ``--debug`` shows the traceback instead: a ``CliError``, or
an ``AdminCallError`` when the admin API refused (its exit code says which kind).

Layout: ``_app`` assembles the typer app from one module per command group (``_worker``;
``_store``: migrate, replay, archive; ``_operator``: list, show, history and the
operator actions; ``_updates``: update and query; ``_flow``; ``_insights``; ``_graph``:
a graph saga's declared graph; ``_events``: the domain events kept; ``_dlq``;
``_schedule``; ``_rollout``; ``_shard``: the shards past one database, read from
Postgres directly; ``_flow_policy``: flow policies' rollouts; ``_batch``;
``_conformance``: the protocol conformance suite against a participant), which share
``_common`` (options, consoles, errors, output, the admin API client) and never import
each other.

May import every layer below it: ``saga_engine.worker`` and everything the worker may.
"""

from saga_engine.cli._app import app, main
from saga_engine.kernel._errors import AdminCallError, CliError

__all__ = ["AdminCallError", "CliError", "app", "main"]
