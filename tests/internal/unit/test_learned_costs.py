"""``cost="learned"``: a step sent with what its participant was measured to spend on it
(runner/_learned_costs, core/history/_cost.learned_cost)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from saga_engine import Saga, SagaContext, SagaStatus
from saga_engine.core.history._cost import LEARNED_MIN_SAMPLES, Cost, learned_cost
from saga_engine.core.views._insight_report import LearnedCost
from saga_engine.graph import GraphSaga, each, node, step
from saga_engine.runner._learned_costs import LearnedCosts
from saga_engine.testing import SagaTestEnv


class In(BaseModel):
    items: list[str] = []


class Out(BaseModel):
    pass


class Do(BaseModel):
    what: str


def figure(step: str, samples: int, handler_ms: float, cpu_ms: float | None) -> LearnedCost:
    return LearnedCost(
        saga_type="t",
        step=step,
        samples=samples,
        handler_ms=handler_ms,
        handler_p95_ms=None,
        cpu_ms=cpu_ms,
        cpu_samples=samples if cpu_ms is not None else 0,
    )


def test_a_learned_cost_is_handler_time_and_the_cores_it_keeps_busy() -> None:
    assert learned_cost(LEARNED_MIN_SAMPLES, 200.0, 150.0) == Cost(handler_s=0.2, cpu=0.75)
    assert learned_cost(LEARNED_MIN_SAMPLES, 200.0, None) == Cost(handler_s=0.2)
    assert learned_cost(LEARNED_MIN_SAMPLES - 1, 200.0, 150.0) is None  # too few to go by


def test_a_fan_outs_items_share_their_nodes_figure() -> None:
    table = LearnedCosts()
    table.load(
        "t",
        {
            "lines[0]": figure("lines[0]", 10, 100.0, 50.0),
            "lines[1]": figure("lines[1]", 30, 300.0, 150.0),
            "one": figure("one", 5, 10.0, None),
        },
    )
    assert table.cost("t", "lines[7]") == Cost(handler_s=0.25, cpu=0.5)
    assert table.cost("t", "one") is None  # 5 samples: not learned yet
    table.load("t", {})
    assert table.cost("t", "lines[7]") is None  # what is not measured any more is forgotten


class Measured(Saga[In, Out]):
    name = "measured"

    async def run(self, ctx: SagaContext, input: In) -> Out:
        await ctx.step("render", to="p", command=Do(what="render"), cost="learned")
        return Out()


class MeasuredGraph(GraphSaga[In, Out]):
    name = "measured-graph"
    lines = node(
        each(
            lambda i: i.items, step("p", lambda i, item: Do(what=item), cost="learned"), max_items=4
        )
    )


async def _costs(env: SagaTestEnv, saga: Any, input: In) -> dict[str, Any]:
    run = await env.start(saga, input)
    assert await env.run_until_settled(run) == SagaStatus.COMPLETED
    return {e.step: e.cost for e in await run.history() if e.kind == "command_issued"}


async def test_a_learned_step_is_sent_with_its_figure_once_there_is_one() -> None:
    env = SagaTestEnv([Measured, MeasuredGraph])
    env.participant("p").on(Do, reply={})
    assert await _costs(env, Measured, In()) == {"render": None}  # nothing learned yet
    env.parts.learned.load("measured", {"render": figure("render", 40, 500.0, 400.0)})
    env.parts.learned.load("measured-graph", {"lines[0]": figure("lines[0]", 40, 100.0, 10.0)})
    assert await _costs(env, Measured, In()) == {"render": {"handler_s": 0.5, "cpu": 0.8}}
    assert await _costs(env, MeasuredGraph, In(items=["a", "b"])) == {
        "lines[0]": {"handler_s": 0.1, "cpu": 0.1},
        "lines[1]": {"handler_s": 0.1, "cpu": 0.1},
    }
