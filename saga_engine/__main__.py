"""``python -m saga_engine`` is the ``saga`` command."""

from saga_engine._cli import main

main()
