"""The operator commands of the ``saga`` CLI: ``list``, ``show``, ``history``, ``signal``,
``cancel``, ``retry``, ``skip``, ``rerun``, ``force-compensate`` and ``resume``. Each goes through an
engine's admin API (``_common.AdminApi``), so every action is checked, recorded and
audited where the API does it; the exit codes are in docs/operations.md."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

import orjson
import typer
from rich.table import Table

from saga_engine.cli._common import (
    AdminApi,
    AdminUrl,
    JsonOpt,
    ReasonOpt,
    admin_call,
    field_table,
    make_table,
    out,
    print_json,
    run_sync,
)
from saga_engine.core.history._status import SagaStatus
from saga_engine.kernel._errors import CliError

__all__ = ["commands"]

#: Added to the ``saga`` app without a name: ``saga list``, ``saga show``, ...
commands = typer.Typer()


class ListSort(StrEnum):
    ACTIVITY = "activity"
    ID = "id"


@commands.command("list")
def list_sagas(
    status: Annotated[
        list[SagaStatus] | None,
        typer.Option("--status", help="Only sagas in this status (repeat for several)."),
    ] = None,
    saga_type: Annotated[str | None, typer.Option("--type", help="Only this saga type.")] = None,
    search: Annotated[
        str | None, typer.Option("--q", help="A saga id (or its start), or an idempotency key.")
    ] = None,
    where: Annotated[
        list[str] | None,
        typer.Option("--where", help="A search attribute: name=value (repeat for several)."),
    ] = None,
    sort: Annotated[
        ListSort,
        typer.Option(
            "--sort", help="activity: last activity, newest first (ended, or last changed); id."
        ),
    ] = ListSort.ACTIVITY,
    roots: Annotated[
        bool, typer.Option("--roots", help="Only sagas no other saga started (no children).")
    ] = False,
    limit: Annotated[int, typer.Option("--limit", min=1, max=500)] = 50,
    wide: Annotated[
        bool, typer.Option("--wide", help="Also version, step, next wake-up, parent, error.")
    ] = False,
    admin_url: AdminUrl = None,
    as_json: JsonOpt = False,
) -> None:
    """List sagas (newest activity first, or in id order), filtered, from an engine's
    admin API: counts per status, then one row per saga with what it waits for."""
    params = [("limit", str(limit)), ("sort", sort.value)]
    params += [("status", s.value) for s in status or ()]
    params += [("type", saga_type)] if saga_type else []
    params += [("q", search)] if search else []
    params += [("roots", "true")] if roots else []
    for clause in where or ():
        name, sep, value = clause.partition("=")
        if not sep or not name.strip():
            raise typer.BadParameter("use name=value", param_hint="--where")
        params.append((name.strip(), value))
    page = admin_call(admin_url, lambda api: api.get("/sagas", params))
    if as_json:
        print_json(page["items"])
        return
    out.print(_list_table(page, wide))


def _list_table(page: dict[str, Any], wide: bool) -> Table:
    rows = page["items"]
    counts = "  ".join(
        f"{c['status']} {c['count']}{'+' if c['at_least'] else ''}"
        for c in page.get("counts") or ()
    )
    table = Table(
        title=f"{len(rows)} saga(s)"
        + (" (more: raise --limit)" if page.get("next_cursor") else ""),
        caption=counts or None,
    )
    # Ids whole, on one line, at any terminal width: an operator copies them into
    # `saga show`. The other columns fold instead.
    longest = max((len(r["saga_id"]) for r in rows), default=2)
    table.add_column("id", no_wrap=True, min_width=longest, overflow="ignore")
    names = ["type", "status", "waiting for", "last activity"]
    names += ["version", "step", "next wake-up", "parent", "error"] if wide else []
    for column in names:
        table.add_column(column, overflow="fold")
    for r in rows:
        error = r.get("error") or {}
        waits = "; ".join(w["what"] for w in r.get("waiting_for") or ())
        cells = [r["saga_id"], r["saga_type"], r["status"], waits, r.get("activity_at") or ""]
        if wide:
            cells += [
                str(r.get("saga_version", 1)),
                r.get("current_step") or "",
                r.get("next_wakeup") or "",
                r.get("parent_id") or "",
                f"{error.get('type', '')}: {error.get('message', '')}" if error else "",
            ]
        table.add_row(*cells)
    return table


@commands.command()
def show(
    saga_id: Annotated[str, typer.Argument(help="The saga's id.")],
    admin_url: AdminUrl = None,
    as_json: JsonOpt = False,
) -> None:
    """Show a saga: status, input, output or error, what it waits for, its children,
    owed compensations."""
    saga = admin_call(admin_url, lambda api: api.get(_saga(saga_id)))
    if as_json:
        print_json(saga)
        return
    out.print(_fields(saga))
    _print_payloads(saga)
    kids = saga.get("children") or []
    if kids:
        rows = [
            (c["step"], c["saga_type"], c["saga_id"], c.get("status") or "not started")
            for c in kids
        ]
        out.print(make_table("child sagas", ("step", "type", "id", "status"), rows))
    _print_waits(saga)
    _print_owed(saga)


def _print_payloads(saga: dict[str, Any]) -> None:
    """Its input, and its output or its error (details included), as JSON."""
    for name in ("input", "output", "error"):
        value = saga.get(name)
        if value is not None:
            out.print(f"[bold]{name}[/bold]")
            out.print_json(data=value)


def _saga(saga_id: str, *rest: str) -> str:
    return AdminApi.path("sagas", saga_id, *rest)


def _fields(saga: dict[str, Any]) -> Table:
    """``saga show``'s first table: one row per field (parent and trigger if any)."""
    error = saga.get("error")
    parent, trigger = saga.get("parent"), saga.get("trigger")
    rows = (
        ("status", saga["status"]),
        ("type", saga["saga_type"]),
        ("version", str(saga.get("saga_version", 1))),
        ("current step", saga.get("current_step") or ""),
        ("error", f"{error['type']}: {error['message']}" if error else ""),
        ("next wake-up", saga.get("next_wakeup") or ""),
        ("deadline", saga.get("deadline_at") or ""),
        ("created", saga["created_at"]),
        ("updated", saga["updated_at"]),
        ("events", str(saga["events"])),
        ("parent", f"{parent['saga_type']} {parent['saga_id']}" if parent else ""),
        ("rerun of", (saga.get("rerun_of") or {}).get("saga_id", "")),
        ("pivot", _pivot(saga)),
        ("parked steps", ", ".join(saga.get("parked_steps") or ())),
        (
            "trigger",
            f"{trigger['topic']}[{trigger['partition']}]@{trigger['offset']}" if trigger else "",
        ),
    )
    optional = ("parent", "trigger", "rerun of", "pivot", "parked steps")
    shown = [(f, v) for f, v in rows if v or f not in optional]
    return field_table(f"{saga['saga_type']} {saga['saga_id']}", shown)


def _pivot(saga: dict[str, Any]) -> str:
    step = saga.get("pivot_step")
    if not step:
        return ""
    if saga.get("past_pivot"):
        return f"{step} (passed: it only goes forward)"
    return f"{step} (not passed yet)"


def _print_waits(saga: dict[str, Any]) -> None:
    waits = saga.get("waiting_for") or []
    if waits:
        rows = [(w["kind"], w["what"], w["since"], w.get("until") or "") for w in waits]
        out.print(make_table("waiting for", ("kind", "what", "since", "until"), rows))
    elif saga["status"] in {s.value for s in SagaStatus if s.is_terminal}:
        out.print(f"waiting for nothing: it ended {saga['status']}")


def _print_owed(saga: dict[str, Any]) -> None:
    owed_rows = saga.get("pending_compensations") or []
    if not owed_rows:
        out.print("no compensations owed")
        return
    columns = ("step", "participant", "command", "state", "attempts", "last error")
    rows = [
        (
            p["step"],
            p["participant"],
            p["command_type"],
            p["state"],
            str(p["attempts"]),
            p.get("last_error") or "",
        )
        for p in owed_rows
    ]
    out.print(make_table("compensations owed (undone newest first)", columns, rows, "ellipsis"))


@commands.command()
def history(
    saga_id: Annotated[str, typer.Argument(help="The saga's id.")],
    admin_url: AdminUrl = None,
    as_json: JsonOpt = False,
    all_runs: Annotated[
        bool,
        typer.Option(
            "--all-runs",
            help="Every run of a saga that continued as new, with its run number (else "
            "its saga_started and its current run).",
        ),
    ] = False,
) -> None:
    """Print a saga's history, one line per event with the gist of its payload (with
    --json: the export that `saga replay` reads). A saga that continued as new shows its
    current run, and the chain of its runs; --all-runs shows every run."""
    from saga_engine.core.planning._replay import load_history
    from saga_engine.core.views._event_lines import event_line

    exported = admin_call(admin_url, lambda api: api.get(_saga(saga_id, "history")))
    if as_json:
        print_json(exported)
        return
    events = run_sync(lambda: load_history(exported).events)
    numbered, run, starts = [], 1, [1]
    for seq, e in enumerate(events, 1):
        if e.kind == "run_continued":
            run += 1
            starts.append(seq)
        numbered.append((seq, run, e))
    shown = numbered if all_runs else [n for n in numbered if n[0] == 1 or n[1] == run]
    rows = [(str(seq), str(r), e.at.isoformat(), e.kind, event_line(e)) for seq, r, e in shown]
    title = f"{exported['saga_type']} {exported['saga_id']}"
    out.print(make_table(title, ("#", "run", "at", "event", "gist"), rows))
    if run > 1:
        ends = [*(seq - 1 for seq in starts[1:]), len(events)]
        chain = ", ".join(
            f"run {i} ({end - start + 1} events from #{start})"
            for i, (start, end) in enumerate(zip(starts, ends, strict=True), 1)
        )
        hint = "" if all_runs else "; --all-runs shows every run"
        out.print(f"runs: {chain}{hint}")


def _json_object(text: str, what: str) -> dict[str, Any]:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise CliError(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise CliError(f"{what} must be a JSON object, not {type(value).__name__}")
    return value


def _act(
    admin_url: str | None, saga_id: str, action: str, body: dict[str, Any], as_json: bool
) -> None:
    """One operator action; the API's refusal is the error line and the exit code."""
    result = admin_call(admin_url, lambda api: api.post(_saga(saga_id, action), body))
    if as_json:
        print_json(result)
        return
    sent = f" (signal id {result['signal_id']})" if result.get("signal_id") else ""
    note = f"; {result['note']}" if result.get("note") else ""
    out.print(
        f"{result.get('action', action)} {result.get('saga_id', saga_id)} by "
        f"{result.get('principal', '?')}{sent}: {result.get('outcome', 'accepted')}, "
        f"status {result.get('status', '?')}{note}",
        highlight=False,
    )


@commands.command()
def signal(
    saga_id: Annotated[str, typer.Argument(help="The saga's id.")],
    name: Annotated[str, typer.Argument(help="The signal's name.")],
    payload: Annotated[
        str, typer.Option("--payload", help="The signal's payload: a JSON object.")
    ] = "{}",
    signal_id: Annotated[
        str | None,
        typer.Option("--signal-id", help="Sending the same id twice delivers it once."),
    ] = None,
    reason: ReasonOpt = "",
    admin_url: AdminUrl = None,
    as_json: JsonOpt = False,
) -> None:
    """Send a signal to a saga.

    The engine checks it against the signals the saga declares before recording it: an
    undeclared name or a payload its model refuses is a one-line error naming the field
    (exit 5), and a saga that has ended refuses it (exit 4); the saga is untouched."""
    body: dict[str, Any] = {
        "name": name,
        "payload": run_sync(lambda: _json_object(payload, "--payload")),
        "reason": reason,
    }
    if signal_id is not None:
        body["signal_id"] = signal_id
    _act(admin_url, saga_id, "signal", body, as_json)


@commands.command()
def cancel(
    saga_id: Annotated[str, typer.Argument(help="The saga's id.")],
    reason: ReasonOpt,
    admin_url: AdminUrl = None,
    as_json: JsonOpt = False,
) -> None:
    """Cancel a running saga: it undoes the steps it applied, newest first."""
    _act(admin_url, saga_id, "cancel", {"reason": reason}, as_json)


@commands.command()
def retry(
    saga_id: Annotated[str, typer.Argument(help="The saga's id.")],
    step: Annotated[str, typer.Argument(help="The step to retry (or re-send) now.")],
    reason: ReasonOpt,
    command: Annotated[
        str | None,
        typer.Option(
            "--command",
            help="For a parked step: the command to send instead (a JSON object its "
            "command model reads); the original stays in the history.",
        ),
    ] = None,
    admin_url: AdminUrl = None,
    as_json: JsonOpt = False,
) -> None:
    """Retry a step now (one waiting out its back-off, one whose reply is held, one
    parked after it could not succeed, or a stuck compensation), or re-send the command
    of a step waiting for its reply: same command id, so its participant applies it once."""
    body: dict[str, Any] = {"step": step, "reason": reason}
    if command is not None:
        body["command"] = run_sync(lambda: _json_object(command, "--command"))
    _act(admin_url, saga_id, "retry", body, as_json)


@commands.command()
def skip(
    saga_id: Annotated[str, typer.Argument(help="The saga's id.")],
    step: Annotated[str, typer.Argument(help="The step to skip.")],
    reason: ReasonOpt,
    result: Annotated[
        str | None,
        typer.Option(
            "--result",
            help="The step's result (a JSON object): needed for a step waiting for its "
            "reply, not for a stuck compensation (you undid it by hand).",
        ),
    ] = None,
    admin_url: AdminUrl = None,
    as_json: JsonOpt = False,
) -> None:
    """Skip a step with a supplied result, or mark a stuck compensation as done."""
    body: dict[str, Any] = {"step": step, "reason": reason}
    if result is not None:
        body["result"] = run_sync(lambda: _json_object(result, "--result"))
    _act(admin_url, saga_id, "skip", body, as_json)


@commands.command()
def rerun(
    saga_id: Annotated[str, typer.Argument(help="The saga to run again.")],
    reason: ReasonOpt,
    input: Annotated[
        str | None,
        typer.Option(
            "--input", help="The new saga's input (a JSON object); default: the original's."
        ),
    ] = None,
    idempotency_key: Annotated[
        str | None,
        typer.Option(
            "--idempotency-key",
            help="The same key twice starts one saga; default: derived from the original "
            "and the input (so the same rerun twice starts one saga).",
        ),
    ] = None,
    admin_url: AdminUrl = None,
    as_json: JsonOpt = False,
) -> None:
    """Start a new saga of the same type (the same or an edited input), linked to the
    original in its lineage."""
    body: dict[str, Any] = {"reason": reason}
    if input is not None:
        body["input"] = run_sync(lambda: _json_object(input, "--input"))
    if idempotency_key is not None:
        body["idempotency_key"] = idempotency_key
    result = admin_call(admin_url, lambda api: api.post(_saga(saga_id, "rerun"), body))
    if as_json:
        print_json(result)
        return
    out.print(f"rerun of {saga_id}: saga {result['saga_id']}", highlight=False)


@commands.command("force-compensate")
def force_compensate(
    saga_id: Annotated[str, typer.Argument(help="The saga's id.")],
    reason: ReasonOpt,
    admin_url: AdminUrl = None,
    as_json: JsonOpt = False,
) -> None:
    """Make a running saga undo what it did so far."""
    _act(admin_url, saga_id, "force-compensate", {"reason": reason}, as_json)


@commands.command()
def resume(
    saga_id: Annotated[str, typer.Argument(help="The saga's id.")],
    reason: ReasonOpt,
    admin_url: AdminUrl = None,
    as_json: JsonOpt = False,
) -> None:
    """Resume a parked saga (stuck compensation, or nondeterministic)."""
    _act(admin_url, saga_id, "resume", {"reason": reason}, as_json)
