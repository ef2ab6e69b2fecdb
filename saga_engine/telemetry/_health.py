"""What a process knows to be wrong with it right now, for ``/health`` and its callers.

A consumer that cannot read a partition (``_fetch``) and a group that does not settle
(``_groupwatch``) put a line here while the condition lasts and take it back when it
ends; the admin API's ``/health`` answers ``degraded`` with these lines while any is
present. A failure (``fail``: the inbox consumer stopped) is what only a restart cures:
``/health`` then answers 503 ``failing``, so that whatever supervises the process
restarts it. A problem is named by a key (``unreadable:topic[3]``), so reporting it again
replaces it instead of piling up lines.
"""

from __future__ import annotations


class HealthBoard:
    """The problems a process has now, by key (the latest description of each)."""

    def __init__(self) -> None:
        self._problems: dict[str, str] = {}
        self._failures: set[str] = set()

    def report(self, key: str, description: str) -> None:
        self._problems[key] = description

    def fail(self, key: str, description: str) -> None:
        """A problem only a restart cures (it stays until the process ends)."""
        self._problems[key] = description
        self._failures.add(key)

    def clear(self, key: str) -> None:
        self._problems.pop(key, None)

    def clear_prefix(self, prefix: str) -> None:
        for key in [k for k in self._problems if k.startswith(prefix)]:
            del self._problems[key]

    @property
    def problems(self) -> list[str]:
        return [self._problems[k] for k in sorted(self._problems)]

    @property
    def status(self) -> str:
        if self._failures:
            return "failing"
        return "degraded" if self._problems else "ok"
