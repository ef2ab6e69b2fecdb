"""Benchmarks: separate from the tests, they print machine-readable JSON (see README.md)."""
