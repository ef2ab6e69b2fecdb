"""A graph saga's nodes as operators see them (``core/views/_graph_view``): each node's
state in one saga from its history (pending, running, done, skipped, failed, stopped,
stuck, undoing, undone; a fan-out's over its items, with counts), its latency from its
first command to its reply, and each declared node's latency over a window of runs."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel

from saga_engine import RetryPolicy, SagaStatus
from saga_engine.core.authoring._definition import SagaDefinition
from saga_engine.core.authoring._graph import fan_out_item
from saga_engine.core.views._graph_view import (
    NodeState,
    declared_graph,
    graph_insight,
    graph_state,
)
from saga_engine.core.views._insights import Counters
from saga_engine.core.views._view import saga_view_of
from saga_engine.graph import GraphSaga, each, node, step
from saga_engine.testing import SagaRun, SagaTestEnv
from tests.internal.unit.test_operator_actions import Cmd, Undo

ONCE = RetryPolicy(max_attempts=1)


class Order(BaseModel):
    gift: bool = False
    lines: list[str] = ["a", "b"]


class Done(BaseModel):
    pass


class Fulfil(GraphSaga[Order, Done]):
    name = "graph-view-fulfil"
    reserve = node(
        step("inventory", lambda o: Cmd(n=1), compensate=lambda o: Undo(n=1), compensate_retry=ONCE)
    )
    charge = node(step("payments", lambda o: Cmd(n=2), compensate=lambda o: Undo(n=2)))
    label = node(
        step("shipping", lambda o: Cmd(n=3), compensate=lambda o: Undo(n=3)),
        after=[reserve, charge],
    )
    gift = node(step("wrapping", lambda o: Cmd(n=4)), after=[reserve], when=lambda o: o.gift)
    lines = node(
        each(
            lambda o: o.lines,
            step("warehouse", lambda o, item: Cmd(n=5), compensate=lambda o, item: Undo(n=5)),
            max_items=10,
        ),
        after=[reserve],
    )
    notify = node(step("mailer", lambda o: Cmd(n=6)), after=[label, lines])


async def _states(env: SagaTestEnv, run: SagaRun) -> dict[str, NodeState]:
    events = await run.history()
    state = graph_state(Fulfil.graph, saga_view_of(events), events)
    return {n.node.name: n.state for n in state.nodes}


async def _graph(env: SagaTestEnv, run: SagaRun) -> dict[str, object]:
    events = await run.history()
    return graph_state(Fulfil.graph, saga_view_of(events), events).as_dict()


def test_the_definition_carries_the_declared_graph() -> None:
    definition = SagaDefinition.of(Fulfil)
    assert definition.graph is Fulfil.graph
    assert declared_graph(definition) is Fulfil.graph
    from tests.internal.unit.test_view_actions import Two

    assert SagaDefinition.of(Two).graph is None
    assert declared_graph(SagaDefinition.of(Two)) is None


def test_fan_out_items_are_named_by_their_node_and_index() -> None:
    assert fan_out_item("lines[3]") == ("lines", 3)
    assert fan_out_item("lines") is None
    assert fan_out_item("lines[x]") is None


async def test_a_run_under_way_then_done_with_latency_per_node() -> None:
    env = SagaTestEnv([Fulfil])
    env.hold(lambda c: c.participant == "payments")
    run = await env.start(Fulfil, Order())
    states = await _states(env, run)
    assert states == {
        "reserve": NodeState.DONE,
        "charge": NodeState.RUNNING,
        "label": NodeState.PENDING,
        "gift": NodeState.SKIPPED,
        "lines": NodeState.DONE,
        "notify": NodeState.PENDING,
    }
    await env.advance(timedelta(seconds=3))
    await env.release()
    assert await env.run_until_settled(run) == SagaStatus.COMPLETED
    graph = await _graph(env, run)
    nodes = {n["name"]: n for n in graph["nodes"]}  # type: ignore[attr-defined]
    assert {name: n["state"] for name, n in nodes.items()} == {
        "reserve": "done",
        "charge": "done",
        "label": "done",
        "gift": "skipped",
        "lines": "done",
        "notify": "done",
    }
    assert nodes["charge"]["latency_ms"] == 3000.0
    assert nodes["reserve"]["latency_ms"] == 0.0
    assert nodes["gift"]["latency_ms"] is None
    assert nodes["lines"]["items"] == {"done": 2}
    assert nodes["lines"]["attempts"] == 2
    assert nodes["label"]["after"] == ["reserve", "charge"]
    assert ["reserve", "label"] in graph["edges"]  # type: ignore[operator]


async def test_a_failure_undoes_what_was_done_and_names_the_failed_node() -> None:
    env = SagaTestEnv([Fulfil])
    env.participant("mailer").on(Cmd, reject="no mail today")
    run = await env.start(Fulfil, Order(gift=True))
    assert await env.run_until_settled(run) == SagaStatus.COMPENSATED
    graph = await _graph(env, run)
    nodes = {n["name"]: n for n in graph["nodes"]}  # type: ignore[attr-defined]
    assert {name: n["state"] for name, n in nodes.items()} == {
        "reserve": "undone",
        "charge": "undone",
        "label": "undone",
        "gift": "done",  # not compensable: it stays done
        "lines": "undone",
        "notify": "failed",
    }
    assert nodes["lines"]["items"] == {"undone": 2}


async def test_undoing_and_a_stuck_undo() -> None:
    env = SagaTestEnv([Fulfil])
    env.participant("mailer").on(Cmd, reject="no mail today")
    env.participant("inventory").on(Undo, reject="cannot release")
    env.hold(lambda c: c.participant == "warehouse" and c.command_type == "Undo")
    run = await env.start(Fulfil, Order())
    states = await _states(env, run)
    assert states["lines"] is NodeState.UNDOING
    assert states["label"] is NodeState.UNDONE
    assert states["reserve"] is NodeState.DONE  # its undo waits for the lines'
    await env.release()
    assert await env.run_until_settled(run) == SagaStatus.COMPENSATION_STUCK
    states = await _states(env, run)
    assert states["reserve"] is NodeState.STUCK
    assert states["lines"] is NodeState.UNDONE


async def test_a_node_in_flight_when_the_saga_stops_is_stopped_or_undone() -> None:
    env = SagaTestEnv([Fulfil])
    env.participant("payments").on(Cmd, reject="card declined")
    env.hold(lambda c: c.participant in ("wrapping", "warehouse") and c.command_type == "Cmd")
    run = await env.start(Fulfil, Order(gift=True, lines=["a"]))
    await env.release()
    assert await env.run_until_settled(run) == SagaStatus.COMPENSATED
    states = await _states(env, run)
    assert states["charge"] is NodeState.FAILED
    assert states["gift"] is NodeState.STOPPED  # in doubt, and it owes no undo
    assert states["lines"] is NodeState.UNDONE  # in doubt: compensated
    assert states["label"] is NodeState.PENDING
    assert states["notify"] is NodeState.PENDING


async def test_a_fan_out_of_no_items_is_done_once_what_follows_it_began() -> None:
    env = SagaTestEnv([Fulfil])
    run = await env.start(Fulfil, Order(lines=[]))
    assert await env.run_until_settled(run) == SagaStatus.COMPLETED
    states = await _states(env, run)
    assert states["lines"] is NodeState.DONE
    assert states["notify"] is NodeState.DONE


def test_a_fan_outs_latency_over_a_window_is_its_items() -> None:
    def timed(ms: float, attempts: int = 1) -> Counters:
        c = Counters(runs=1, attempts=attempts, successes=1)
        c.observe(ms)
        return c

    rows = [
        ("type", "completed", "", Counters(runs=2)),
        ("node", "reserve", "step", timed(40)),
        ("node", "lines[0]", "step", timed(150)),
        ("node", "lines[1]", "step", timed(180, attempts=2)),
        ("node", "elsewhere[0]", "step", timed(5)),
        ("error", "lines[0]", "boom", Counters(runs=1)),
    ]
    graph = graph_insight(Fulfil.graph, rows)
    nodes = {n["name"]: n for n in graph["nodes"]}
    assert nodes["reserve"]["latency_ms"] == {"p50": 50, "p95": 50, "p99": 50}
    assert nodes["lines"]["latency_ms"] == {"p50": 200, "p95": 200, "p99": 200}
    assert nodes["lines"]["attempts"] == 3
    assert nodes["lines"]["kind"] == "each"
    assert nodes["notify"]["latency_ms"] == {"p50": None, "p95": None, "p99": None}
    assert graph["edges"] == Fulfil.graph.as_dict()["edges"]
