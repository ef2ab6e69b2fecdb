"""Bad saga definitions are rejected when defined or registered, saying how to fix them."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from saga_engine import (
    DefinitionError,
    Saga,
    SagaContext,
    SagaRegistry,
    SagaStatus,
    UnknownSagaType,
)
from saga_engine.testing import SagaTestEnv
from tests.sagas import OrderRequest, OrderResult, PlaceOrder, ReserveCredit


class In(BaseModel):
    n: int = 0


class Out(BaseModel):
    ok: bool = True


def test_sync_run_is_rejected_at_class_definition() -> None:
    with pytest.raises(
        DefinitionError, match=r"must be a coroutine function: write `async def run"
    ):

        class Sync(Saga[In, Out]):
            name = "sync"

            def run(self, ctx: SagaContext, input: In) -> Out:  # type: ignore[override]
                return Out()


def test_missing_model_arguments_are_rejected() -> None:
    with pytest.raises(DefinitionError, match=r"must declare its input and output models"):

        class Bare(Saga):  # type: ignore[type-arg]
            name = "bare"

            async def run(self, ctx: SagaContext, input: Any) -> Any:
                return None


def test_non_model_input_is_rejected() -> None:
    with pytest.raises(DefinitionError, match=r"input type must be a pydantic model"):

        class DictIn(Saga[dict, Out]):  # type: ignore[type-arg, type-var]
            name = "dict-in"

            async def run(self, ctx: SagaContext, input: dict[str, Any]) -> Out:
                return Out()


class _Opaque:
    pass


class Unserializable(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)
    handle: _Opaque


def test_unserializable_output_model_is_rejected() -> None:
    with pytest.raises(
        DefinitionError, match=r"output model Unserializable is not JSON-serializable"
    ):

        class Bad(Saga[In, Unserializable]):
            name = "bad-out"

            async def run(self, ctx: SagaContext, input: In) -> Unserializable:
                return Unserializable(handle=_Opaque())


def test_bad_name_is_rejected() -> None:
    with pytest.raises(DefinitionError, match=r"`name` must be a string"):

        class Spaces(Saga[In, Out]):
            name = "has spaces"

            async def run(self, ctx: SagaContext, input: In) -> Out:
                return Out()


def test_wrong_run_signature_is_rejected() -> None:
    with pytest.raises(DefinitionError, match=r"must take exactly \(self, ctx, input\)"):

        class TwoArgs(Saga[In, Out]):
            name = "two-args"

            async def run(self, ctx: SagaContext) -> Out:  # type: ignore[override]
                return Out()


def test_duplicate_name_is_rejected_at_registration() -> None:
    class Another(Saga[OrderRequest, OrderResult]):
        name = "place-order"

        async def run(self, ctx: SagaContext, input: OrderRequest) -> OrderResult:
            return OrderResult(status="x")

    with pytest.raises(DefinitionError, match=r"two sagas are named 'place-order'.*rename one"):
        SagaRegistry([PlaceOrder, Another])


def test_unnamed_subclass_is_rejected_at_registration() -> None:
    class NoName(Saga[In, Out]):
        async def run(self, ctx: SagaContext, input: In) -> Out:
            return Out()

    with pytest.raises(DefinitionError, match=r"has no `name` of its own"):
        SagaRegistry([NoName])


def test_unknown_saga_type_lists_the_known_ones() -> None:
    registry = SagaRegistry([PlaceOrder])
    with pytest.raises(
        UnknownSagaType, match=r"no saga named 'nope' is registered \(known: place-order\)"
    ):
        registry.get("nope")


class ReusesStepName(Saga[In, Out]):
    name = "reuses-step-name"

    async def run(self, ctx: SagaContext, input: In) -> Out:
        for _ in range(2):
            await ctx.step("charge", to="payments", command=ReserveCredit(customer="c", amount=1))
        return Out()


async def test_reused_step_name_parks_the_saga_with_advice() -> None:
    env = SagaTestEnv([ReusesStepName])
    run = await env.start(ReusesStepName, In())
    # A bug in the code: parked for a fixed deploy, its first step not undone.
    assert await run.status() == SagaStatus.NONDETERMINISTIC
    assert env.commands(compensation=True) == []
    error = await run.error()
    assert error is not None
    assert error["type"] == "DefinitionError"
    assert "step name 'charge' is used twice" in error["message"]
    assert 'f"charge-{i}"' in error["message"]


class UsesAsyncioSleep(Saga[In, Out]):
    name = "uses-asyncio-sleep"

    async def run(self, ctx: SagaContext, input: In) -> Out:
        import asyncio

        await asyncio.sleep(5)
        return Out()


async def test_asyncio_clock_in_saga_code_parks_with_advice() -> None:
    env = SagaTestEnv([UsesAsyncioSleep])
    run = await env.start(UsesAsyncioSleep, In())
    assert await run.status() == SagaStatus.NONDETERMINISTIC
    error = await run.error()
    assert error is not None
    # It names the durable replacements: a sleep, a deadline on a block, a race.
    assert "`await ctx.sleep(delay)`" in error["message"]
    assert "`async with ctx.timeout(delay):`" in error["message"]
    assert "ctx.first(" in error["message"]
