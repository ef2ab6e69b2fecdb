"""Progress numbering under any script (issue 41 §5): whatever the topics, however the
signals that drive the saga are spread over engine restarts, the items are numbered 1..n
with no gap and no repeat, each once in the history, and replay matches them all."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from saga_engine import Saga, SagaContext, SagaStatus, Signal
from saga_engine.events import ProgressEmitted
from saga_engine.replay import HistoryExport, replay
from saga_engine.testing import SagaTestEnv


class Script(BaseModel):
    #: Per signal taken, the topics emitted after it.
    rounds: list[list[str]]


class Go(BaseModel):
    pass


class Emitted(BaseModel):
    last: int


class Scripted(Saga[Script, Emitted]):
    name = "scripted"
    go = Signal(Go)

    async def run(self, ctx: SagaContext, input: Script) -> Emitted:
        last = await ctx.emit("status", {"stage": "start"})
        for topics in input.rounds:
            await ctx.wait_signal(self.go)
            for topic in topics:
                last = await ctx.emit(topic, {"after": last})
        return Emitted(last=last)


TOPICS = st.sampled_from(["status", "eta", "step.detail"])
ROUNDS = st.lists(st.lists(TOPICS, max_size=4), max_size=5)


@settings(max_examples=60, deadline=None)
@given(rounds=ROUNDS, restarts=st.lists(st.booleans(), min_size=5, max_size=5))
def test_items_are_numbered_once_with_no_gap(rounds: list[list[str]], restarts: list[bool]) -> None:
    async def scenario() -> None:
        env = SagaTestEnv([Scripted])
        run = await env.start(Scripted, Script(rounds=rounds))
        for restart in restarts[: len(rounds)]:
            if restart:  # a new engine replays the saga from its history first
                env.engine = env.new_engine()
            await env.signal(run, "go", Go())
        assert await run.status() == SagaStatus.COMPLETED
        history = await run.history()
        items = [e for e in history if isinstance(e, ProgressEmitted)]
        total = 1 + sum(len(r) for r in rounds)
        assert [i.number for i in items] == list(range(1, total + 1))
        assert (await run.output()).last == total  # type: ignore[attr-defined]
        assert replay([Scripted], HistoryExport(run.saga_id, Scripted.name, history)).deterministic

    asyncio.run(scenario())
