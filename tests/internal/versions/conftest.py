"""The crash tests' cluster (real engine and participant processes), shared."""

from tests.internal.e2e.conftest import cluster, participants_up

__all__ = ["cluster", "participants_up"]
