"""Step costs and budgets (issue 40, section 2), on the in-memory engine: a ``Cost`` and
its checks; ``cost=`` recorded on ``command_issued`` (left out when None) and carried by
the command, the same after a restart; a named class resolved from the settings, an
unknown one a definition error naming the known ones; a cost above a whole budget
refused before anything is sent, with the numbers, and replayed the same way; a budget
holding heavy commands while commands with no cost flow; weights sharing a gate."""

from __future__ import annotations

import math

import pytest
from pydantic import BaseModel, ValidationError

from saga_engine import Cost, Saga, SagaContext, SagaStatus, Settings
from saga_engine.core.history._cost import check_cost_fits
from saga_engine.core.history._events import (
    CommandIssued,
    SagaParked,
    SideEffectRecorded,
    event_to_dict,
)
from saga_engine.core.runtime._runtime import SagaRuntime
from saga_engine.kernel._settings import FlowLimit, LimitsSettings
from saga_engine.testing import SagaTestEnv
from tests.waiting import eventually


class Frame(BaseModel):
    cost: str | None = None  # "none", a class's name, or cpu=N
    key: str = ""


class Rendered(BaseModel):
    ok: bool = True


class Draw(BaseModel):
    n: int = 0


class Erase(BaseModel):
    n: int = 0


def declared(text: str | None) -> Cost | str | None:
    if text is None:
        return None
    if text.startswith("cpu="):
        return Cost(cpu=float(text[4:]))
    return text


class Render(Saga[Frame, Rendered]):
    name = "render"

    async def run(self, ctx: SagaContext, frame: Frame) -> Rendered:
        await ctx.step(
            "draw",
            to="renderer",
            command=Draw(),
            compensate=Erase(),
            cost=declared(frame.cost),
            timeout=60,
        )
        return Rendered()


def settings(
    budget: dict[str, float] | None = None,
    classes: dict[str, dict[str, float]] | None = None,
    saga_budget: dict[str, float] | None = None,
    **limits: object,
) -> Settings:
    return Settings(
        limits=LimitsSettings(
            participants={"renderer": FlowLimit(budget=budget)} if budget else {},
            saga_types={"render": FlowLimit(budget=saga_budget)} if saga_budget else {},
            cost_classes=classes or {},
            **limits,
        )
    )


# --------------------------------------------------------------------------- values


def test_a_cost_is_named_amounts() -> None:
    cost = Cost(cpu=4, memory_mb=512)
    assert dict(cost) == {"cpu": 4.0, "memory_mb": 512.0}
    assert cost == Cost({"memory_mb": 512, "cpu": 4})
    assert hash(cost) == hash(Cost({"memory_mb": 512, "cpu": 4}))
    assert Cost(cpu=0) == Cost()  # nothing of a resource is not holding it
    assert repr(cost) == "Cost(cpu=4, memory_mb=512)"
    with pytest.raises(AttributeError):
        cost.x = 1


@pytest.mark.parametrize(
    ("amounts", "message"),
    [
        ({"cpu": -1}, "Cost: cpu must be a finite number at least 0, got -1"),
        ({"cpu": math.inf}, "Cost: cpu must be a finite number at least 0, got inf"),
        ({"cpu": "4"}, "Cost: cpu must be a number, got '4'"),
        ({"cpu": True}, "Cost: cpu must be a number, got True"),
        ({"2cpu": 1}, "Cost: resource name '2cpu' must be letters, digits and _"),
    ],
)
def test_a_bad_cost_is_refused_naming_the_resource(
    amounts: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(")):
        Cost(amounts)  # type: ignore[arg-type]


def test_bad_budgets_weights_and_classes_are_refused() -> None:
    with pytest.raises(ValidationError, match="budget: cpu must be a finite number above 0"):
        FlowLimit(budget={"cpu": 0})
    with pytest.raises(ValidationError, match="fairness weight of 'gold' must be"):
        LimitsSettings(fairness_weights={"gold": 0})
    with pytest.raises(ValidationError, match="cost class 'heavy': cpu must be a finite"):
        LimitsSettings(cost_classes={"heavy": {"cpu": -2}})
    assert FlowLimit(budget={}).budget is None
    assert LimitsSettings(participants={"p": FlowLimit(budget={"cpu": 1})}).enabled
    weights = LimitsSettings(fairness_weights={"gold": 3, "*": 2})
    assert (weights.weight_of("gold"), weights.weight_of("other")) == (3, 2)
    assert LimitsSettings().weight_of("any") == 1


def test_the_costs_declared_ahead_of_a_run_are_checked() -> None:
    limits = LimitsSettings(
        participants={"renderer": FlowLimit(budget={"cpu": 8})},
        saga_types={"render": FlowLimit(budget={"memory_mb": 100})},
        cost_classes={"heavy": {"cpu": 8}, "huge": {"cpu": 9}},
    )
    fits = check_cost_fits  # the check a graph saga's nodes get at engine start
    assert fits(None, limits, "renderer", "render") is None
    assert fits("heavy", limits, "renderer", "render") is None
    assert fits(Cost(gpu=100), limits, "renderer", "render") is None  # no budget of gpu
    assert fits("huge", limits, "renderer", "render", "node 'draw'") == (
        "node 'draw' costs cpu=9, above the whole budget of participant 'renderer' (cpu=8): "
        "it could never be sent; lower its cost or raise the budget (SAGA_LIMITS__...)"
    )
    assert "of saga type 'render' (memory_mb=100)" in str(
        fits(Cost(memory_mb=101), limits, "renderer", "render")
    )
    assert fits("tiny", limits, "renderer", "render", "node 'draw'") == (
        "node 'draw': cost class 'tiny' is not configured (known: 'heavy', 'huge'); declare "
        "it in SAGA_LIMITS__COST_CLASSES (LimitsSettings.cost_classes) or give a Cost(...)"
    )


# --------------------------------------------------------------------------- recorded


async def test_a_cost_is_recorded_with_its_command_and_sent_with_it() -> None:
    env = SagaTestEnv([Render], settings=settings(classes={"heavy": {"cpu": 8, "gpu": 1}}))
    plain = await env.start(Render, Frame())
    heavy = await env.start(Render, Frame(cost="heavy"))
    assert await env.run_until_settled(plain) == SagaStatus.COMPLETED
    assert await env.run_until_settled(heavy) == SagaStatus.COMPLETED
    (issued,) = [e for e in await heavy.history() if isinstance(e, CommandIssued)]
    assert issued.cost == {"cpu": 8.0, "gpu": 1.0}  # the class, resolved when recorded
    assert event_to_dict(issued)["cost"] == {"cpu": 8.0, "gpu": 1.0}
    (none,) = [e for e in await plain.history() if isinstance(e, CommandIssued)]
    assert "cost" not in event_to_dict(none)  # a history without costs keeps its shape
    sent = {c.saga_id: c.cost for c in env.commands("renderer")}
    assert sent == {plain.saga_id: None, heavy.saga_id: Cost(cpu=8, gpu=1)}


async def test_a_command_sent_again_after_a_restart_costs_what_it_was_recorded_with() -> None:
    env = SagaTestEnv(
        [Render], settings=settings(budget={"cpu": 16}, classes={"heavy": {"cpu": 8}})
    )
    saga_id = await env.engine.start(Render, Frame(cost="heavy"))
    await eventually(lambda: len(env.bus.sent) == 1)
    await env.engine.close()
    env.bus.pending.clear()
    # Redeployed with the class changed: the recorded command keeps its cost.
    env.settings = settings(budget={"cpu": 16}, classes={"heavy": {"cpu": 2}})
    env.engine = env.new_engine()
    await env.engine.recover()
    await eventually(lambda: len(env.bus.sent) == 2)
    again = env.bus.sent[-1]
    assert (again.saga_id, again.cost) == (saga_id, Cost(cpu=8))
    flow = env.parts.flow
    assert flow is not None
    assert flow.snapshot()[0]["budget_in_use"] == {"cpu": 8.0}


async def test_an_unknown_cost_class_parks_the_saga_naming_the_known_ones() -> None:
    env = SagaTestEnv([Render], settings=settings(classes={"heavy": {"cpu": 8}}))
    run = await env.start(Render, Frame(cost="hevy"))
    assert await run.status() == SagaStatus.NONDETERMINISTIC
    error = await run.error()
    assert error is not None
    assert error["type"] == "DefinitionError"
    assert error["message"] == (
        "step 'draw': cost class 'hevy' is not configured (known: 'heavy'); declare it in "
        "SAGA_LIMITS__COST_CLASSES (LimitsSettings.cost_classes) or give a Cost(...)"
    )
    parked = (await run.history())[-1]
    assert isinstance(parked, SagaParked)
    assert parked.reason == "definition_error"
    assert env.commands("renderer") == []


@pytest.mark.parametrize(
    ("limits", "gate"),
    [
        ({"budget": {"cpu": 8}}, "participant 'renderer' (cpu=8)"),
        ({"saga_budget": {"cpu": 10}}, "saga type 'render' (cpu=10)"),
    ],
)
async def test_a_cost_above_a_whole_budget_fails_the_step_before_it_is_recorded(
    limits: dict[str, dict[str, float]], gate: str
) -> None:
    env = SagaTestEnv([Render], settings=settings(**limits))  # type: ignore[arg-type]
    run = await env.start(Render, Frame(cost="cpu=12"))
    assert await env.run_until_settled(run) == SagaStatus.FAILED
    assert env.commands("renderer") == []
    history = await run.history()
    assert not [e for e in history if isinstance(e, CommandIssued)]
    (refusal,) = [e for e in history if isinstance(e, SideEffectRecorded)]
    assert refusal.op_id == "over_budget:draw"
    error = await run.error()
    assert error is not None
    assert error["message"] == (
        f"step 'draw' failed: the command of step 'draw' costs cpu=12, above the whole budget of {gate}: it "
        "could never be sent; lower its cost or raise the budget (SAGA_LIMITS__...)"
    )
    # A replay with no settings (a view, the replay tool) fails the step the same way.
    definition = env.parts.registry.get("render")
    _, decision = SagaRuntime.replay(definition, run.saga_id, history)
    assert decision.nondeterminism is None
    assert decision.events == []


# --------------------------------------------------------------------------- admission


async def test_a_budget_holds_heavy_commands_while_commands_with_no_cost_flow() -> None:
    env = SagaTestEnv([Render], settings=settings(budget={"cpu": 16}))
    heavy = [await env.engine.start(Render, Frame(cost="cpu=8")) for _ in range(4)]
    light = [await env.engine.start(Render, Frame()) for _ in range(4)]
    flow = env.parts.flow
    assert flow is not None
    await eventually(lambda: len(env.bus.sent) == 6)
    sent = [c.saga_id for c in env.bus.sent]
    assert set(sent) == {*heavy[:2], *light}  # two heavy fill cpu 16; the light all went
    (gate,) = flow.snapshot()
    assert (gate["in_flight"], gate["waiting"], gate["budget_in_use"]) == (6, 2, {"cpu": 16.0})
    # A heavy one answered frees its cpu for the next, in order.
    first = next(c for c in env.bus.pending if c.saga_id == heavy[0])
    await env.engine.reply(first.saga_id, first.command_id, "success", {})
    await eventually(lambda: len(env.bus.sent) == 7)
    assert env.bus.sent[-1].saga_id == heavy[2]


async def test_fairness_weights_share_a_gate() -> None:
    env = SagaTestEnv(
        [Render],
        settings=Settings(
            limits=LimitsSettings(
                participants={"renderer": FlowLimit(concurrency=1)},
                fairness_weights={"gold": 3},
                aging_s=None,
            )
        ),
    )
    blocker = await env.engine.start(Render, Frame())
    await eventually(lambda: len(env.bus.sent) == 1)
    keys = {}
    for key in ["gold"] * 12 + ["silver"] * 12:
        keys[await env.engine.start(Render, Frame(), fairness_key=key)] = key
    served: list[str] = []
    while len(served) < 12:
        command = env.bus.pending.popleft()
        await env.engine.reply(command.saga_id, command.command_id, "success", {})
        await eventually(lambda: bool(env.bus.pending))
        served.append(keys[env.bus.pending[0].saga_id])
    assert blocker not in keys
    # Three of gold for one of silver, whichever came first.
    assert served.count("gold") == 9, served
