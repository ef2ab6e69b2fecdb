"""``saga dlq list|replay``: the dead-letter topic (``{prefix}.dlq``), read straight from
Kafka without a consumer group, and a dead letter re-published to its origin topic (or
to the inbox, addressed to another saga)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import typer

from saga_engine.cli._common import JsonOpt, make_table, out, print_json, run_async
from saga_engine.kernel._errors import CliError
from saga_engine.kernel._settings import Settings
from saga_engine.transport._topics import Topics

__all__ = ["dlq_app", "read_dlq"]

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
    records = run_async(lambda: read_dlq(settings, timeout))[-limit:]
    rows = [_row(r) for r in records]
    if as_json:
        print_json(rows)
        return
    cells = [
        (str(r["partition"]), str(r["offset"]), r["reason"], r["detail"],
         f"{r['origin_topic']}[{r['origin_partition']}]@{r['origin_offset']}", r["saga_id"])
        for r in rows
    ]  # fmt: skip
    title = f"{Topics.of(settings.kafka).dlq}: {len(rows)} record(s)"
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
    settings = Settings()

    async def go() -> dict[str, Any]:
        record = await _find(settings, offset, partition, timeout)
        return await _republish(settings, record, to_saga, timeout)

    result = run_async(go)
    if as_json:
        print_json(result)
    else:
        out.print(
            f"replayed dlq[{result['from']['partition']}]@{result['from']['offset']} to "
            f"{result['topic']}[{result['partition']}]@{result['offset']}",
            highlight=False,
        )


async def _find(settings: Settings, offset: int, partition: int | None, seconds: float) -> Any:
    """The one dead letter at ``offset`` (in ``partition`` if given)."""
    records = [
        r
        for r in await read_dlq(settings, seconds)
        if r.offset == offset and (partition is None or r.partition == partition)
    ]
    if not records:
        where = f" in partition {partition}" if partition is not None else ""
        raise CliError(f"no dead-lettered record at offset {offset}{where}")
    if len(records) > 1:
        found = ", ".join(str(r.partition) for r in records)
        raise CliError(f"offset {offset} is in partitions {found}: choose with --partition")
    return records[0]


async def _republish(
    settings: Settings, record: Any, to_saga: str | None, seconds: float
) -> dict[str, Any]:
    """Sends ``record`` again, without its ``dlq_*`` headers; says where it went."""
    from saga_engine.transport._kafka import make_producer

    headers = [(k, bytes(v)) for k, v in record.headers or () if not k.startswith("dlq_")]
    key = record.key
    if to_saga is not None:
        topic = Topics.of(settings.kafka).inbox
        key = to_saga.encode()
        headers = [(k, v) for k, v in headers if k != "ce_sagaid"]
        headers.append(("ce_sagaid", to_saga.encode()))
    else:
        topic = _header(record, "dlq_topic")
        if not topic:
            raise CliError("the record has no dlq_topic header: replay it with --to-saga")
    producer = make_producer(settings.kafka)
    await producer.start()
    try:
        sent = await asyncio.wait_for(
            producer.send_and_wait(topic, record.value, key=key, headers=headers), seconds
        )
    finally:
        await producer.stop()
    return {
        "from": {"partition": record.partition, "offset": record.offset},
        "topic": topic,
        "partition": sent.partition,
        "offset": sent.offset,
        "saga_id": to_saga or _header(record, "ce_sagaid"),
    }


async def read_dlq(settings: Settings, seconds: float) -> list[Any]:
    """Every record of the dead-letter topic up to its current end, without a group."""
    from aiokafka import TopicPartition

    from saga_engine.transport._kafka import make_consumer

    topic = Topics.of(settings.kafka).dlq
    # The size limits of every consumer: a dead letter is as large as the record it keeps.
    consumer = make_consumer(settings.kafka, group_id=None, fetch_max_wait_ms=50)
    await consumer.start()
    try:
        # aiokafka has no public call for one topic's partitions without subscribing.
        cluster = await asyncio.wait_for(consumer._client.fetch_all_metadata(), seconds)
        partitions = cluster.partitions_for_topic(topic)
        if not partitions:
            raise CliError(f"the dead-letter topic {topic} does not exist")
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        records: list[Any] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        remaining = {tp for tp in tps if ends[tp] > 0}
        while remaining:
            if loop.time() > deadline:
                raise CliError(f"timed out reading {topic} after {seconds}s")
            batch = await consumer.getmany(timeout_ms=200)
            for tp, recs in batch.items():
                records.extend(r for r in recs if r.offset < ends[tp])
            for tp in list(remaining):
                if await consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)
        return sorted(records, key=lambda r: (r.timestamp, r.partition, r.offset))
    finally:
        await consumer.stop()


def _row(record: Any) -> dict[str, Any]:
    return {
        "partition": record.partition,
        "offset": record.offset,
        "reason": _header(record, "dlq_reason"),
        "detail": _header(record, "dlq_detail"),
        "origin_topic": _header(record, "dlq_topic"),
        "origin_partition": _header(record, "dlq_partition"),
        "origin_offset": _header(record, "dlq_offset"),
        "saga_id": _header(record, "ce_sagaid"),
    }


def _header(record: Any, name: str) -> str:
    for key, value in record.headers or ():
        if key == name:
            return bytes(value).decode(errors="replace")
    return ""
