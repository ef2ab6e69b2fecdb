"""``saga update`` and ``saga query``: a saga's ``@update`` and ``@query`` methods,
through an engine's admin API (``POST /sagas/{id}/updates/{name}``, ``GET
/sagas/{id}/queries/{name}``). A refusal by the saga's state exits 4 with its reason, an
unknown name or a bad input 5 (the exit codes are in docs/operations.md)."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
import typer

from saga_engine.cli._common import (
    AdminApi,
    AdminUrl,
    JsonOpt,
    ReasonOpt,
    admin_call,
    fail,
    out,
    print_json,
    run_sync,
)
from saga_engine.kernel._errors import CliError

__all__ = ["commands"]

#: Added to the ``saga`` app without a name: ``saga update``, ``saga query``.
commands = typer.Typer()


def _object(text: str, what: str) -> dict[str, Any]:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise CliError(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise CliError(f"{what} must be a JSON object, not {type(value).__name__}")
    return value


@commands.command()
def update(
    saga_id: Annotated[str, typer.Argument(help="The saga's id.")],
    name: Annotated[str, typer.Argument(help="The update's name (its method's).")],
    input: Annotated[
        str, typer.Option("--input", help="The update's input: a JSON object.")
    ] = "{}",
    update_id: Annotated[
        str | None,
        typer.Option("--update-id", help="Sending the same id twice applies it once."),
    ] = None,
    reason: ReasonOpt = "",
    admin_url: AdminUrl = None,
    as_json: JsonOpt = False,
) -> None:
    """Call a saga's update and print its result.

    Checked before anything is recorded: an unknown update or a bad input is an error
    naming the field (exit 5); an update the saga's state refuses, or a saga that has
    ended, exits 4 with the reason. A handler that raised prints its error (exit 1)."""
    body: dict[str, Any] = {"input": run_sync(lambda: _object(input, "--input")), "reason": reason}
    if update_id is not None:
        body["update_id"] = update_id
    path = AdminApi.path("sagas", saga_id, "updates", name)
    answer = admin_call(admin_url, lambda api: api.post(path, body))
    if as_json:
        print_json(answer)
    elif answer.get("error") is None:
        out.print(
            f"update {name} ({answer.get('update_id')}) of {saga_id} by "
            f"{answer.get('principal', '?')}: {orjson.dumps(answer.get('result')).decode()}",
            highlight=False,
        )
    if answer.get("error") is not None:
        fail(f"update {name} failed: {answer['error'].get('message', '')}")


@commands.command()
def query(
    saga_id: Annotated[str, typer.Argument(help="The saga's id.")],
    name: Annotated[str, typer.Argument(help="The query's name (its method's).")],
    args: Annotated[
        str, typer.Option("--args", help="The query's arguments: a JSON object.")
    ] = "{}",
    admin_url: AdminUrl = None,
    as_json: JsonOpt = False,
) -> None:
    """Ask a saga's query; answered from its replayed state, nothing is written."""
    params = [("args", orjson.dumps(run_sync(lambda: _object(args, "--args"))).decode())]
    path = AdminApi.path("sagas", saga_id, "queries", name)
    answer = admin_call(admin_url, lambda api: api.get(path, params))
    if as_json:
        print_json(answer)
    else:
        out.print(
            orjson.dumps(answer.get("result"), option=orjson.OPT_INDENT_2).decode(), highlight=False
        )
