"""Graph sagas (saga_engine.graph): refused at definition, run what is ready, undone by
the graph; and the one undo rule for sagas written as code (a gather's branches)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

from saga_engine import Cost, DefinitionError, Saga, SagaContext, SagaStatus
from saga_engine.graph import GraphSaga, each, http, node, step
from saga_engine.replay import HistoryExport, replay
from saga_engine.settings import FlowLimit, LimitsSettings, Settings
from saga_engine.testing import SagaTestEnv


class In(BaseModel):
    flag: bool = False
    items: list[str] = []


class Out(BaseModel):
    model_config = {"extra": "ignore"}


class Do(BaseModel):
    what: str


class Undo(BaseModel):
    what: str


def work(to: str, what: str, undo: bool = True) -> Any:
    return step(
        to,
        lambda i: Do(what=what),
        compensate=(lambda i: Undo(what=what)) if undo else None,
    )


# --------------------------------------------------------------------------- refusals


def refused(match: str) -> Any:
    return pytest.raises(DefinitionError, match=match)


def test_a_cycle_is_named() -> None:
    with refused("cycle: a → c → b → a"):

        class Cycle(GraphSaga[In, Out]):
            name = "cycle"
            a = node(work("p", "a"), after="c")
            b = node(work("p", "b"), after=[a])
            c = node(work("p", "c"), after=[b])


def test_a_node_after_itself_is_refused() -> None:
    with refused(r"runs after itself \(a → a\)"):

        class Self(GraphSaga[In, Out]):
            name = "self"
            a = node(work("p", "a"), after="a")


def test_an_unknown_dependency_is_refused_naming_the_nodes() -> None:
    with refused(r"runs after 'lable', which is not a node of this saga \(its nodes: a, b\)"):

        class Unknown(GraphSaga[In, Out]):
            name = "unknown"
            a = node(work("p", "a"))
            b = node(work("p", "b"), after=["lable"])


def test_a_dependency_named_twice_is_refused() -> None:
    with refused("names 'a' twice"):

        class Twice(GraphSaga[In, Out]):
            name = "twice"
            a = node(work("p", "a"))
            b = node(work("p", "b"), after=[a, "a"])


def test_a_node_of_another_saga_is_refused() -> None:
    class Other(GraphSaga[In, Out]):
        name = "other"
        a = node(work("p", "a"))

    with refused("a node of another saga named 'a'"):

        class Mine(GraphSaga[In, Out]):
            name = "mine"
            a = node(work("p", "a"))
            b = node(work("p", "b"), after=[Other.a])


def test_a_builder_taking_a_node_it_does_not_depend_on_is_refused() -> None:
    with refused(r"node 'c''s command takes 'b', which is not a node it depends on"):

        class Takes(GraphSaga[In, Out]):
            name = "takes"
            a = node(work("p", "a"))
            b = node(work("p", "b"))
            c = node(step("p", lambda i, b: Do(what="c")), after=[a])


def test_a_condition_taking_a_node_it_does_not_depend_on_is_refused() -> None:
    with refused(r"node 'b''s when takes 'a'"):

        class When(GraphSaga[In, Out]):
            name = "when"
            a = node(work("p", "a"))
            b = node(work("p", "b"), when=lambda i, a: True)


def test_the_item_outside_a_fan_out_is_refused() -> None:
    with refused(r"node 'a''s command takes 'item'"):

        class Item(GraphSaga[In, Out]):
            name = "item-outside"
            a = node(step("p", lambda i, item: Do(what=item)))


def test_an_unbounded_fan_out_is_refused() -> None:
    with refused(r"fan-out 'lines' is unbounded; give it a bound, e.g. each\(..., max_items=100\)"):

        class Unbounded(GraphSaga[In, Out]):
            name = "unbounded"
            lines = node(each(lambda i: i.items, step("p", lambda i, item: Do(what=item))))


@pytest.mark.parametrize("bound", [0, -1, True, 10_001, 2.5])
def test_a_fan_out_bound_out_of_range_is_refused(bound: Any) -> None:
    with refused(r"fan-out 'lines' has max_items=.*; it must be an integer from 1 to 10000"):

        class Bound(GraphSaga[In, Out]):
            name = "bound"
            lines = node(
                each(lambda i: i.items, step("p", lambda i, item: Do(what=item)), max_items=bound)
            )


def test_a_builder_with_star_args_is_refused() -> None:
    with refused(r"takes \*rest; name each node whose result it takes"):

        class Star(GraphSaga[In, Out]):
            name = "star"
            a = node(step("p", lambda i, *rest: Do(what="a")))


def test_a_run_method_is_refused() -> None:
    with refused("a graph saga's run is its graph"):

        class Both(GraphSaga[In, Out]):
            name = "both"
            a = node(work("p", "a"))

            async def run(self, ctx: SagaContext, input: In) -> Out:
                return Out()


def test_a_graph_without_nodes_is_refused() -> None:
    with refused("it has none"):

        class Empty(GraphSaga[In, Out]):
            name = "empty"


def test_a_node_named_item_is_refused() -> None:
    with refused("may not be named 'item'"):

        class Named(GraphSaga[In, Out]):
            name = "named-item"
            item = node(work("p", "a"))


def test_one_node_under_two_names_is_refused() -> None:
    # Python 3.11 wraps an error of __set_name__ in a RuntimeError; 3.12 does not.
    with pytest.raises((RuntimeError, DefinitionError)) as raised:

        class Alias(GraphSaga[In, Out]):
            name = "alias"
            a = b = node(work("p", "a"))

    error = raised.value.__cause__ if isinstance(raised.value, RuntimeError) else raised.value
    assert isinstance(error, DefinitionError)
    assert "one node is declared twice, as 'a' and 'b'" in str(error) or "as 'b' and 'a'" in str(
        error
    )


def test_a_node_must_wrap_work() -> None:
    with refused(r"node 'a' must wrap step\(...\), http\(...\) or each\(...\)"):

        class NotWork(GraphSaga[In, Out]):
            name = "not-work"
            a = node("inventory")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- running


def scripted(*sagas: type[Saga[Any, Any]], participants: tuple[str, ...] = ("p",)) -> SagaTestEnv:
    env = SagaTestEnv(list(sagas))
    for name in participants:
        env.participant(name).on(Do, reply={"ok": True}).on(Undo, reply={})
    return env


def started(history: list[Any]) -> list[str]:
    return [e.step for e in history if e.kind == "command_issued"]


class Chain(GraphSaga[In, Out]):
    """a → b (conditional) → c; d after a, in parallel with b and c."""

    name = "chain"
    a = node(work("p", "a"))
    b = node(work("p", "b"), after=[a], when=lambda i: i.flag)
    c = node(step("p", lambda i, a: Do(what="c"), compensate=lambda i: Undo(what="c")), after=[b])
    d = node(work("q", "d"), after=[a])


async def test_a_skipped_node_counts_as_done_and_passes_its_dependencies_on() -> None:
    env = scripted(Chain, participants=("p", "q"))
    env.participant("q").on(Do, reject="no")
    run = await env.start(Chain, In(flag=False))
    assert await env.run_until_settled(run) == SagaStatus.COMPENSATED
    history: list[Any] = await run.history()
    assert [e.node for e in history if e.kind == "node_skipped"] == ["b"]
    assert "b" not in started(history)
    [plan] = [e for e in history if e.kind == "compensation_started"]
    # c depends on a only through the skipped b: still undone before a.
    assert plan.after == {"c": [], "a": ["c"]}
    undone = [e.step for e in history if e.kind == "compensation_completed"]
    assert undone == ["c", "a"]


async def test_a_builder_takes_the_result_of_a_node_upstream() -> None:
    class Upstream(GraphSaga[In, Out]):
        name = "upstream"
        a = node(step("p", lambda i: Do(what="a")))
        b = node(step("p", lambda i: Do(what="b")), after=[a])
        c = node(step("p", lambda i, a: Do(what=f"after {sorted(a)}")), after=[b])

    env = scripted(Upstream)
    run = await env.start(Upstream, In())
    assert await env.run_until_settled(run) == SagaStatus.COMPLETED
    [c] = [e for e in await run.history() if e.kind == "command_issued" and e.step == "c"]
    assert c.payload == {"what": "after ['ok']"}


class Fan(GraphSaga[In, Out]):
    name = "fan"
    first = node(work("p", "first"))
    lines = node(
        each(
            lambda i: i.items,
            step("w", lambda i, item: Do(what=item), compensate=lambda i, item: Undo(what=item)),
            max_items=3,
            concurrency=2,
        ),
        after=[first],
    )
    last = node(step("p", lambda i, lines: Do(what=str(len(lines)))), after=[lines])


async def test_a_fan_out_runs_an_item_per_step_within_its_concurrency() -> None:
    env = scripted(Fan, participants=("p", "w"))
    env.hold(lambda c: c.participant == "w")
    run = await env.start(Fan, In(items=["x", "y", "z"]))
    await env.settle()
    assert started(await run.history()) == ["first", "lines[0]", "lines[1]"]  # two at once
    await env.release()
    assert await env.run_until_settled(run) == SagaStatus.COMPLETED
    history: list[Any] = await run.history()
    assert started(history) == ["first", "lines[0]", "lines[1]", "lines[2]", "last"]
    [last] = [e for e in history if e.kind == "command_issued" and e.step == "last"]
    assert last.payload == {"what": "3"}


async def test_a_fan_out_over_its_bound_fails_before_sending_and_undoes_the_rest() -> None:
    env = scripted(Fan, participants=("p", "w"))
    run = await env.start(Fan, In(items=["1", "2", "3", "4"]))
    assert await env.run_until_settled(run) == SagaStatus.COMPENSATED
    history: list[Any] = await run.history()
    assert started(history) == ["first"]
    [plan] = [e for e in history if e.kind == "compensation_started"]
    assert "4 items, more than its bound of 3" in plan.error.message


async def test_a_node_in_flight_when_another_fails_is_owed_its_compensation() -> None:
    class Race(GraphSaga[In, Out]):
        name = "race"
        slow = node(work("slow", "slow"))
        bad = node(work("p", "bad"))

    env = scripted(Race, participants=("p", "slow"))
    env.participant("p").on(Do, reject="no")
    env.hold(lambda c: c.participant == "slow" and not c.compensation)
    run = await env.start(Race, In())
    await env.settle()
    await env.release()
    assert await env.run_until_settled(run) == SagaStatus.COMPENSATED
    history: list[Any] = await run.history()
    assert [e.step for e in history if e.kind == "compensation_completed"] == ["slow"]


async def test_independent_nodes_are_undone_in_parallel() -> None:
    class Wide(GraphSaga[In, Out]):
        name = "wide"
        a = node(work("p", "a"))
        b = node(work("p", "b"))
        c = node(work("q", "c"), after=[a, b])

    env = scripted(Wide, participants=("p", "q"))
    env.participant("q").on(Do, reject="no")
    env.hold(lambda c: c.compensation)
    run = await env.start(Wide, In())
    await env.settle()
    history: list[Any] = await run.history()
    # Both compensations are out before either answers.
    assert sorted(e.step for e in history if e.kind == "compensation_issued") == ["a", "b"]
    await env.release()
    assert await env.run_until_settled(run) == SagaStatus.COMPENSATED


async def test_a_graph_saga_replays_from_its_history() -> None:
    env = scripted(Chain, participants=("p", "q"))
    env.participant("q").on(Do, reject="no")
    run = await env.start(Chain, In(flag=True))
    assert await env.run_until_settled(run) == SagaStatus.COMPENSATED
    history: list[Any] = await run.history()
    result = replay([Chain], HistoryExport(run.saga_id, "chain", history))
    assert result.deterministic
    assert result.status == SagaStatus.COMPENSATED


async def test_an_http_node_is_an_http_step() -> None:
    class Mail(GraphSaga[In, Out]):
        name = "mail"
        a = node(work("p", "a"))
        send = node(http("mailer", "/send", lambda i, a: {"ok": a["ok"]}), after=[a])

    env = scripted(Mail)
    run = await env.start(Mail, In())
    await env.settle()
    [sent] = [e for e in await run.history() if e.kind == "command_issued" and e.step == "send"]
    assert sent.participant == "http:mailer"
    assert sent.payload == {"method": "POST", "path": "/send", "body": {"ok": True}}


# --------------------------------------------------------------------------- code-first


class Gathered(Saga[In, Out]):
    """first; then two branches at once; then a failing last step."""

    name = "gathered"

    async def run(self, ctx: SagaContext, input: In) -> Out:
        async def one(name: str) -> None:
            await ctx.step(name, to="p", command=Do(what=name), compensate=Undo(what=name))

        await one("first")
        await asyncio.gather(one("left"), one("right"))
        await one("after")
        await ctx.step("last", to="q", command=Do(what="last"))
        return Out()


async def test_a_gathers_branches_are_undone_in_parallel_after_what_began_after_them() -> None:
    env = scripted(Gathered, participants=("p", "q"))
    env.participant("q").on(Do, reject="no")
    run = await env.start(Gathered, In())
    assert await env.run_until_settled(run) == SagaStatus.COMPENSATED
    history: list[Any] = await run.history()
    [plan] = [e for e in history if e.kind == "compensation_started"]
    assert plan.owed == ["after", "right", "left", "first"]
    assert plan.after == {
        "after": [],
        "right": ["after"],
        "left": ["after"],
        "first": ["right", "left"],
    }
    order = [
        (e.kind, e.step)
        for e in history
        if e.kind.startswith("compensation_") and e.kind != "compensation_started"
    ]
    # left and right are both sent before either completes.
    assert order.index(("compensation_issued", "left")) < order.index(
        ("compensation_completed", "right")
    )
    assert order.index(("compensation_issued", "right")) < order.index(
        ("compensation_completed", "left")
    )


# --------------------------------------------------------------------------- costs


class Heavy(GraphSaga[In, Out]):
    name = "heavy"
    light = node(step("p", lambda i: Do(what="light"), cost=Cost(cpu=1)))
    render = node(
        each(
            lambda i: i.items,
            step("render", lambda i, item: Do(what=item), cost="heavy"),
            max_items=5,
        ),
        after=[light],
    )


def limits(budget: float, classes: dict[str, dict[str, float]] | None = None) -> Settings:
    return Settings(
        limits=LimitsSettings(
            participants={"render": FlowLimit(budget={"cpu": budget})},
            cost_classes={"heavy": {"cpu": 8}} if classes is None else classes,
        )
    )


def test_a_nodes_cost_is_part_of_the_declared_graph() -> None:
    shapes = {n.name: n for n in Heavy.graph.nodes}
    assert shapes["light"].cost == {"cpu": 1.0}
    assert shapes["render"].cost == "heavy"
    assert Heavy.graph.as_dict()["nodes"][1]["cost"] == "heavy"


def test_an_engine_refuses_a_graph_whose_cost_no_budget_can_hold() -> None:
    with refused(
        r"node 'render' of saga 'heavy' costs cpu=8, above the whole budget of participant "
        r"'render' \(cpu=4\)"
    ):
        SagaTestEnv([Heavy], settings=limits(4))


def test_an_engine_refuses_a_graph_naming_an_unknown_cost_class() -> None:
    with refused(r"node 'render' of saga 'heavy': cost class 'heavy' is not configured"):
        SagaTestEnv([Heavy], settings=limits(16, classes={}))


async def test_a_nodes_cost_travels_with_its_command() -> None:
    env = SagaTestEnv([Heavy], settings=limits(16))
    env.participant("p").on(Do, reply={})
    env.participant("render").on(Do, reply={})
    run = await env.start(Heavy, In(items=["a", "b"]))
    assert await env.run_until_settled(run) == SagaStatus.COMPLETED
    costs = {e.step: e.cost for e in await run.history() if e.kind == "command_issued"}
    assert costs == {"light": {"cpu": 1.0}, "render[0]": {"cpu": 8.0}, "render[1]": {"cpu": 8.0}}


def test_a_node_cost_of_the_wrong_type_is_refused_at_definition() -> None:
    with refused(r"node 'a' has cost=5; give a Cost\(...\), the name of a cost class, or None"):

        class Bad(GraphSaga[In, Out]):
            name = "bad-cost"
            a = node(step("p", lambda i: Do(what="a"), cost=5))  # type: ignore[arg-type]


class EmptyFan(GraphSaga[In, Out]):
    name = "empty-fan"
    first = node(work("p", "first"))
    lines = node(
        each(lambda i: i.items, step("w", lambda i, item: Do(what=item)), max_items=3),
        after=[first],
    )
    last = node(work("p", "last"), after=[lines])
    fails = node(work("q", "fails"), after=[last])


async def test_an_empty_fan_out_passes_its_dependencies_on() -> None:
    env = scripted(EmptyFan, participants=("p", "q"))
    env.participant("q").on(Do, reject="no")
    run = await env.start(EmptyFan, In(items=[]))
    assert await env.run_until_settled(run) == SagaStatus.COMPENSATED
    history: list[Any] = await run.history()
    assert started(history) == ["first", "last", "fails"]
    [plan] = [e for e in history if e.kind == "compensation_started"]
    # last depends on first through the empty fan-out: undone before it.
    assert plan.after == {"last": [], "first": ["last"]}
