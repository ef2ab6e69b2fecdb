"""``saga drill``: the fault harness, for your own sagas. It starts your engine workers
and participants on the local stack (or the servers the ``SAGA_*`` settings name), starts
sagas with inputs from your generator, injects a scenario's faults, drains, and checks
the invariants (see ``docs/operations.md``, "Drills")::

    saga drill --sagas myapp.sagas --participants myapp.services --scenario engine-kill \\
        --sagas-per-second 5 --duration 30 --inputs myapp.drill:inputs

Exit code 1 when an invariant broke (the table says which and why)."""

from __future__ import annotations

import importlib
import os
import sys
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from saga_engine.cli._common import JsonOpt, make_table, out, print_json, run_async, run_sync
from saga_engine.cli._drill_run import SCENARIOS, DrillPlan, DrillReport, run_drill
from saga_engine.cli._drill_stack import DrillStack, load_participants
from saga_engine.core.planning._replay import load_sagas
from saga_engine.kernel._errors import CliError
from saga_engine.kernel._settings import Settings

__all__ = ["commands"]

commands = typer.Typer()

EventsOpt = Annotated[
    str | None,
    typer.Option(
        "--events",
        help="module:function(input) returning the (EventSource, fact) pairs to publish "
        "after starting a saga (default: drill_events of the --participants module, if any).",
    ),
]
BrokerRestartOpt = Annotated[
    str | None,
    typer.Option(
        "--broker-restart",
        help="A command that restarts your Kafka broker (e.g. 'docker restart kafka'): "
        "what broker-restart runs at each fault, and mix after its other faults.",
    ),
]


@commands.command()
def drill(
    sagas: Annotated[str, typer.Option("--sagas", help="The module of your Saga classes.")],
    participants: Annotated[
        str,
        typer.Option(
            "--participants",
            help="A module with drill_participants(): {name: [python arguments]}.",
        ),
    ],
    scenario: Annotated[str, typer.Option("--scenario", help=f"One of {', '.join(SCENARIOS)}.")],
    inputs: Annotated[
        str | None,
        typer.Option(
            "--inputs",
            help="module:function returning an iterable of saga inputs "
            "(default: drill_inputs of the --participants module).",
        ),
    ] = None,
    events: EventsOpt = None,
    saga: Annotated[
        str | None, typer.Option("--saga", help="The saga type (default: the module's first).")
    ] = None,
    rate: Annotated[float, typer.Option("--sagas-per-second", min=0.1)] = 5.0,
    duration: Annotated[float, typer.Option("--duration", min=1, help="Seconds of load.")] = 30.0,
    engines: Annotated[int, typer.Option("--engines", min=1, max=8)] = 2,
    fault_every: Annotated[float, typer.Option("--fault-every", min=1)] = 5.0,
    drain_timeout: Annotated[float, typer.Option("--drain-timeout", min=1)] = 120.0,
    namespace: Annotated[
        str | None, typer.Option("--namespace", help="Topic prefix and schema prefix.")
    ] = None,
    broker_restart: BrokerRestartOpt = None,
    down_for: Annotated[
        float,
        typer.Option("--down-for", min=1, help="shard-down: seconds a shard stays down."),
    ] = 10.0,
    as_json: JsonOpt = False,
) -> None:
    """Run a fault drill against your sagas and participants; check the invariants."""
    if scenario not in SCENARIOS:
        raise typer.BadParameter(f"{scenario!r}: use one of {', '.join(SCENARIOS)}")
    stack, plan = run_sync(
        lambda: _prepare(
            sagas,
            participants,
            scenario,
            inputs or f"{participants}:drill_inputs",
            events,
            saga,
            namespace,
        )
    )
    plan = replace(
        plan,
        rate=rate,
        duration_s=duration,
        engines=engines,
        fault_every_s=fault_every,
        drain_timeout_s=drain_timeout,
        broker_restart=broker_restart,
        shard_down_s=down_for,
    )
    report = run_async(lambda: run_drill(stack, plan))
    _show(report, as_json, stack.logs)
    if not report.ok:
        raise typer.Exit(1)


def _prepare(
    sagas: str,
    participants: str,
    scenario: str,
    inputs: str,
    events: str | None,
    saga: str | None,
    namespace: str | None,
) -> tuple[DrillStack, DrillPlan]:
    """The processes to run and the plan, from the options (errors: one line)."""
    ns = namespace or f"drill_{uuid.uuid4().hex[:8]}"
    # The user's modules are imported here as in the drill's processes: with the drill's
    # namespace, so that what they derive from the settings at import (an EventSource's
    # or a trigger's topic) names the drill's topics in both.
    os.environ.update(SAGA_KAFKA__TOPIC_PREFIX=ns, SAGA_PG__DB_SCHEMA=f"{ns}_engine")
    found = load_participants(participants)
    # Their extra environment, for every process the drill starts (it inherits ours).
    os.environ.update(found.env)
    classes = load_sagas(sagas)
    if not classes:
        raise CliError(f"--sagas {sagas}: no Saga classes there")
    by_name = {c.name: c for c in classes}
    saga_type = saga or classes[0].name
    if saga_type not in by_name:
        raise CliError(f"--saga {saga_type}: not in {sorted(by_name)}")
    stack = DrillStack(
        settings=Settings(),
        namespace=ns,
        sagas_module=sagas,
        participants=found.args,
        logs=Path(".drill") / ns,
    )
    plan = DrillPlan(
        scenario=scenario,
        saga_type=saga_type,
        sagas=list(classes),
        inputs=iter(_hook("--inputs", inputs, "drill_inputs")()),
        events=_hook(
            "--events",
            events or f"{participants}:drill_events",
            "drill_events",
            optional=events is None,
        ),
        rate=5.0,
        duration_s=30.0,
    )
    return stack, plan


def _hook(option: str, spec: str, default: str, *, optional: bool = False) -> Any:
    """``module:function`` (the function ``default`` when only a module is named); None
    when ``optional`` and the module has no such function."""
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CliError(f"{option} {spec}: {exc}") from exc
    fn = getattr(module, attr or default, None)
    if fn is None and optional:
        return None
    if not callable(fn):
        raise CliError(f"{option} {spec}: {module_name} has no function {attr or default}")
    return fn


def _show(report: DrillReport, as_json: bool, logs: Path) -> None:
    if as_json:
        print_json(report.as_json())
        return
    rows = [(c.name, "ok" if c.ok else "BROKEN", c.detail) for c in report.checks]
    rows += [(k, "", "-" if v is None else f"{v:.2f}s") for k, v in report.timings.items()]
    # What the drill's link proxies counted: the faults were felt, the links came back.
    rows += [
        (f"link {name}", "", ", ".join(f"{k} {v}" for k, v in stats.items()))
        for name, stats in report.links.items()
    ]
    title = f"drill {report.scenario}: {report.started} sagas, {len(report.faults)} faults"
    out.print(make_table(title, ["check", "result", "detail"], rows))
    out.print(f"logs: {logs}")
