"""``saga dlq list|replay``: the dead-letter topic (``{prefix}.dlq``), read straight from
Kafka without a consumer group, and a dead letter re-published to its origin topic (or
to the inbox, addressed to another saga)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from saga_engine.cli._common import JsonOpt, make_table, out, print_json, run_async
from saga_engine.kernel._errors import CliError
from saga_engine.kernel._settings import Settings
from saga_engine.transport._dead_letter import DeadLetter
from saga_engine.transport._dlq import DeadLetterTopic

__all__ = ["dlq_app"]

dlq_app = typer.Typer(
    no_args_is_help=True, help="Inspect and replay the dead-letter topic ({prefix}.dlq)."
)

TimeoutOpt = Annotated[
    float, typer.Option("--timeout", min=0.1, help="Seconds to spend reading the topic.")
]


@dlq_app.command("list")
def dlq_list(
    limit: Annotated[int, typer.Option("--limit", min=1, help="Show the newest N.")] = 100,
    timeout: TimeoutOpt = 30.0,
    as_json: JsonOpt = False,
) -> None:
    """List dead-lettered records: offset, reason, detail, origin and saga id."""
    settings = Settings()
    topic = DeadLetterTopic(settings.kafka)
    rows = [_row(r) for r in run_async(lambda: topic.newest(limit, timeout))]
    if as_json:
        print_json(rows)
        return
    cells = [
        (
            str(r["partition"]),
            str(r["offset"]),
            r["reason"],
            r["detail"],
            f"{r['origin_topic']}[{r['origin_partition']}]@{r['origin_offset']}",
            r["saga_id"],
        )
        for r in rows
    ]
    title = f"{topic.topic}: {len(rows)} record(s)"
    columns = ("partition", "offset", "reason", "detail", "origin", "saga")
    out.print(make_table(title, columns, cells, "ellipsis"))


@dlq_app.command("replay")
def dlq_replay(
    offset: Annotated[int, typer.Argument(min=0, help="The record's offset in the DLQ topic.")],
    partition: Annotated[
        int | None,
        typer.Option("--partition", min=0, help="Its DLQ partition (needed if ambiguous)."),
    ] = None,
    to_saga: Annotated[
        str | None,
        typer.Option("--to-saga", help="Send it to the inbox, addressed to this saga instead."),
    ] = None,
    timeout: TimeoutOpt = 30.0,
    as_json: JsonOpt = False,
) -> None:
    """Re-publish a dead-lettered record (without its dlq_* headers) to its origin topic,
    or with --to-saga to the inbox with its key and ce_sagaid set to that saga."""
    topic = DeadLetterTopic(Settings().kafka)

    async def go() -> dict[str, Any]:
        letter = await _find(topic, offset, partition, timeout)
        sent = await topic.replay(letter, timeout, to_saga=to_saga)
        return {
            "from": {"partition": sent.partition_from, "offset": sent.offset_from},
            "topic": sent.topic,
            "partition": sent.partition,
            "offset": sent.offset,
            "saga_id": sent.saga_id,
        }

    result = run_async(go)
    if as_json:
        print_json(result)
    else:
        out.print(
            f"replayed dlq[{result['from']['partition']}]@{result['from']['offset']} to "
            f"{result['topic']}[{result['partition']}]@{result['offset']}",
            highlight=False,
        )


async def _find(
    topic: DeadLetterTopic, offset: int, partition: int | None, seconds: float
) -> DeadLetter:
    """The one dead letter at ``offset`` (in ``partition`` if given)."""
    if partition is not None:
        return await topic.get(partition, offset, seconds)
    letters = [d for d in await topic.newest(None, seconds) if d.offset == offset]
    if not letters:
        raise CliError(f"no dead-lettered record at offset {offset}")
    if len(letters) > 1:
        found = ", ".join(str(d.partition) for d in letters)
        raise CliError(f"offset {offset} is in partitions {found}: choose with --partition")
    return letters[0]


def _row(letter: DeadLetter) -> dict[str, Any]:
    return {
        "partition": letter.partition,
        "offset": letter.offset,
        "reason": letter.reason,
        "detail": letter.detail,
        "origin_topic": letter.origin_topic,
        "origin_partition": letter.origin_partition,
        "origin_offset": letter.origin_offset,
        "saga_id": letter.saga_id,
    }
