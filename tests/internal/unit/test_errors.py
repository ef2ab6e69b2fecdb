"""One error tree: every error saga-engine raises is a SagaError defined in _errors, and
the tree drawn in that module's docstring names every one of them."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import saga_engine
from saga_engine.kernel import _errors
from saga_engine.kernel._errors import PermanentError, SagaError, TransientError

#: Not errors of the API: control flow that never leaves its module (unwinding saga code,
#: a participant's batch split or stop, a body cut off mid-stream inside the server).
CONTROL_FLOW = {
    "Halt",
    "HandlerFailed",
    "Abandoned",
    "CrashPoint",
    "Refused",
    "BodyTooLarge",
    "ClaimLost",
}


def _all_modules() -> list[object]:
    names = [m.name for m in pkgutil.walk_packages(saga_engine.__path__, "saga_engine.")]
    skip = ("migrations", "__main__")  # data, and the command line run on import
    return [importlib.import_module(n) for n in names if not n.endswith(skip)]


def test_every_exception_class_is_defined_in_the_errors_module() -> None:
    strays = []
    for module in _all_modules():
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == module.__name__  # type: ignore[attr-defined]
                and module is not _errors
                and name not in CONTROL_FLOW
            ):
                strays.append(f"{module.__name__}.{name}")  # type: ignore[attr-defined]
    assert strays == []


def test_every_error_is_a_saga_error_and_drawn_in_the_tree() -> None:
    doc = _errors.__doc__ or ""
    classes = [
        value
        for value in vars(_errors).values()
        if inspect.isclass(value)
        and issubclass(value, Exception)
        and value.__module__ == _errors.__name__
    ]
    assert len(classes) > 30
    for cls in classes:
        assert issubclass(cls, SagaError), cls
        assert f" {cls.__name__} " in doc, f"{cls.__name__} is missing from the tree"


def test_the_branches_say_how_to_react() -> None:
    from saga_engine.kernel._errors import (
        AdminCallError,
        KafkaUnavailable,
        MigrationBusy,
        PoisonMessage,
        ResultTimeout,
        StoreUnavailable,
        UnknownEndpoint,
    )

    for retry in (KafkaUnavailable, StoreUnavailable, MigrationBusy, ResultTimeout):
        assert issubclass(retry, TransientError)
    for fail in (PoisonMessage, UnknownEndpoint, AdminCallError):
        assert issubclass(fail, PermanentError)
