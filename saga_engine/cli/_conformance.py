"""``saga conformance``: the protocol conformance suite against a running participant
(``saga_engine.conformance``), printed as a table or JSON; exit code 1 if a case fails."""

from __future__ import annotations

from typing import Annotated

import typer

from saga_engine.cli._common import JsonOpt, make_table, out, print_json, run_async
from saga_engine.conformance import run_suite
from saga_engine.kernel._settings import Settings

__all__ = ["commands"]

commands = typer.Typer()


@commands.command()
def conformance(
    participant: Annotated[
        str,
        typer.Option("--participant", help="The participant's name: it reads {prefix}.cmd.NAME."),
    ],
    timeout: Annotated[
        float, typer.Option("--timeout", min=1.0, help="Seconds to wait for each part's answers.")
    ] = 30.0,
    as_json: JsonOpt = False,
) -> None:
    """Check a running participant, in any language, against proto/PROTOCOL.md: the
    checks of section 7.5 in order, reply headers, deduplication, every batch codec,
    optional headers, 64-bit integers, a new reply topic, compensations. It must
    implement section 16's command types; it may run again against the same one."""
    settings = Settings()
    kafka = settings.kafka
    report = run_async(
        lambda: run_suite(
            kafka.bootstrap_servers,
            participant,
            prefix=kafka.topic_prefix,
            max_message_bytes=kafka.max_message_bytes,
            timeout_s=timeout,
        )
    )
    if as_json:
        print_json(report.as_dict())
    else:
        cells = [
            ("pass" if r.passed else "FAIL", r.name, r.section, r.detail) for r in report.results
        ]
        passed = sum(r.passed for r in report.results)
        title = f"{participant} on {report.command_topic}: {passed} of {len(cells)} passed"
        out.print(make_table(title, ("", "case", "PROTOCOL.md", "detail"), cells, "fold"))
    if not report.passed:
        raise typer.Exit(1)
