"""The actions a saga's view offers (the page's buttons, ``GET /sagas/{id}``'s
``actions``) are exactly the inputs its runtime accepts: for sagas in each state an
operator meets, every action and step is tried on the replayed saga."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from saga_engine import RetryPolicy, Saga, SagaContext, SagaStatus, Signal
from saga_engine.core.authoring._definition import SagaDefinition
from saga_engine.core.history._decision import (
    Cancel,
    ForceCompensate,
    Inbound,
    Resume,
    RetryStep,
    SignalInput,
    Skip,
)
from saga_engine.core.history._events import Event
from saga_engine.core.runtime._runtime import SagaRuntime
from saga_engine.core.views._view import SagaView, WaitKind, saga_view_of
from saga_engine.kernel._errors import InvalidTransition, PastPivot
from saga_engine.testing import SagaTestEnv
from tests.internal.unit.test_operator_actions import Cmd, In, Undo


class Go(BaseModel):
    ok: bool = True


_BACKOFF = RetryPolicy(
    max_attempts=3, initial_backoff=timedelta(minutes=5), max_backoff=timedelta(minutes=5)
)


class Two(Saga[In, In]):
    name = "two-steps"
    go = Signal(Go)

    async def run(self, ctx: SagaContext, input: In) -> In:
        for i in (1, 2):
            await ctx.step(
                f"s{i}",
                to=f"p{i}",
                command=Cmd(n=i),
                compensate=Undo(n=i),
                timeout=600,
                retry=_BACKOFF,
                compensate_retry=_BACKOFF,
            )
        await ctx.wait_signal(self.go, timeout=timedelta(hours=1))
        return In()


STEPS = ("s1", "s2")


def _inputs(at: Any) -> dict[tuple[str, str | None], Inbound]:
    out: dict[tuple[str, str | None], Inbound] = {
        ("signal", None): SignalInput("sig-1", "go", at, {"ok": True}),
        ("cancel", None): Cancel("no longer wanted", at),
        ("force-compensate", None): ForceCompensate("by hand", at),
        ("resume", None): Resume(at),
    }
    for step in STEPS:
        out["retry", step] = RetryStep(step, at)
        out["skip", step] = Skip(step, at)
    return out


Setup = Callable[[SagaTestEnv], Awaitable[str]]


async def _waiting_reply(env: SagaTestEnv) -> str:
    env.participant("p2").on(Cmd, no_reply=True)
    return (await env.start(Two, In())).saga_id


async def _backoff(env: SagaTestEnv) -> str:
    env.participant("p2").on(Cmd, retryable="busy", times=1)
    return (await env.start(Two, In())).saga_id


async def _waiting_signal(env: SagaTestEnv) -> str:
    return (await env.start(Two, In())).saga_id


async def _compensation_backoff(env: SagaTestEnv) -> str:
    env.participant("p2").on(Cmd, reject="no")
    env.participant("p1").on(Undo, retryable="ledger busy", times=1)
    return (await env.start(Two, In())).saga_id


async def _compensation_in_flight(env: SagaTestEnv) -> str:
    env.participant("p2").on(Cmd, reject="no")
    env.participant("p1").on(Undo, no_reply=True)
    return (await env.start(Two, In())).saga_id


async def _compensation_stuck(env: SagaTestEnv) -> str:
    env.participant("p2").on(Cmd, reject="no")
    env.participant("p1").on(Undo, reject="ledger locked")
    run = await env.start(Two, In())
    assert await env.run_until_settled(run) == SagaStatus.COMPENSATION_STUCK
    return run.saga_id


SETUPS: dict[str, Setup] = {
    "waiting for a reply": _waiting_reply,
    "in a back-off": _backoff,
    "waiting for a signal": _waiting_signal,
    "compensation in a back-off": _compensation_backoff,
    "compensation waiting for its reply": _compensation_in_flight,
    "compensation stuck": _compensation_stuck,
}


@pytest.mark.parametrize("state", list(SETUPS))
async def test_the_view_offers_what_the_runtime_accepts(state: str) -> None:
    env = SagaTestEnv([Two])
    saga_id = await SETUPS[state](env)
    await env.settle()
    history = await env.engine.history(saga_id)
    view = saga_view_of(history, saga_id=saga_id, awaited=["go"])
    definition = env.parts.registry.get("two-steps")
    accepted = accepted_inputs(definition, saga_id, history, _inputs(history[-1].at))
    assert offered(view) == accepted, state


Action_ = tuple[str, str | None]


def offered(view: SagaView) -> set[Action_]:
    """The actions a view offers, each with one of its steps (or none)."""
    return {(a.name, step) for a in view.actions for step in (a.steps or (None,))}


def accepted_inputs(
    definition: SagaDefinition,
    saga_id: str,
    history: list[Event],
    inputs: dict[Action_, Inbound],
) -> set[Action_]:
    """The ``inputs`` the saga's runtime, replayed from ``history``, accepts (each tried
    on a replay of its own)."""
    accepted = set()
    for key, inbound in inputs.items():
        runtime, _ = SagaRuntime.replay(definition, saga_id, history)
        try:
            runtime.handle(inbound)
        except (InvalidTransition, PastPivot):
            continue
        finally:
            runtime.close()
        accepted.add(key)
    return accepted


async def test_a_compensation_back_off_offers_retry_and_no_signal() -> None:
    env = SagaTestEnv([Two])
    saga_id = await _compensation_backoff(env)
    await env.settle()
    view = saga_view_of(await env.engine.history(saga_id), saga_id=saga_id)
    assert view.status == SagaStatus.COMPENSATING
    assert {a.name: a.steps for a in view.actions} == {"retry": ("s1",)}
    [wait] = view.waiting_for
    assert (wait.kind, wait.step, wait.attempt) == (WaitKind.BACKOFF, "s1", 1)
    assert wait.last_error == "ledger busy"
    assert wait.compensation


async def test_a_step_back_off_shows_its_attempt_and_last_error() -> None:
    env = SagaTestEnv([Two])
    saga_id = await _backoff(env)
    await env.settle()
    view = saga_view_of(await env.engine.history(saga_id), saga_id=saga_id)
    [wait] = view.waiting_for
    assert (wait.kind, wait.step, wait.attempt, wait.last_error) == (
        WaitKind.BACKOFF,
        "s2",
        1,
        "busy",
    )
