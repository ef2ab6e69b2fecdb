"""A signal a saga declares: its name and the model its payload must match.

Below the definition and the context: a saga class declares its signals, and its code
waits for them through ``ctx``.
"""

from __future__ import annotations

import re
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from saga_engine.kernel._errors import DefinitionError
from saga_engine.kernel._serde import check_storable, validate_payload

M = TypeVar("M", bound=BaseModel)

#: What a saga's name, and a signal's attribute name, may be.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
#: What the wire allows a signal's name to be (its ``name``: 1 to 200 characters), less
#: what no one types on purpose (control characters, surrounding spaces).
_SIGNAL_NAME = re.compile(r"^(?! )[^\x00-\x1f\x7f]{1,200}(?<! )$")


class Signal(Generic[M]):
    """A signal a saga accepts: its name and the model its payload must match.

    Declare each one on the saga class; the attribute's name is the signal's name
    unless ``name`` says otherwise::

        class PlaceOrder(Saga[OrderRequest, OrderResult]):
            name = "place-order"
            approval = Signal(Approval)

            async def run(self, ctx, order):
                decision = await ctx.wait_signal(self.approval, timeout=timedelta(hours=4))

    The engine checks every signal against the declaration before anything is
    recorded: an undeclared name or a payload that does not match is refused (422 from
    the admin API, an exception from the client, a dead letter from the inbox), and the
    saga is untouched. ``SagaClient.signal(saga_id, PlaceOrder.approval, Approval(...))``
    checks it before sending.
    """

    __slots__ = ("_explicit", "model", "name")

    def __init__(self, model: type[M], *, name: str | None = None) -> None:
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise DefinitionError(
                f"Signal takes the payload's pydantic model class, not {model!r}; e.g. "
                "`approval = Signal(Approval)` with `class Approval(BaseModel): ...`"
            )
        if name is not None and not (isinstance(name, str) and _SIGNAL_NAME.match(name)):
            raise DefinitionError(
                f"signal name {name!r} is invalid: use 1 to 200 characters, none of them a "
                "control character, and no leading or trailing space"
            )
        self.model: type[M] = model
        #: Set from the attribute name when the class is created, unless given here.
        self.name: str = name or ""
        self._explicit = name is not None

    def __set_name__(self, owner: type, attribute: str) -> None:
        if self._explicit:
            return
        if self.name and self.name != attribute:
            raise DefinitionError(
                f"one Signal object is bound to two names ({self.name!r} and {attribute!r}); "
                f"declare each with its own Signal, or pass name= to share one"
            )
        if not NAME.match(attribute):
            raise DefinitionError(
                f"{owner.__name__}.{attribute}: a signal's name must be letters, digits, '.', "
                "'_' or '-' starting with a letter or digit; pass name= to choose one"
            )
        self.name = attribute

    def validate(self, payload: Any, *loc: str | int) -> M:
        """``payload`` as this signal's model; InvalidPayload naming the wrong fields."""
        check_storable(payload, f"signal {self.name!r}", *loc)
        return validate_payload(self.model, payload, f"signal {self.name!r}", *loc)

    def __repr__(self) -> str:
        return f"Signal({self.model.__name__}, name={self.name!r})"
