"""What ``Engine.recover`` counts: the open sagas it was given that are held now, whether
its pass loaded them or another input got there first. An engine that takes partitions
owns them before recovery's query runs, so the wake-up poll may load a due saga first;
the log's "recovered N sagas" must still count it (an e2e crash test reads that line)."""

from __future__ import annotations

from pydantic import BaseModel

from saga_engine import Engine, Saga, SagaContext, Settings
from saga_engine.testing import SagaTestEnv


class Cmd(BaseModel):
    n: int


class In(BaseModel):
    n: int = 1


class Out(BaseModel):
    ok: bool = True


class OneStep(Saga[In, Out]):
    name = "one-step"

    async def run(self, ctx: SagaContext, input: In) -> Out:
        await ctx.step("a", to="p", command=Cmd(n=input.n))
        return Out()


async def _open_sagas(count: int) -> tuple[SagaTestEnv, list[str]]:
    env = SagaTestEnv([OneStep])
    env.participant("p").on(Cmd, no_reply=True)  # each saga stays open, waiting
    runs = [await env.start(OneStep, In(n=i)) for i in range(count)]
    return env, [run.saga_id for run in runs]


async def test_a_saga_another_input_loaded_first_counts_as_recovered() -> None:
    env, ids = await _open_sagas(3)
    fresh = Engine(Settings(), sagas=[OneStep], store=env.store, sender=env.bus, clock=env.clock)
    await fresh.load_due(ids[0])  # the wake-up poll got to it before recovery did
    assert ids[0] in fresh.live_saga_ids()

    assert await fresh.recover(ids) == 3


async def test_recovery_counts_only_what_it_holds_afterwards() -> None:
    env, ids = await _open_sagas(2)
    fresh = Engine(Settings(), sagas=[OneStep], store=env.store, sender=env.bus, clock=env.clock)

    assert await fresh.recover([*ids, "no-such-saga"]) == 2
    assert sorted(fresh.live_saga_ids()) == sorted(ids)
