"""``saga keys``: per-key concurrency on an engine, through its admin API (``GET
/concurrency-keys``): per saga type and key, who holds a slot and who waits, FIFO."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from saga_engine.cli._common import AdminUrl, JsonOpt, admin_call, make_table, out, print_json

__all__ = ["commands"]

#: Added to the ``saga`` app without a name: ``saga keys``.
commands = typer.Typer()


@commands.command("keys")
def keys(
    saga_type: Annotated[str | None, typer.Option("--type", help="Only this saga type.")] = None,
    key: Annotated[str | None, typer.Option("--key", help="Only this key value.")] = None,
    admin_url: AdminUrl = None,
    as_json: JsonOpt = False,
) -> None:
    """Concurrency keys: the sagas holding each key's slots, then those queued for one."""
    params = [(k, v) for k, v in (("saga_type", saga_type), ("key", key)) if v is not None]
    body: dict[str, Any] = admin_call(
        admin_url, lambda api: api.get("/concurrency-keys", params=params)
    )
    if as_json:
        print_json(body)
        return
    if not body["slots"]:
        out.print("no concurrency key is held or waited for")
        return
    rows = [
        (
            s["saga_type"],
            s["key"],
            s["saga_id"],
            "holds" if s["held"] else f"queued #{s['position']}",
            str(s["limit"]),
            s["acquired_at"] or s["queued_at"],
        )
        for s in body["slots"]
    ]
    columns = ("type", "key", "saga", "state", "limit", "since")
    out.print(make_table("concurrency keys", columns, rows, "ellipsis"))
