"""Property tests of graph sagas: random DAGs driven through ``SagaRuntime`` by a world.

Hypothesis draws a graph (``graphs.py``: up to 30 nodes, conditional nodes, bounded
fan-outs, nodes without compensation) and what happens to it: which participant
refuses its node, replies in any order (sometimes twice, sometimes retryable),
compensations that fail for a while, timers firing (attempt timeouts, back-offs, a
deadline) and a cancel (or an operator forcing compensation) at some point. The oracles
read only the declared graph and the history, never the runtime's bookkeeping, and
check:

1. every node's first command (or its skip) comes after every node it depends on is
   done (a skipped node counts as done; an empty fan-out is done with its dependencies);
   a completed saga ran every node whose condition held and skipped the others;
2. compensation follows the reverse partial order: a step's compensation is sent only
   after the compensations of every owed step of a node that depends on it, directly or
   through other nodes, completed; the plan ``compensation_started.after`` records is
   that order exactly; independent compensations do overlap (in some runs: asserted
   over the whole run of examples, not per example);
3. only (possibly) applied steps are owed and compensated: a success reply, or a command
   whose outcome is unknown (in flight, timed out); a refused or retryable command id
   applied nothing. A saga that ends compensated or cancelled compensated every one;
4. the history replays exactly: at the end (through JSON, as from a store), and from a
   snapshot part-way, driven on in lockstep with the live runtime.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta

from hypothesis import event, given, settings, target
from hypothesis import strategies as st

from saga_engine.core.history._decision import Cancel, ForceCompensate, Reply, Resume, StartSaga
from saga_engine.core.history._events import (
    CommandIssued,
    CompensationCompleted,
    CompensationIssued,
    CompensationStarted,
    Event,
    NodeSkipped,
    ReplyReceived,
    SagaCancelled,
    SagaCompensated,
    SagaCompleted,
    SagaFailed,
    event_to_dict,
    events_from_list,
)
from saga_engine.core.history._status import SagaStatus
from saga_engine.core.runtime._runtime import SagaRuntime
from tests.internal.property.graphs import (
    GraphShape,
    NodeShape,
    graph_definition,
    graph_shapes,
    node_of,
)
from tests.internal.property.test_runtime_properties import PROPERTY
from tests.internal.property.world import T0, World

S = SagaStatus

#: The runtime tests' settings, with more examples: one is cheap (about 0.1 s).
GRAPH_PROPERTY = settings(PROPERTY, max_examples=int(os.environ.get("SAGA_GRAPH_EXAMPLES", "120")))

#: Inputs a run of 30 nodes (fan-outs, retries, compensations) may need to end.
MAX_INPUTS = 4000
DEADLINES = [None, None, None, timedelta(seconds=45), timedelta(seconds=120)]


# --------------------------------------------------------------------------- the world


@dataclass(frozen=True)
class Script:
    """What the participants and the operator do in one run."""

    #: The node whose participant refuses it (None: nobody refuses).
    refused: str | None
    #: Compensations sometimes fail (retryable or refused) before they succeed.
    troubled_undo: bool
    #: After how many random inputs someone cancels (None: nobody).
    cancel_after: int | None
    #: The operator forces compensation instead of cancelling.
    force: bool = False


def _outcome(world: World, data: st.DataObject, script: Script, cmd_step: str, comp: bool) -> str:
    if not comp and node_of(cmd_step) == script.refused:
        return "failure"
    if comp:
        choices = ["success"] * 4 + (["retryable", "failure"] if script.troubled_undo else [])
    else:
        choices = ["success"] * 8 + ["retryable"]
    return data.draw(st.sampled_from(choices), label="outcome")


def _reply(command_id: str, outcome: str, world: World) -> Reply:
    error = None if outcome == "success" else f"{outcome} from the world"
    return Reply(command_id, outcome, world.tick(), payload={"outcome": outcome}, error=error)  # type: ignore[arg-type]


def _random_step(world: World, data: st.DataObject, script: Script) -> bool:
    """One thing happens; False when nothing could."""
    out = world.rt.outstanding_commands()
    timers = world.sorted_timers()
    kinds = ["reply"] * 8 * bool(out) + ["timer"] * 2 * bool(timers)
    if not kinds:
        return False
    if data.draw(st.sampled_from(kinds), label="action") == "timer":
        timer_id, fire_at = timers[data.draw(st.integers(0, len(timers) - 1), label="timer")]
        world.fire("timer", timer_id, fire_at)
        return True
    cmd = out[data.draw(st.integers(0, len(out) - 1), label="which command replies")]
    reply = _reply(cmd.command_id, _outcome(world, data, script, cmd.step, cmd.compensation), world)
    world.deliver("reply", reply)
    if data.draw(st.sampled_from([False] * 5 + [True]), label="reply delivered twice"):
        world.deliver("duplicate", reply)
    return True


def _drain(world: World, script: Script) -> None:
    """Every command answered (the refused node still refused, the rest succeed), every
    timer fired and every stuck compensation resumed, until nothing is left."""
    while True:
        out = world.rt.outstanding_commands()
        timers = world.sorted_timers()
        stuck = world.rt.status == S.COMPENSATION_STUCK
        if not (out or timers or stuck):
            return
        if len(world.deliveries) >= world.max_inputs:
            raise AssertionError(f"saga still {world.rt.status.value} after {MAX_INPUTS} inputs")
        if out:
            cmd = out[0]
            refused = not cmd.compensation and node_of(cmd.step) == script.refused
            world.deliver(
                "drain_reply", _reply(cmd.command_id, "failure" if refused else "success", world)
            )
        elif timers:
            world.fire("drain_timer", *timers[0])
        else:
            world.deliver("drain_resume", Resume(world.tick(), "operator", "drain"))


def begin_graph(shape: GraphShape, deadline: timedelta | None = None) -> World:
    definition = graph_definition(shape)
    start = StartSaga(
        saga_id="graph-1",
        saga_type=definition.name,
        input=shape.input().model_dump(mode="json"),
        at=T0,
        deadline_at=T0 + deadline if deadline is not None else None,
    )
    rt, decision = SagaRuntime.start(definition, start)
    world = World(definition, rt, decision, T0, sent=list(decision.commands))
    world.start_timers = rt.pending_timers()
    world.max_inputs = MAX_INPUTS
    return world


def simulate_graph(shape: GraphShape, data: st.DataObject, *, snapshots: bool) -> World:
    names = [n.name for n in shape.nodes]
    script = Script(
        refused=data.draw(st.sampled_from([None, *names]), label="refused node"),
        troubled_undo=data.draw(st.booleans(), label="compensations fail for a while"),
        cancel_after=data.draw(st.sampled_from([None, None, 0, 3, 10, 25]), label="cancel after"),
        force=data.draw(st.sampled_from([False, False, True]), label="force instead of cancel"),
    )
    world = begin_graph(shape, data.draw(st.sampled_from(DEADLINES), label="deadline"))
    budget = data.draw(st.integers(0, 150), label="random inputs")
    snap_at = data.draw(st.integers(0, 60), label="snapshot after") if snapshots else -1
    for i in range(budget):
        if snapshots and len(world.deliveries) >= snap_at and not world.snapshots:
            world.snapshot()
        if i == script.cancel_after and script.force:
            world.deliver("force", ForceCompensate("undo it all", world.tick(), "operator"))
        elif i == script.cancel_after:
            world.deliver("cancel", Cancel("the world changed its mind", world.tick(), "tester"))
        if not _random_step(world, data, script):
            break
    if snapshots and not world.snapshots:
        world.snapshot()
    _drain(world, script)
    return world


# --------------------------------------------------------------------------- the oracle


@dataclass
class GraphReport:
    problems: list[str] = field(default_factory=list)
    #: Steps owed a compensation (compensation_started's), and those the oracle expects.
    owed: list[str] | None = None
    expected_owed: set[str] = field(default_factory=set)
    #: Where each step's compensation was first sent, and where it completed.
    undo_sent_at: dict[str, int] = field(default_factory=dict)
    undo_done_at: dict[str, int] = field(default_factory=dict)
    #: Pairs of compensations that were in flight at once.
    overlaps: int = 0
    end: str = ""


def _ran_forward(history: list[Event]) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """Per step: its first command, its success reply; per node: where it was skipped."""
    first: dict[str, int] = {}
    success: dict[str, int] = {}
    skipped: dict[str, int] = {}
    for i, e in enumerate(history):
        if isinstance(e, CommandIssued):
            first.setdefault(e.step, i)
        elif isinstance(e, ReplyReceived) and not e.compensation and e.outcome == "success":
            success.setdefault(e.step, i)
        elif isinstance(e, NodeSkipped):
            skipped.setdefault(e.node, i)
    return first, success, skipped


def _done_at(shape: GraphShape, history: list[Event]) -> dict[str, int | None]:
    """Where each node was done (None: never): its skip, its step's success, its last
    item's success; an empty fan-out is done where the last of its dependencies was."""
    _, success, skipped = _ran_forward(history)
    done: dict[str, int | None] = {}
    for n in shape.nodes:  # dependencies first
        deps = [done[d] for d in n.after]
        if n.name in skipped:
            done[n.name] = skipped[n.name]
        elif n.fan_out is not None and n.items == 0 and n.runs is not False:
            done[n.name] = None if None in deps else max([0, *deps])  # type: ignore[type-var]
        else:
            steps = n.steps()
            at = [success.get(s) for s in steps]
            done[n.name] = None if not steps or None in at else max(at)  # type: ignore[type-var]
    return done


def check_forward(shape: GraphShape, history: list[Event], report: GraphReport) -> None:
    first, _, skipped = _ran_forward(history)
    done = _done_at(shape, history)
    began: dict[str, int] = {}
    for step, i in first.items():
        began[node_of(step)] = min(i, began.get(node_of(step), i))
    for name, i in skipped.items():
        began[name] = i
    for n in shape.nodes:
        if n.name not in began:
            continue
        for dep in n.after:
            at = done[dep]
            if at is None or at >= began[n.name]:
                report.problems.append(
                    f"node {n.name!r} began at #{began[n.name] + 1} before its dependency "
                    f"{dep!r} was done (at {None if at is None else at + 1})"
                )
        if n.runs is False and any(node_of(s) == n.name for s in first):
            report.problems.append(f"node {n.name!r} ran though its condition was false")
        if n.name in skipped and n.runs is not False:
            report.problems.append(f"node {n.name!r} was skipped though its condition held")
    if any(isinstance(e, SagaCompleted) for e in history):
        for n in shape.nodes:
            if done[n.name] is None or (n.name in skipped) != (n.runs is False):
                report.problems.append(f"completed, but node {n.name!r} was not done as declared")


def _possibly_applied(shape: GraphShape, history: list[Event]) -> set[str]:
    """Compensable steps one of whose command ids got a success reply or no answer at all
    (in flight, or timed out) before the run ended; a failure or retryable reply says
    nothing was applied under that id."""
    ids: dict[str, str] = {}
    answered: dict[str, str] = {}
    for e in history:
        if isinstance(e, CompensationStarted | SagaFailed | SagaCompleted):
            break
        if isinstance(e, CommandIssued) and e.compensation is not None:
            ids[e.command_id] = e.step
        elif (
            isinstance(e, ReplyReceived)
            and not e.compensation
            and e.command_id in ids
            and answered.get(e.command_id) != "success"
        ):
            answered[e.command_id] = e.outcome
    compensable = {n.name for n in shape.nodes if n.compensable}
    return {
        step
        for cid, step in ids.items()
        if node_of(step) in compensable and answered.get(cid, "success") == "success"
    }


def _closure(plan: dict[str, list[str]]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}

    def visit(step: str) -> set[str]:
        if step not in found:
            found[step] = set()
            for later in plan.get(step, ()):
                found[step] |= {later} | visit(later)
        return found[step]

    for step in plan:
        visit(step)
    return found


def check_undo(shape: GraphShape, history: list[Event], report: GraphReport) -> None:
    problems = report.problems
    descendants = shape.descendants()
    report.expected_owed = _possibly_applied(shape, history)
    started_at = None
    in_flight: set[str] = set()
    for i, e in enumerate(history):
        if isinstance(e, CompensationStarted):
            if started_at is not None:
                problems.append(f"#{i + 1}: a second compensation_started")
            started_at, report.owed = i, list(e.owed)
            if set(e.owed) != report.expected_owed:
                problems.append(
                    f"#{i + 1}: compensation_started owes {sorted(e.owed)}, expected "
                    f"{sorted(report.expected_owed)} (the possibly applied compensable steps)"
                )
            _check_plan(e, descendants, problems)
        elif isinstance(e, CommandIssued) and started_at is not None:
            problems.append(f"#{i + 1}: step {e.step!r} sent after compensation began")
        elif isinstance(e, CompensationIssued):
            if started_at is None or e.step not in (report.owed or ()):
                problems.append(f"#{i + 1}: compensation of {e.step!r}, which is not owed")
            if e.step not in report.undo_sent_at:
                report.undo_sent_at[e.step] = i
                report.overlaps += len(in_flight)
                in_flight.add(e.step)
        elif isinstance(e, CompensationCompleted):
            if e.step in report.undo_done_at:
                problems.append(f"#{i + 1}: compensation of {e.step!r} completed twice")
            report.undo_done_at[e.step] = i
            in_flight.discard(e.step)
    owed = report.owed or []
    for x in owed:
        sent = report.undo_sent_at.get(x)
        if sent is None:
            continue
        for y in owed:
            if node_of(y) in descendants[node_of(x)]:
                done = report.undo_done_at.get(y)
                if done is None or done > sent:
                    problems.append(
                        f"compensation of {x!r} sent at #{sent + 1} before that of {y!r} "
                        f"(a node depending on it) completed (at {done})"
                    )
    ends = [e for e in history if isinstance(e, SagaCompensated | SagaCancelled | SagaFailed)]
    undone = set(report.undo_done_at)
    if (
        ends
        and isinstance(ends[-1], SagaCompensated | SagaCancelled)
        and (undone != set(owed) or set(owed) != report.expected_owed)
    ):
        problems.append(
            f"ended {ends[-1].kind} after completing {sorted(report.undo_done_at)}, "
            f"owed {sorted(owed)}"
        )
    if ends and isinstance(ends[-1], SagaFailed) and report.expected_owed:
        problems.append(f"failed without compensating {sorted(report.expected_owed)}")


def _check_plan(
    started: CompensationStarted, descendants: dict[str, set[str]], problems: list[str]
) -> None:
    """The recorded plan is the graph's order: each owed step waits, directly or through
    others, for exactly the owed steps of the nodes that depend on it."""
    if started.after is None:
        problems.append("compensation_started records no plan")
        return
    reach = _closure(started.after)
    for x in started.owed:
        want = {y for y in started.owed if node_of(y) in descendants[node_of(x)]}
        if reach.get(x, set()) != want:
            problems.append(
                f"the plan undoes {x!r} after {sorted(reach.get(x, set()))}; the graph says "
                f"after {sorted(want)}"
            )


def check_graph_history(shape: GraphShape, history: list[Event]) -> GraphReport:
    report = GraphReport()
    check_forward(shape, history, report)
    check_undo(shape, history, report)
    return report


# --------------------------------------------------------------------------- replay


def _json_roundtrip(history: list[Event]) -> list[Event]:
    return events_from_list([event_to_dict(e) for e in history])


def check_replays(world: World) -> None:
    rt = world.rt
    replayed, decision = SagaRuntime.replay(
        world.definition, rt.saga_id, _json_roundtrip(rt.history)
    )
    try:
        assert decision.nondeterminism is None, str(decision.nondeterminism)
        assert decision.events == []
        assert decision.commands == []
        assert replayed.status == rt.status == decision.status
        assert replayed.outstanding_commands() == rt.outstanding_commands()
        assert replayed.pending_timers() == rt.pending_timers()
        assert replayed.history == rt.history
    finally:
        replayed.close()
    for snap in world.snapshots:
        assert snap.replay_decision.nondeterminism is None, str(snap.replay_decision.nondeterminism)
        assert snap.replay_decision.events == []
        assert snap.replay_decision.commands == []
        assert snap.replayed_status == snap.status
        assert snap.replayed_outstanding == snap.outstanding
        assert snap.replayed_timers == snap.timers
        assert snap.replayed_history == snap.history == rt.history[: len(snap.history)]
    for shadow in world.shadows:
        assert shadow.history == rt.history
        assert shadow.status == rt.status
    assert world.mismatches == []


# --------------------------------------------------------------------------- the tests


def test_random_graphs_run_in_order_undo_in_reverse_and_replay() -> None:
    """The properties above on every example; over the whole run, independent
    compensations overlapped, and the runs went every way (completed, compensated,
    cancelled, failed with nothing to undo, refused nodes, timeouts)."""
    seen: Counter[str] = Counter()

    @GRAPH_PROPERTY
    @given(shape=graph_shapes(empty_fan_outs=True), data=st.data())
    def run(shape: GraphShape, data: st.DataObject) -> None:
        world = simulate_graph(shape, data, snapshots=True)
        rt = world.rt
        assert rt.status.is_terminal, f"ended {rt.status.value}"
        report = check_graph_history(shape, rt.history)
        assert report.problems == []
        check_replays(world)
        seen[f"ended {rt.status.value}"] += 1
        event(f"ended {rt.status.value}")
        if report.owed:
            seen["compensated something"] += 1
        if report.overlaps:
            seen["compensations overlapped"] += 1
            event("independent compensations overlapped")
        if any(isinstance(e, NodeSkipped) for e in rt.history):
            seen["a node skipped"] += 1
        if any(e.kind == "attempt_timed_out" for e in rt.history):
            seen["an attempt timed out"] += 1
        if any(e.kind == "compensation_forced" for e in rt.history):
            seen["compensation forced"] += 1
        target(float(report.overlaps), label="compensations in flight at once")
        rt.close()

    run()
    for what in (
        "ended completed",
        "ended compensated",
        "ended cancelled",
        "compensations overlapped",
        "a node skipped",
        "an attempt timed out",
    ):  # (a forced compensation is rarer: counted by hypothesis's events, not required)
        assert seen[what] > 0, f"no example {what}: {dict(seen)}"


def test_a_node_after_an_empty_fan_out_is_undone_before_the_fan_outs_dependencies() -> None:
    """reserve -> lines (each, no items) -> label -> ship (refused): label's compensation
    must complete before reserve's is sent, as if the empty fan-out were any done node."""
    shape = GraphShape(
        (
            NodeShape("n0", (), compensable=True, runs=None),
            NodeShape("n1", ("n0",), compensable=True, runs=None, fan_out=2, items=0),
            NodeShape("n2", ("n1",), compensable=True, runs=None),
            NodeShape("n3", ("n2",), compensable=True, runs=None),
        )
    )
    world = begin_graph(shape)
    _drain(world, Script(refused="n3", troubled_undo=False, cancel_after=None))
    assert world.rt.status == S.COMPENSATED
    report = check_graph_history(shape, world.rt.history)
    assert report.owed == ["n2", "n0"]
    assert report.problems == []
