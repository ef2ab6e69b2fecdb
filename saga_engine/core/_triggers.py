"""The code behind :mod:`saga_engine.triggers`, whose docstring says what it is for."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from saga_engine.core._definition import Saga

__all__ = ["KafkaTrigger"]

MsgT = TypeVar("MsgT", bound=BaseModel)


@dataclass(frozen=True)
class KafkaTrigger(Generic[MsgT]):
    topic: str
    saga: type[Saga[Any, Any]]
    message: type[MsgT]
    to_input: Callable[[MsgT], BaseModel | dict[str, Any]]
    idempotency_key: Callable[[MsgT], str]
