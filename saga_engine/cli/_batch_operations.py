"""``saga batch start|list|show|cancel``: batch operations (one operator action on every
saga a filter matches), through an engine's admin API (``_common.AdminApi``), so the CLI
answers what the API answers: a bad filter, action, signal or reason is exit code 5 with
the field named, an unknown operation 3, cancelling one that has ended 4.

``start`` and ``show --follow`` follow the operation with a progress bar until it ends.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import orjson
import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from saga_engine.cli._common import (
    AdminApi,
    AdminUrl,
    JsonOpt,
    ReasonOpt,
    admin_call,
    make_table,
    out,
    print_json,
)
from saga_engine.core.history._status import SagaStatus
from saga_engine.core.planning._batch_operations import BatchAction

__all__ = ["batch_app"]

batch_app = typer.Typer(
    no_args_is_help=True,
    help="Batch operations: cancel, signal, retry, resume or rerun every saga a filter matches.",
)

IdArg = Annotated[str, typer.Argument(help="The operation's id.")]
FollowOpt = Annotated[
    bool, typer.Option("--follow/--no-follow", help="Show its progress until it ends.")
]
#: How often a followed operation is read again.
_POLL_S = 0.25


def _path(operation_id: str, *rest: str) -> str:
    return AdminApi.path("batch-operations", operation_id, *rest)


def _line(row: dict[str, Any]) -> str:
    return (
        f"{row['id']}: {row['action']} by {row['principal']}, {row['state']}, "
        f"{row['done']}/{row['total']} (acted {row['acted']}, skipped {row['skipped']}, "
        f"failed {row['failed']})"
    )


def _show(row: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(row)
        return
    out.print(_line(row), highlight=False, soft_wrap=True)
    for error in row["errors"][:10]:
        out.print(f"  {error['saga_id']}: {error['error']}", highlight=False, soft_wrap=True)


def _follow(admin_url: str | None, row: dict[str, Any]) -> dict[str, Any]:
    """Reads the operation again until it ends, drawing its progress."""
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    path = _path(row["id"])
    with Progress(*columns, console=out, transient=False) as progress:
        task = progress.add_task(f"{row['action']} {row['id'][:8]}", total=max(row["total"], 1))
        while True:
            progress.update(task, completed=row["done"], total=max(row["total"], row["done"], 1))
            if row["state"] != "running":
                return row
            time.sleep(_POLL_S)
            row = admin_call(admin_url, lambda api: api.get(path))


def _filter(
    saga_type: str | None, status: list[SagaStatus] | None, q: str | None, attr: list[str]
) -> dict[str, Any]:
    where: dict[str, Any] = {}
    if saga_type is not None:
        where["saga_type"] = saga_type
    if status:
        where["statuses"] = [s.value for s in status]
    if q is not None:
        where["q"] = q
    attributes = {}
    for item in attr:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise typer.BadParameter(f"{item!r}: use NAME=VALUE", param_hint="--attr")
        attributes[name] = value
    if attributes:
        where["attributes"] = attributes
    return where


@batch_app.command("start")
def start(
    action: Annotated[BatchAction, typer.Option("--action", help="What to do to each saga.")],
    reason: ReasonOpt,
    saga_type: Annotated[str | None, typer.Option("--type", help="The saga type.")] = None,
    status: Annotated[
        list[SagaStatus] | None, typer.Option("--status", help="Repeat for several.")
    ] = None,
    q: Annotated[str | None, typer.Option("--q", help="An id prefix or a key.")] = None,
    attr: Annotated[
        list[str] | None, typer.Option("--attr", help="A search attribute, NAME=VALUE.")
    ] = None,
    signal: Annotated[str | None, typer.Option("--signal", help="For --action signal.")] = None,
    payload: Annotated[str, typer.Option("--payload", help="The signal's payload (JSON).")] = "{}",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only count the sagas.")] = False,
    follow: FollowOpt = True,
    admin_url: AdminUrl = None,
    as_json: JsonOpt = False,
) -> None:
    """Start a batch operation (``--dry-run``: count the sagas it would act on)."""
    try:
        body_payload = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise typer.BadParameter(f"not JSON: {exc}", param_hint="--payload") from None
    body: dict[str, Any] = {
        "filter": _filter(saga_type, status, q, attr or []),
        "action": action.value,
        "reason": reason,
        "dry_run": dry_run,
    }
    if signal is not None or body_payload:
        body["signal"], body["payload"] = signal, body_payload
    row = admin_call(admin_url, lambda api: api.post("/batch-operations", body))
    if dry_run:
        if as_json:
            print_json(row)
        else:
            out.print(f"{row['matched']} saga(s) match", highlight=False)
        return
    if follow and not as_json:
        row = _follow(admin_url, row)
    _show(row, as_json)


@batch_app.command("list")
def list_batches(
    limit: Annotated[int, typer.Option("--limit", min=1, max=500)] = 50,
    admin_url: AdminUrl = None,
    as_json: JsonOpt = False,
) -> None:
    """List the batch operations, newest first."""
    rows = admin_call(admin_url, lambda api: api.get("/batch-operations", [("limit", str(limit))]))
    if as_json:
        print_json(rows)
        return
    cells = [
        (
            r["id"],
            r["action"],
            r["state"],
            f"{r['done']}/{r['total']}",
            str(r["failed"]),
            r["principal"],
            r["created_at"],
        )
        for r in rows
    ]
    columns = ("id", "action", "state", "done", "failed", "by", "created")
    out.print(make_table(f"{len(rows)} operation(s)", columns, cells, "ellipsis"))


@batch_app.command("show")
def show(
    operation_id: IdArg,
    follow: Annotated[
        bool, typer.Option("--follow", help="Show its progress until it ends.")
    ] = False,
    admin_url: AdminUrl = None,
    as_json: JsonOpt = False,
) -> None:
    """Show one operation and its progress."""
    row = admin_call(admin_url, lambda api: api.get(_path(operation_id)))
    if follow and not as_json:
        row = _follow(admin_url, row)
    _show(row, as_json)


@batch_app.command("cancel")
def cancel(operation_id: IdArg, admin_url: AdminUrl = None, as_json: JsonOpt = False) -> None:
    """Stop the operation (the sagas acted on stay as they are)."""
    _show(admin_call(admin_url, lambda api: api.post(_path(operation_id, "cancel"), {})), as_json)
