"""This version of saga-engine (``saga_engine.__version__``, ``saga version``, the admin API)."""

__version__ = "0.1.0"
