"""The in-memory engine path: the real ``Engine`` driven by ``SagaTestEnv`` (in-memory
store and bus, virtual clock): each saga started through ``Engine.start`` and its replies
fed back through ``Engine.reply`` by the kit's scripted participants, one saga after
another. Everything the engine does per saga but the real I/O: locks, decisions, the
store's writes (in memory: each event copied through its JSON), sends, the observer.
Unit: a saga."""

from __future__ import annotations

from bench.ir.shape import AT, SAGAS, Do, Order, Undo, saga_id, saga_of
from saga_engine import SagaStatus
from saga_engine.kernel._mainloop import run as run_loop
from saga_engine.testing import SagaTestEnv


async def drive(n: int) -> int:
    # A fixed start and fixed ids: the same strings, so the same hashes, in every run.
    env = SagaTestEnv(list(SAGAS), start_time=AT)
    env.participant("p").on(Do, reply={}).on(Undo, reply={})
    env.participant("q").on(Do, reject="refused")
    for k in range(n):
        run = await env.start(saga_of(k), Order(n=k), saga_id=saga_id(k))
        if (status := await env.run_until_settled(run)) not in (
            SagaStatus.COMPLETED,
            SagaStatus.COMPENSATED,
        ):
            raise RuntimeError(f"saga {k} ended {status.value}")
    return n


def run(n: int) -> int:
    return run_loop(drive(n), tune_gc=False)
