"""``python -m saga_engine`` is the ``saga`` command."""

from saga_engine.cli._cli import main

main()
