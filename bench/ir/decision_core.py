"""The decision core alone: each saga started and driven by its replies through
``SagaRuntime``, one after another, with no engine, store or I/O (the saga's coroutine
on its deterministic loop, its pydantic models, the events it records and the commands
it decides). Unit: a saga."""

from __future__ import annotations

from bench.ir.shape import definitions, reply_to, started


def run(n: int) -> int:
    defs = definitions()
    for k in range(n):
        runtime, decision = started(defs[k % 2], k)
        while decision.commands:
            (command,) = decision.commands
            decision = runtime.handle(reply_to(command))
        if decision.status.value not in ("completed", "compensated"):
            raise RuntimeError(f"saga {k} ended {decision.status.value}")
        runtime.close()
    return n
