"""The ``saga`` command line (typer + rich).

``main`` is the ``saga`` console script (and ``python -m saga_engine``); ``app`` is the
typer application, for ``typer.testing.CliRunner`` or to mount in a larger CLI.

Every command takes ``--json`` for machine-readable output. Errors are one line on
stderr and a non-zero exit; ``--debug`` shows the traceback instead: a ``CliError``, or
an ``AdminCallError`` when the admin API refused (its exit code says which kind).
"""

from saga_engine.cli._app import app, main
from saga_engine.kernel._errors import AdminCallError, CliError

__all__ = ["AdminCallError", "CliError", "app", "main"]
