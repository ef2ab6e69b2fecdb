"""The ``saga`` typer app, assembled: the root option (``--debug``), ``saga version``, and
the command groups (the package's docstring lists them), registered explicitly in the
order ``saga --help`` lists them."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from saga_engine.cli import (
    _batch_operations,
    _concurrency_keys,
    _conformance,
    _dlq,
    _domain_events,
    _drill,
    _flow,
    _flow_policy,
    _graph,
    _insights,
    _operator,
    _rollout,
    _schedule,
    _shard,
    _store,
    _updates,
    _worker,
)
from saga_engine.cli._common import Debug, JsonOpt, out, print_json
from saga_engine.kernel._input_types import text_problem
from saga_engine.kernel._serde import escaped
from saga_engine.kernel._version import __version__

__all__ = ["app", "main"]


class _TextArgs(TyperGroup):
    """Every argument is text the engine may store or send (a saga type, a reason, an
    id): one the admin API and Postgres would refuse (an unpaired surrogate, which is
    what bytes that are not UTF-8 become in ``sys.argv``, or a NUL) is a usage error
    naming it, by the one rule of ``kernel._input_types``, before any command runs."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        for arg in args:
            problem = text_problem(arg)
            if problem is not None:
                # BadParameter is a usage error: exit code 2, one line, no traceback.
                raise typer.BadParameter(f"{escaped(arg)!r} {problem}", ctx=ctx)
        parsed: Any = super().parse_args(ctx, args)
        return list(parsed)


app = typer.Typer(
    cls=_TextArgs,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Operate saga-engine: migrate the schema, inspect and replay sagas.",
)


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
) -> None:
    """saga-engine: durable sagas over Postgres and Kafka."""
    Debug.on = debug


@app.command()
def version(as_json: JsonOpt = False) -> None:
    """Print the installed version."""
    if as_json:
        print_json({"version": __version__})
    else:
        out.print(__version__)


# Without a name, a group's commands join the top level (typer merges them).
app.add_typer(_worker.commands)
app.add_typer(_store.commands)
app.add_typer(_operator.commands)
app.add_typer(_updates.commands)
app.add_typer(_flow.commands)
app.add_typer(_domain_events.commands)
app.add_typer(_concurrency_keys.commands)
app.add_typer(_insights.commands)
app.add_typer(_graph.commands)
app.add_typer(_dlq.dlq_app, name="dlq")
app.add_typer(_schedule.schedule_app, name="schedule")
app.add_typer(_rollout.rollout_app, name="rollout")
app.add_typer(_flow_policy.flow_policy_app, name="flow-policy")
app.add_typer(_batch_operations.batch_app, name="batch")
app.add_typer(_shard.shard_app, name="shard")
app.add_typer(_conformance.commands)
app.add_typer(_drill.commands)


def main() -> None:
    app()
