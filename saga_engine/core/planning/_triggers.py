"""The code behind :mod:`saga_engine.triggers`, whose docstring says what it is for."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from saga_engine.core.authoring._definition import Saga
from saga_engine.kernel._errors import DefinitionError

__all__ = ["KafkaTrigger"]

MsgT = TypeVar("MsgT", bound=BaseModel)


@dataclass(frozen=True)
class KafkaTrigger(Generic[MsgT]):
    topic: str
    saga: type[Saga[Any, Any]]
    message: type[MsgT]
    to_input: Callable[[MsgT], BaseModel | dict[str, Any]]
    idempotency_key: Callable[[MsgT], str]
    #: Flow control's priority of the saga (``StartSaga.priority``), from the message.
    priority: Callable[[MsgT], int] | None = None
    #: Flow control's fairness key (a tenant) of the saga, from the message.
    fairness_key: Callable[[MsgT], str | None] | None = None
    #: The value of the saga's concurrency key (``Saga.concurrency``), from the message:
    #: written into the input's key field, over what ``to_input`` put there.
    concurrency_key: Callable[[MsgT], str] | None = None

    def __post_init__(self) -> None:
        if self.concurrency_key is not None and self.saga.concurrency is None:
            raise DefinitionError(
                f"the trigger on {self.topic!r} maps a concurrency key, but "
                f"{self.saga.__name__} declares no `concurrency` (a ConcurrencyLimit)"
            )
