"""Code changes under running sagas: nondeterminism parks them; patches keep them going."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from saga_engine import Engine, InvalidTransition, Saga, SagaContext, SagaStatus, Settings
from saga_engine.testing import SagaTestEnv


class Cmd(BaseModel):
    n: int


class In(BaseModel):
    n: int = 1


class Out(BaseModel):
    path: str


class V1(Saga[In, Out]):
    name = "versioned"

    async def run(self, ctx: SagaContext, input: In) -> Out:
        await ctx.step("a", to="p", command=Cmd(n=1))
        await ctx.step("b", to="p", command=Cmd(n=2))
        return Out(path="v1")


class V2Renamed(Saga[In, Out]):
    name = "versioned"

    async def run(self, ctx: SagaContext, input: In) -> Out:
        await ctx.step("a-renamed", to="p", command=Cmd(n=1))
        await ctx.step("b", to="p", command=Cmd(n=2))
        return Out(path="v2")


class V2Patched(Saga[In, Out]):
    name = "versioned"

    async def run(self, ctx: SagaContext, input: In) -> Out:
        if ctx.patched("audit-first"):
            await ctx.step("audit", to="audit", command=Cmd(n=0))
            path = "patched"
        else:
            path = "v1"
        await ctx.step("a", to="p", command=Cmd(n=1))
        await ctx.step("b", to="p", command=Cmd(n=2))
        return Out(path=path)


def _engine_like(env: SagaTestEnv, saga: type[Saga[In, Out]]) -> Engine:
    """A new engine process with other code, on the same store, bus and clock."""
    return Engine(Settings(), sagas=[saga], store=env.store, sender=env.bus, clock=env.clock)


async def test_changed_code_parks_the_saga_and_fixed_code_resumes_it() -> None:
    env = SagaTestEnv([V1])
    env.participant("p").on(Cmd, no_reply=True)
    run = await env.start(V1, In())
    waiting_on = env.commands()[-1]
    sent_before = len(env.bus.sent)

    broken = _engine_like(env, V2Renamed)
    assert await broken.recover() == 1
    record = await env.store.get(run.saga_id)
    assert record.status == SagaStatus.NONDETERMINISTIC
    assert record.error is not None
    assert "history has step 'a' sending Cmd" in record.error["message"]
    assert "the code now does step 'a-renamed'" in record.error["message"]
    assert len(env.bus.sent) == sent_before, "a parked saga emits nothing"
    history = await run.history()
    assert history[-1].kind == "saga_parked"

    with pytest.raises(InvalidTransition, match="parked as nondeterministic"):
        await broken.signal(run.saga_id, "anything", {})
    with pytest.raises(InvalidTransition, match="still cannot be driven by the code deployed here"):
        await broken.resume(run.saga_id)
    # Rebuilding again with the same broken code does not add a second marker.
    broken.evict(run.saga_id)
    await broken.recover([run.saga_id])
    assert [e.kind for e in await run.history()].count("saga_parked") == 1

    fixed = _engine_like(env, V1)
    await fixed.recover()
    assert (await env.store.get(run.saga_id)).status == SagaStatus.NONDETERMINISTIC
    await fixed.resume(run.saga_id, principal="ops@example.com", reason="deployed fix")
    assert (await env.store.get(run.saga_id)).status == SagaStatus.RUNNING
    resent = env.bus.sent[sent_before:]
    assert [c.command_id for c in resent] == [waiting_on.command_id]
    await fixed.reply(run.saga_id, waiting_on.command_id, "success")
    step_b = env.bus.sent[-1]
    assert step_b.step == "b"
    await fixed.reply(run.saga_id, step_b.command_id, "success")
    assert (await env.store.get(run.saga_id)).status == SagaStatus.COMPLETED


async def test_patched_keeps_old_histories_on_the_old_path() -> None:
    env = SagaTestEnv([V1])
    env.participant("p").on(Cmd, no_reply=True, times=1)
    old = await env.start(V1, In())
    pending = env.commands()[-1]

    new_engine = _engine_like(env, V2Patched)
    await new_engine.recover()
    await new_engine.reply(old.saga_id, pending.command_id, "success")
    # step b is answered by the default success reply
    b = env.bus.sent[-1]
    await new_engine.reply(old.saga_id, b.command_id, "success")
    record = await env.store.get(old.saga_id)
    assert record.status == SagaStatus.COMPLETED
    kinds = [e.kind for e in await env.engine.history(old.saga_id)]
    assert "patch_marked" not in kinds
    completed = (await env.engine.history(old.saga_id))[-1]
    assert completed.kind == "saga_completed"
    assert completed.output == {"path": "v1"}

    fresh_env = SagaTestEnv([V2Patched])
    fresh = await fresh_env.start(V2Patched, In())
    assert await fresh.output() == Out(path="patched")
    fresh_kinds = [e.kind for e in await fresh.history()]
    assert fresh_kinds[1] == "patch_marked"
