"""The decision core's floor: the benchmark's saga shape (``bench.ir.shape``) as a bare
coroutine on the runtime's own ``DeterministicLoop``, with none of the runtime: a task
per saga, a future per step that the driver resolves, and the same pydantic models built
as the saga builds them (its input validated, each step's command and compensation
dumped, a failing saga's two compensations awaited, last first). No events, decisions,
command ids, checks or state.

What any runtime that keeps the saga as a coroutine and the user's models as pydantic
must spend; ``decision_core_instructions_per_saga`` minus this figure is what the
runtime's own bookkeeping costs. Unit: a saga."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel

from bench.ir.shape import STEPS, Do, Order, Placed, Undo
from saga_engine.core.runtime._loop import DeterministicLoop


class _Failed(Exception):
    pass


class _Ctx:
    """The least a step needs: a future the driver resolves, compensations kept."""

    def __init__(self, loop: DeterministicLoop) -> None:
        self.loop = loop
        self.pending: tuple[dict[str, Any], asyncio.Future[dict[str, Any]]] | None = None
        self.undo: list[dict[str, Any]] = []

    async def step(self, command: BaseModel, compensate: BaseModel | None = None) -> None:
        if compensate is not None:
            self.undo.append(compensate.model_dump())
        if (await self._send(command.model_dump()))["outcome"] == "failure":
            for payload in reversed(self.undo):
                await self._send(payload)
            raise _Failed

    def _send(self, payload: dict[str, Any]) -> asyncio.Future[dict[str, Any]]:
        future: asyncio.Future[dict[str, Any]] = self.loop.create_future()
        self.pending = (payload, future)
        return future


async def _completes(ctx: _Ctx, raw: dict[str, Any]) -> dict[str, Any]:
    order = Order.model_validate(raw)
    for _ in STEPS:
        await ctx.step(Do(n=order.n), Undo(n=order.n))
    return Placed().model_dump()


async def _fails(ctx: _Ctx, raw: dict[str, Any]) -> dict[str, Any] | None:
    order = Order.model_validate(raw)
    for _ in STEPS[:-1]:
        await ctx.step(Do(n=order.n), Undo(n=order.n))
    try:
        await ctx.step(Do(n=order.n, fail=True))
    except _Failed:
        return None
    return Placed().model_dump()


def started(k: int) -> tuple[DeterministicLoop, _Ctx, asyncio.Task[dict[str, Any] | None]]:
    """The k-th bare saga (even ones complete, odd ones fail, as ``shape.saga_of``) on a
    loop of its own, run until it waits for its first step's reply."""
    # As the runtime makes it (mypy sees AbstractEventLoop's I/O methods as abstract).
    loop = DeterministicLoop()  # type: ignore[abstract]
    ctx = _Ctx(loop)
    code = _completes if k % 2 == 0 else _fails
    task: asyncio.Task[dict[str, Any] | None] = loop.create_task(code(ctx, {"n": k}))
    loop.run_until_quiescent()
    return loop, ctx, task


def run(n: int) -> int:
    for k in range(n):
        loop, ctx, task = started(k)
        sent = 0
        while not task.done():
            assert ctx.pending is not None
            payload, future = ctx.pending
            future.set_result({"outcome": "failure" if payload.get("fail") else "success"})
            sent += 1
            loop.run_until_quiescent()
        task.result()
        loop.close()
        # As the runtime's sagas: three commands; a failing one's two compensations too.
        if sent != (3 if k % 2 == 0 else 5):
            raise RuntimeError(f"saga {k} sent {sent} commands")
    return n
