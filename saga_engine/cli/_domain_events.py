"""``saga events``: the domain events an engine keeps for the sagas that wait for them,
through its admin API (``GET /domain-events``): newest first, ``--unmatched`` for those
no saga received (dropped unmatched when their source's retention passes)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from saga_engine.cli._common import AdminUrl, JsonOpt, admin_call, make_table, out, print_json

__all__ = ["commands"]

#: Added to the ``saga`` app without a name: ``saga events``.
commands = typer.Typer()


@commands.command("events")
def events(
    source: Annotated[str | None, typer.Option(help="One EventSource only (its name).")] = None,
    unmatched: Annotated[bool, typer.Option(help="Only those no saga received.")] = False,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="At most this many.")] = 50,
    admin_url: AdminUrl = None,
    as_json: JsonOpt = False,
) -> None:
    """Domain events kept for sagas to wait for (ctx.wait_event), newest first."""
    params = [("limit", str(limit)), ("unmatched", str(unmatched).lower())]
    if source is not None:
        params.append(("source", source))
    body: dict[str, Any] = admin_call(
        admin_url, lambda api: api.get("/domain-events", params=params)
    )
    if as_json:
        print_json(body)
        return
    if not body["enabled"]:
        out.print("this engine keeps no domain events")
        return
    rows = [
        (
            e["source"],
            e["key"],
            e["event_id"],
            e["received_at"],
            e["expires_at"],
            "yes" if e["matched"] else "no",
        )
        for e in body["events"]
    ]
    columns = ("source", "key", "event id", "received", "kept until", "matched")
    out.print(make_table("domain events", columns, rows, "ellipsis"))
