"""``python -m saga_engine`` is the ``saga`` command."""

from saga_engine.cli import main

main()
