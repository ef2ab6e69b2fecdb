"""``saga schedule create|list|show|pause|resume|delete|trigger``: durable schedules,
through an engine's admin API (``_common.AdminApi``), so the CLI answers what the API
answers: a bad cron expression or input is exit code 5 with the field named, an unknown
schedule 3, a schedule already paused (or an id taken by another definition) 4.
"""

from __future__ import annotations

from typing import Annotated, Any

import orjson
import typer

from saga_engine.cli._common import (
    AdminApi,
    AdminUrl,
    JsonOpt,
    admin_call,
    make_table,
    out,
    print_json,
)
from saga_engine.core.planning._schedule import CatchUp, Overlap

__all__ = ["schedule_app"]

schedule_app = typer.Typer(
    no_args_is_help=True,
    help="Durable schedules: start a saga type on a cron expression or an interval.",
)

IdArg = Annotated[str, typer.Argument(help="The schedule's id.")]


def _path(schedule_id: str, *rest: str) -> str:
    return AdminApi.path("schedules", schedule_id, *rest)


def _show(row: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(row)
        return
    out.print(
        f"{row['id']}: {row['saga']} {row['spec']}, {row['state']}, next {row['next_fire_at']}, "
        f"last {row['last_tick'] or '-'} ({row['last_saga_id'] or 'none'}), "
        f"fired {row['fired_count']}, skipped {row['skipped_count']}",
        highlight=False,
        soft_wrap=True,
    )


@schedule_app.command("create")
def create(
    schedule_id: IdArg,
    saga: Annotated[str, typer.Option("--saga", help="The saga type to start.")],
    cron: Annotated[
        str | None, typer.Option("--cron", help="A cron expression, e.g. '0 3 * * *'.")
    ] = None,
    every: Annotated[
        float | None, typer.Option("--every", help="A fixed interval, in seconds.")
    ] = None,
    timezone: Annotated[str, typer.Option("--timezone", help="For --cron.")] = "UTC",
    input_json: Annotated[
        str, typer.Option("--input", help="The saga's input, as a JSON object.")
    ] = "{}",
    catchup: Annotated[CatchUp, typer.Option("--catchup")] = CatchUp.LAST,
    catchup_max: Annotated[int, typer.Option("--catchup-max")] = 10,
    overlap: Annotated[Overlap, typer.Option("--overlap")] = Overlap.SKIP,
    admin_url: AdminUrl = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a schedule (the same definition again changes nothing)."""
    try:
        payload = orjson.loads(input_json)
    except orjson.JSONDecodeError as exc:
        raise typer.BadParameter(f"not JSON: {exc}", param_hint="--input") from None
    body: dict[str, Any] = {
        "id": schedule_id,
        "saga": saga,
        "timezone": timezone,
        "input": payload,
        "catchup": catchup.value,
        "catchup_max": catchup_max,
        "overlap": overlap.value,
    }
    if cron is not None:
        body["cron"] = cron
    if every is not None:
        body["every_s"] = every
    _show(admin_call(admin_url, lambda api: api.post("/schedules", body)), as_json)


@schedule_app.command("list")
def list_schedules(
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000)] = 100,
    admin_url: AdminUrl = None,
    as_json: JsonOpt = False,
) -> None:
    """List the schedules, with their next and last runs."""
    rows = admin_call(admin_url, lambda api: api.get("/schedules", [("limit", str(limit))]))
    if as_json:
        print_json(rows)
        return
    cells = [
        (
            r["id"],
            r["saga"],
            r["spec"],
            r["state"],
            r["next_fire_at"],
            r["last_tick"] or "",
            r["last_saga_id"] or "",
            str(r["fired_count"]),
        )
        for r in rows
    ]
    columns = ("id", "saga", "spec", "state", "next", "last tick", "last saga", "fired")
    out.print(make_table(f"{len(rows)} schedule(s)", columns, cells, "ellipsis"))


@schedule_app.command("show")
def show(schedule_id: IdArg, admin_url: AdminUrl = None, as_json: JsonOpt = False) -> None:
    """Show one schedule."""
    _show(admin_call(admin_url, lambda api: api.get(_path(schedule_id))), as_json)


@schedule_app.command("pause")
def pause(schedule_id: IdArg, admin_url: AdminUrl = None, as_json: JsonOpt = False) -> None:
    """Stop firing the schedule."""
    _show(admin_call(admin_url, lambda api: api.post(_path(schedule_id, "pause"), {})), as_json)


@schedule_app.command("resume")
def resume(schedule_id: IdArg, admin_url: AdminUrl = None, as_json: JsonOpt = False) -> None:
    """Fire again from the next tick (the paused ticks are not caught up)."""
    _show(admin_call(admin_url, lambda api: api.post(_path(schedule_id, "resume"), {})), as_json)


@schedule_app.command("delete")
def delete(schedule_id: IdArg, admin_url: AdminUrl = None) -> None:
    """Delete the schedule (the sagas it started stay)."""
    admin_call(admin_url, lambda api: api.call("DELETE", _path(schedule_id)))
    out.print(f"deleted schedule {schedule_id}", highlight=False)


@schedule_app.command("trigger")
def trigger(schedule_id: IdArg, admin_url: AdminUrl = None, as_json: JsonOpt = False) -> None:
    """Fire the schedule once now, outside its spec; prints the saga's id."""
    result = admin_call(admin_url, lambda api: api.post(_path(schedule_id, "trigger"), {}))
    if as_json:
        print_json(result)
    else:
        out.print(result["saga_id"], highlight=False)
