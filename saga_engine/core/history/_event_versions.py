"""Event versions and upcasters: an old stored event read in the current shape.

Every event type has a version (``_Event.version``, a class attribute, 1 unless a
class says otherwise). A stored event carries its version under the ``_v`` key of its
data **only when it is above 1**: a version-1 event is stored exactly as before, so
the events INSERT (the hot path) writes the same bytes it always did, and every
history recorded before versions existed is version 1 by construction. (``_v`` can
never be a field name: no event has a field starting with ``_``.)

On load, ``EventVersions.current_shape`` turns a stored dict into the current
version's dict before it is read as its event type: the upcasters registered for
``(kind, from_version)`` run in a chain (v1 -> v2 -> v3). An event of a kind this engine
does not know, or of a version above the one it reads, raises ``NewerEventError``
(written by a newer engine during a rolling deploy): it is never guessed at, dropped or
overwritten.

No I/O here: both stores' row mapping, the in-memory store and replay call it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from saga_engine.kernel._errors import DefinitionError, NewerEventError

JsonDict = dict[str, Any]
#: Turns an event's data at version N (``_v`` removed) into its data at version N+1.
Upcaster = Callable[[JsonDict], JsonDict]

VERSION_KEY: Final = "_v"


@dataclass(frozen=True, slots=True)
class EventVersions:
    """What one engine reads: each kind's current version and the upcasters up to it.

    Immutable: the engine's table is built once, from the event classes, at import; a
    test builds its own with ``with_version`` to pretend a kind moved on."""

    current: Mapping[str, int]
    upcasters: Mapping[tuple[str, int], Upcaster] = field(default_factory=dict)

    @classmethod
    def of(
        cls, kinds: Iterable[tuple[str, int]], upcasters: Mapping[tuple[str, int], Upcaster]
    ) -> EventVersions:
        current = dict(kinds)
        for (kind, start), _ in upcasters.items():
            if kind not in current or not 1 <= start < current[kind]:
                raise DefinitionError(
                    f"an upcaster from {kind!r} version {start} does not lead to a version "
                    f"this engine has ({current.get(kind)})"
                )
        for kind, version in current.items():
            missing = [v for v in range(1, version) if (kind, v) not in upcasters]
            if missing:
                raise DefinitionError(
                    f"event {kind!r} is at version {version} but has no upcaster from "
                    f"version(s) {missing}: old histories could not be read"
                )
        return cls(MappingProxyType(current), MappingProxyType(dict(upcasters)))

    def with_version(self, kind: str, version: int, upcaster: Upcaster) -> EventVersions:
        """A copy where ``kind`` is at ``version``, reached from ``version - 1`` by
        ``upcaster`` (tests, and a saga of the future, use it)."""
        return EventVersions.of(
            {**self.current, kind: version}.items(),
            {**self.upcasters, (kind, version - 1): upcaster},
        )

    def version_of(self, kind: str) -> int:
        return self.current.get(kind, 1)

    def stored(self, kind: str, data: JsonDict) -> JsonDict:
        """``data`` as it is stored: with ``_v`` when the kind is above version 1."""
        version = self.current.get(kind, 1)
        if version > 1:
            data[VERSION_KEY] = version
        return data

    def current_shape(self, data: Any) -> Any:
        """A stored event's data in the current version's shape (``data`` itself when it
        already is: the common case costs two dict lookups). Not a dict, or without a
        ``kind``: returned as it is, for the reader (``_events``) to refuse with its own message."""
        if not isinstance(data, dict):
            return data
        kind = data.get("kind")
        if not isinstance(kind, str):
            return data
        current = self.current.get(kind)
        stored = data.get(VERSION_KEY)
        if current is None:
            raise NewerEventError(kind, stored if isinstance(stored, int) else None, None)
        if stored is None:
            if current == 1:
                return data
            version = 1
        elif isinstance(stored, int) and not isinstance(stored, bool) and stored >= 1:
            version = stored
            data = {k: v for k, v in data.items() if k != VERSION_KEY}
        else:
            return data  # a malformed version: the reader names the extra key
        if version > current:
            raise NewerEventError(kind, version, current)
        while version < current:
            data = self.upcasters[(kind, version)](dict(data))
            version += 1
        return data


# --------------------------------------------------------------------------- upcasters


def saga_started_v1_to_v2(data: JsonDict) -> JsonDict:
    """``saga_started`` version 2 records which version of its saga type the start chose
    (``saga_version``, the gradual rollout's pick). A version-1 start was recorded before
    saga types had versions: it ran the one class there was, version 1. Said here, not
    left to the field's default, so a later change of that default cannot move old
    sagas onto another class."""
    data.setdefault("saga_version", 1)
    return data


#: Every upcaster the engine ships, by (kind, from-version).
UPCASTERS: Final[Mapping[tuple[str, int], Upcaster]] = MappingProxyType(
    {("saga_started", 1): saga_started_v1_to_v2}
)
