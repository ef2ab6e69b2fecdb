"""Flow control under flow policies (``LimitsSettings.policies``), on the in-memory
adapters: a saga's commands go through the gates of its policy (``saga_started.
flow_policy``), lanes and fairness weights are the policy's, a name several policies
limit is shared by their recent arrivals (``_policy_shares``) and a policy with no gate
for a name is unlimited there; ``learned_costs`` and budgets are the saga's policy's."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from saga_engine import Cost, DefinitionError, Saga, SagaContext, SagaStatus, Settings
from saga_engine.core.history._decision import OutboundCommand
from saga_engine.core.history._events import CommandIssued, SagaStarted
from saga_engine.core.history._structs import from_data
from saga_engine.core.planning._policy_shares import MIN_SHARE
from saga_engine.core.views._insight_report import LearnedCost
from saga_engine.graph import GraphSaga, node, step
from saga_engine.kernel._settings import FlowLimit, FlowPolicy, LimitsSettings
from saga_engine.runner._flow_sender import FlowControl
from saga_engine.testing import SagaTestEnv
from tests.waiting import eventually


class Job(BaseModel):
    n: int = 0


class Done(BaseModel):
    ok: bool = True


class Work(BaseModel):
    n: int


class Plain(Saga[Job, Done]):
    """Runs under policy 1 (no rollout for it)."""

    name = "plain"

    async def run(self, ctx: SagaContext, job: Job) -> Done:
        await ctx.step("work", to="worker", command=Work(n=job.n), timeout=60)
        return Done()


class Tried(Saga[Job, Done]):
    """Rolled out to policy 2 at 100 % by the tests."""

    name = "tried"

    async def run(self, ctx: SagaContext, job: Job) -> Done:
        await ctx.step("work", to="worker", command=Work(n=job.n), timeout=60)
        await ctx.step("other", to="other", command=Work(n=job.n), timeout=60)
        return Done()


def two_policies(one: FlowPolicy, two: FlowPolicy, **limits: Any) -> Settings:
    return Settings(
        limits=LimitsSettings(
            participants=one.participants,
            saga_types=one.saga_types,
            fairness_weights=one.fairness_weights,
            learned_costs=one.learned_costs,
            policies={2: two},
            **limits,
        )
    )


class Monotonic:
    """The flow sender's monotonic clock, moved by the test."""

    def __init__(self) -> None:
        self.at = 1000.0

    def __call__(self) -> float:
        return self.at


def gates_of(flow: FlowControl) -> dict[tuple[int, str], dict[str, Any]]:
    return {(int(str(g["policy"])), str(g["name"])): g for g in flow.snapshot()}


async def answer_all(env: SagaTestEnv) -> None:
    while env.bus.pending:
        command = env.bus.pending.popleft()
        await env.engine.reply(command.saga_id, command.command_id, "success", {})


# --------------------------------------------------------------------------- gates


async def test_each_policy_s_sagas_go_through_its_own_gates() -> None:
    """Concurrency 1 on the worker in policy 1, 4 in policy 2: policy-1 sagas hold the
    policy-1 gate's permit, policy-2 sagas the policy-2 gate's, each gate counting only
    its own; the worker's limit is shared by arrivals (2 and 8: a fifth and four
    fifths), and both gates stay open."""
    settings = two_policies(
        FlowPolicy(participants={"worker": FlowLimit(concurrency=1)}),
        FlowPolicy(participants={"worker": FlowLimit(concurrency=4)}),
    )
    env = SagaTestEnv([Plain, Tried], settings=settings)
    flow = env.parts.flow
    assert flow is not None
    clock = flow._monotonic = Monotonic()
    await env.set_flow_rollout(2, 100, saga_type="tried")
    plain = [await env.engine.start(Plain, Job(n=i)) for i in range(2)]
    tried = [await env.engine.start(Tried, Job(n=i)) for i in range(8)]
    clock.at += 1.5  # the shares are counted again (at most every second)
    flow._kick()
    await eventually(
        lambda: (
            [(g["in_flight"], g["waiting"]) for g in gates_of(flow).values()] == [(1, 1), (4, 4)]
        )
    )
    gates = gates_of(flow)
    assert list(gates) == [(1, "worker"), (2, "worker")]
    assert gates[(1, "worker")]["policy_share"] == pytest.approx(0.2, abs=0.02)
    assert gates[(2, "worker")]["policy_share"] == pytest.approx(0.8, abs=0.02)
    sent = {c.saga_id for c in env.bus.sent}
    assert len(sent & set(plain)) == 1
    assert len(sent & set(tried)) == 4
    await eventually(lambda: all_completed(env, plain + tried))
    gates = gates_of(flow)
    assert (gates[(1, "worker")]["sent"], gates[(2, "worker")]["sent"]) == (2, 8)


async def all_completed(env: SagaTestEnv, ids: list[str]) -> bool:
    """Answers what was sent; whether every saga of ``ids`` completed."""
    await answer_all(env)
    statuses = [(await env.engine.get(i)).status for i in ids]
    return all(s is SagaStatus.COMPLETED for s in statuses)


async def test_a_policy_with_no_gate_for_a_name_is_unlimited_there() -> None:
    """Policy 1 limits ``other`` to one at a time; policy 2 does not limit it at all."""
    settings = two_policies(
        FlowPolicy(participants={"other": FlowLimit(concurrency=1)}),
        FlowPolicy(participants={"worker": FlowLimit(concurrency=10)}),
    )
    env = SagaTestEnv([Tried], settings=settings)
    await env.set_flow_rollout(2, 100)
    ids = [await env.engine.start(Tried, Job(n=i)) for i in range(3)]
    await eventually(lambda: len(env.bus.sent) == 3)
    await answer_all(env)
    # The three commands to ``other`` went straight to the broker: no gate of policy 2.
    others = [c for c in env.bus.sent if c.participant == "other"]
    assert len(others) == 3
    flow = env.parts.flow
    assert flow is not None
    gates = gates_of(flow)
    assert (gates[(1, "other")]["sent"], gates[(2, "worker")]["sent"]) == (0, 3)
    await eventually(lambda: all_completed(env, ids))


@pytest.mark.parametrize(("version", "gold_turns"), [(1, 2), (2, 3)])
async def test_fairness_weights_are_the_saga_s_policy_s(version: int, gold_turns: int) -> None:
    """Gold weighs 3 in policy 2 and 1 in policy 1: behind one permit, policy 2 serves
    three gold for a silver, policy 1 takes turns."""
    one_at_a_time = {"worker": FlowLimit(concurrency=1)}
    settings = two_policies(
        FlowPolicy(participants=one_at_a_time),
        FlowPolicy(participants=one_at_a_time, fairness_weights={"gold": 3}),
        aging_s=None,
    )
    env = SagaTestEnv([Plain], settings=settings)
    await env.set_flow_rollout(version, 100)
    await env.engine.start(Plain, Job())
    await eventually(lambda: len(env.bus.sent) == 1)
    keys = {}
    for i in range(8):
        key = "gold" if i % 2 == 0 else "silver"
        keys[await env.engine.start(Plain, Job(n=i), fairness_key=key)] = key
    served: list[str] = []
    while len(served) < 4:
        command = env.bus.pending.popleft()
        await env.engine.reply(command.saga_id, command.command_id, "success", {})
        await eventually(lambda: bool(env.bus.pending))
        served.append(keys[env.bus.pending[0].saga_id])
    assert served.count("gold") == gold_turns, served


# --------------------------------------------------------------------------- the path


class Recorded:
    """An inner sender that keeps what it was given."""

    def __init__(self) -> None:
        self.sent: list[OutboundCommand] = []

    async def send_command(self, command: OutboundCommand) -> None:
        self.sent.append(command)


def command(saga_id: str, participant: str, n: int = 0) -> OutboundCommand:
    return OutboundCommand(
        saga_id=saga_id,
        saga_type="plain",
        step=f"s{n}",
        participant=participant,
        command_type="Work",
        payload={"n": n},
        command_id=f"{saga_id}-{n}",
        attempt=1,
        compensation=False,
    )


def started(policy: int | None) -> SagaStarted:
    return from_data(
        SagaStarted,
        {"at": "2026-01-01T00:00:00Z", "saga_type": "plain", "input": {}, "flow_policy": policy},
    )


async def test_with_one_policy_a_saga_is_looked_up_only_when_its_command_queues() -> None:
    lookups: list[str] = []

    def start_of(saga_id: str) -> SagaStarted:
        lookups.append(saga_id)
        return started(None)

    limits = LimitsSettings(participants={"worker": FlowLimit(concurrency=1)})
    inner = Recorded()
    flow = FlowControl(limits, inner, start_of)
    await flow.send_command(command("a", "elsewhere"))  # unlimited: straight through
    assert (lookups, [c.saga_id for c in inner.sent]) == ([], ["a"])
    await flow.send_command(command("b", "worker"))
    assert lookups == ["b"]  # once, to queue it
    await eventually(lambda: len(inner.sent) == 2)
    await flow.close()


async def test_with_several_policies_a_saga_is_looked_up_once_per_command() -> None:
    lookups: list[str] = []

    def start_of(saga_id: str) -> SagaStarted:
        lookups.append(saga_id)
        return started(7 if saga_id == "b" else None)  # 7: not configured, runs under 2

    limits = LimitsSettings(
        participants={"worker": FlowLimit(concurrency=1)},
        policies={2: FlowPolicy(participants={"worker": FlowLimit(concurrency=2)})},
    )
    inner = Recorded()
    flow = FlowControl(limits, inner, start_of)
    await flow.send_command(command("a", "worker"))
    await flow.send_command(command("b", "worker"))
    assert lookups == ["a", "b"]
    await eventually(lambda: len(inner.sent) == 2)
    assert [(g["policy"], g["in_flight"]) for g in flow.snapshot()] == [(1, 1), (2, 1)]
    await flow.close()


async def test_a_policy_that_stops_getting_commands_loses_its_share_but_never_all() -> None:
    """Shares follow arrivals (9 to 1), recomputed at most every second; once policy 2's
    commands stop coming its share decays, yet while it has one in flight it keeps the
    floor (a concurrency of at least one)."""
    clock = Monotonic()
    limits = LimitsSettings(
        participants={"worker": FlowLimit(concurrency=10)},
        policies={2: FlowPolicy(participants={"worker": FlowLimit(concurrency=10)})},
    )
    inner = Recorded()
    policy_of = {f"p1-{i}": None for i in range(9)} | {"p2-0": 2, "p2-1": 2}
    flow = FlowControl(limits, inner, lambda s: started(policy_of[s]), monotonic=clock)
    for saga_id in [f"p1-{i}" for i in range(9)] + ["p2-0"]:
        await flow.send_command(command(saga_id, "worker"))
    await eventually(lambda: len(inner.sent) == 10)
    clock.at += 1.0
    flow._kick()

    def shares() -> list[float]:
        return [float(str(g["policy_share"])) for g in flow.snapshot()]

    await eventually(lambda: shares() == pytest.approx([0.9, 0.1]))
    assert [g["effective_concurrency"] for g in flow.snapshot()] == [9, 1]
    clock.at += 600.0  # ten minutes of nothing new: both decay alike, the split holds
    flow._kick()
    await eventually(lambda: flow._shares_at == clock.at)
    assert shares() == pytest.approx([0.9, 0.1])
    # Policy 1 alone from now on.
    policy_of.update({f"late-{i}": None for i in range(50)})
    for i in range(50):
        await flow.send_command(command(f"late-{i}", "worker"))
    clock.at += 300.0
    flow._kick()
    await eventually(lambda: flow._shares_at == clock.at)
    low = shares()[1]
    assert MIN_SHARE <= low < 0.1  # decayed, held at the floor by its command in flight
    await flow.close()


# --------------------------------------------------------------------------- costs


class Measured(Saga[Job, Done]):
    name = "measured"

    async def run(self, ctx: SagaContext, job: Job) -> Done:
        await ctx.step("render", to="p", command=Work(n=job.n), cost="learned")
        return Done()


def figure() -> LearnedCost:
    return LearnedCost(
        saga_type="measured",
        step="render",
        samples=40,
        handler_ms=500.0,
        handler_p95_ms=None,
        cpu_ms=400.0,
        cpu_samples=40,
    )


async def test_a_policy_without_learned_costs_prices_a_learned_step_at_nothing() -> None:
    settings = two_policies(FlowPolicy(), FlowPolicy(learned_costs=False))
    env = SagaTestEnv([Measured], settings=settings)
    env.participant("p").on(Work, reply={})
    env.parts.learned.load("measured", {"render": figure()})
    costs = {}
    for version in (1, 2):
        await env.set_flow_rollout(version, 100)
        run = await env.start(Measured, Job())
        assert await env.run_until_settled(run) == SagaStatus.COMPLETED
        (issued,) = [e for e in await run.history() if isinstance(e, CommandIssued)]
        costs[version] = issued.cost
    assert costs == {1: {"handler_s": 0.5, "cpu": 0.8}, 2: None}


class Render(Saga[Job, Done]):
    name = "render"

    async def run(self, ctx: SagaContext, job: Job) -> Done:
        await ctx.step("draw", to="renderer", command=Work(n=job.n), cost=Cost(cpu=8))
        return Done()


async def test_a_cost_is_checked_against_the_budgets_of_the_saga_s_policy() -> None:
    settings = two_policies(
        FlowPolicy(participants={"renderer": FlowLimit(budget={"cpu": 16})}),
        FlowPolicy(participants={"renderer": FlowLimit(budget={"cpu": 4})}),
    )
    env = SagaTestEnv([Render], settings=settings)
    env.participant("renderer").on(Work, reply={})
    fits = await env.start(Render, Job())
    assert await env.run_until_settled(fits) == SagaStatus.COMPLETED
    await env.set_flow_rollout(2, 100)
    refused = await env.start(Render, Job())
    assert await env.run_until_settled(refused) == SagaStatus.FAILED
    error = await refused.error()
    assert error is not None
    assert error["message"] == (
        "step 'draw' failed: the command of step 'draw' costs cpu=8, above the whole budget "
        "of participant 'renderer' in flow policy 2 (cpu=4): it could never be sent; lower "
        "its cost or raise the budget (SAGA_LIMITS__POLICIES)"
    )


class Drawn(GraphSaga[Job, Done]):
    name = "drawn"
    draw = node(step("renderer", lambda i: Work(n=i.n), cost=Cost(cpu=8)))


def test_an_engine_refuses_a_graph_cost_above_any_policy_s_budget_naming_it() -> None:
    settings = two_policies(
        FlowPolicy(participants={"renderer": FlowLimit(budget={"cpu": 16})}),
        FlowPolicy(participants={"renderer": FlowLimit(budget={"cpu": 4})}),
    )
    with pytest.raises(DefinitionError) as refused:
        SagaTestEnv([Drawn], settings=settings)
    assert str(refused.value) == (
        "node 'draw' of saga 'drawn' costs cpu=8, above the whole budget of participant "
        "'renderer' in flow policy 2 (cpu=4): it could never be sent; lower its cost or "
        "raise the budget (SAGA_LIMITS__POLICIES)"
    )
    SagaTestEnv([Drawn], settings=two_policies(FlowPolicy(), FlowPolicy()))  # fits both
