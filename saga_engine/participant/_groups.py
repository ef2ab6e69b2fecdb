"""Batch handlers (``Participant.handles_batch``): which commands of a transaction go to
one call, and what a call's answer must look like.

In a run's transaction, the claimed commands of one batch-handled type are gathered into
one group, and the group's handler is called once, with all of them. A group is called
when the run ends, or earlier, when a later command of one of its sagas is to be answered
otherwise (another type, a single handler, a reply decided without a handler): a saga's
commands are applied in record order, whatever the grouping. Across sagas nothing is
ordered, so commands of other types and sagas may be answered in between. A saga is
therefore in one open group at most.

The commands of a group whose handler raised are called alone (``Item.solo``), each a
group of one in its place in the run, like a single handler's command, until the one to
blame is found (it raised alone): the others are grouped again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from saga_engine.kernel._errors import Rejected, Retryable
from saga_engine.participant._handler import HandlerSpec
from saga_engine.participant._reading import Item


def grouped(item: Item) -> bool:
    """The command goes to its batch handler with others of its type (its handler is a
    batch handler, it has not been split out of a group, and nothing answers it yet)."""
    handler = item.handler
    return (
        handler is not None
        and handler.batch
        and not item.solo
        and item.fixed is None
        and item.refused is None
    )


class Groups:
    """The open groups of a transaction, by command type, in the order they opened."""

    def __init__(self) -> None:
        self._open: dict[str, list[Item]] = {}
        #: The type of the open group each saga is in.
        self._sagas: dict[str, str] = {}

    def before(self, item: Item) -> list[Item] | None:
        """The group to call (now closed) before ``item`` is answered or joins a group:
        the one holding an earlier command of its saga, unless ``item`` joins it."""
        if not self._sagas:
            return None  # no group open (a run without batch handlers)
        kind = self._sagas.get(_saga(item))
        if kind is None or (grouped(item) and _kind(item) == kind):
            return None
        return self._close(kind)

    def add(self, item: Item) -> None:
        """``item`` joins its type's open group (opening it)."""
        kind = _kind(item)
        self._open.setdefault(kind, []).append(item)
        self._sagas[_saga(item)] = kind

    def rest(self) -> list[list[Item]]:
        """Every open group, closed, in the order they opened."""
        groups = list(self._open.values())
        self._open.clear()
        self._sagas.clear()
        return groups

    def _close(self, kind: str) -> list[Item]:
        group = self._open.pop(kind)
        for item in group:
            self._sagas.pop(_saga(item), None)
        return group


def checked_results(spec: HandlerSpec, results: object, count: int) -> list[Any]:
    """A batch handler's answer, one entry per command: a payload (a pydantic model, a
    dict or None) or a Rejected or Retryable. TypeError otherwise, which counts as the
    handler raising."""
    name = f"the batch handler for {spec.command_type} ({_qualname(spec)})"
    if not isinstance(results, Sequence) or isinstance(results, str | bytes):
        raise TypeError(
            f"{name} must return a list with one entry per command, not {type(results).__name__}"
        )
    if len(results) != count:
        raise TypeError(
            f"{name} returned {len(results)} entries for {count} command(s); it must "
            "return one per command, in order"
        )
    for index, entry in enumerate(results):
        if not (entry is None or isinstance(entry, BaseModel | Mapping | Rejected | Retryable)):
            raise TypeError(
                f"{name} returned a {type(entry).__name__} for command {index}: an entry is "
                "a pydantic model, a dict, None, Rejected or Retryable"
            )
    return list(results)


def _qualname(spec: HandlerSpec) -> str:
    return f"{getattr(spec.fn, '__module__', '?')}.{getattr(spec.fn, '__qualname__', spec.fn)}"


def _kind(item: Item) -> str:
    assert item.handler is not None
    return item.handler.command_type


def _saga(item: Item) -> str:
    assert item.command is not None
    return item.command.saga_id
