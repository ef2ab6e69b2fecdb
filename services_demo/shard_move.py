"""The demo past one database (``make demo-shards``, ``python -m services_demo.scenario
--shards``): the engine's store on two shards, and a range of inbox partitions moved
from one to the other while the scenario's sagas run (docs/operations.md, "Past one
database" and "Moving a range").

``ShardMove`` picks the range (the inbox partition of a saga the scenario has in flight),
runs ``saga shard status`` and ``saga shard move`` as an operator would (the CLI, as
processes, with the engine's settings), narrates what moved and how long the range was
paused, and at the end reads every saga's history through the admin API: each is whole
(its sequence numbers 1..last_seq, one start), replays against the demo's code to the
status its row records, matches what the scenario read while it ran, and lives in one
shard only: the moved range's in the target.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from pydantic import SecretStr

from saga_engine.protocol import partition_for
from saga_engine.replay import load_history, replay
from saga_engine.settings import CallbackSettings
from services_demo.demo_kit import Demo, DemoFailed, Placed, check, say
from services_demo.run import DemoStack
from services_demo.sagas import Checkout, Fulfilment, Reconciliation, Shipment

#: The demo's saga types, to replay the histories with.
SAGAS = (Checkout, Shipment, Fulfilment, Reconciliation)


class ShardMove:
    """The move of one inbox partition between the stack's two shards, and its checks."""

    def __init__(self, demo: Demo, stack: DemoStack) -> None:
        self.demo = demo
        self.stack = stack
        self.config = stack.config
        self.partition = -1
        self.source = self.target = ""
        self._task: asyncio.Task[dict[str, Any]] | None = None

    def partition_of(self, saga_id: str) -> int:
        return partition_for(saga_id, self.config.partitions)

    def _shard_of(self, partition: int) -> str:
        for shard in self.config.shards:
            first, _, last = shard.partitions.partition("-")
            if int(first) <= partition <= int(last or first):
                return shard.name
        raise ValueError(f"partition {partition} is in no shard of {self.config.shards}")

    async def status(self, when: str) -> None:
        code, out, err = await self.stack.saga_cli("shard", "status")
        say(f"  saga shard status ({when}):")
        for line in (out or err).rstrip().splitlines():
            say(f"    {line}")
        check(code == 0, f"saga shard status: every database answers (exit {code})")

    async def start(self, in_flight: Placed) -> None:
        """Picks the partition of ``in_flight`` (a saga that waits) and starts moving it
        to the other shard, in the background: the scenario goes on meanwhile."""
        self.partition = self.partition_of(in_flight.saga_id)
        self.source = self._shard_of(self.partition)
        self.target = next(s.name for s in self.config.shards if s.name != self.source)
        found = await self.demo.on_saga_dbs(
            "SELECT saga_id, saga_type, status FROM {schema}.sagas ORDER BY saga_id"
        )
        on_it = [r for r in found[self.source] if self.partition_of(r["saga_id"]) == self.partition]
        say()
        say(
            f"  past one database: shards {', '.join(f'{s.name} ({s.partitions})' for s in self.config.shards)}"
            " on two Postgres clusters, the control database on the first"
        )
        say(
            f"  moving inbox partition {self.partition} from shard {self.source} to "
            f"{self.target} while the scenario runs (that of the order nobody approves, "
            f"which waits); the {len(on_it)} saga(s) on it so far:"
        )
        labels = {p.saga_id: p.label for p in self.demo.placed}
        for r in on_it:
            label = labels.get(r["saga_id"], "a child")
            say(f"    {r['saga_id']} ({r['saga_type']}, {label}: {r['status']})")
        await self.status("before the move")
        say(
            f"  saga shard move --partitions {self.partition} --to {self.target} (in the background)"
        )
        self._task = asyncio.create_task(self._move())

    async def _move(self) -> dict[str, Any]:
        code, out, err = await self.stack.saga_cli(
            "shard", "move", "--partitions", str(self.partition), "--to", self.target, "--json"
        )
        if code != 0:
            raise DemoFailed(f"saga shard move exited {code}:\n{err.strip()[-2000:]}")
        say("  saga shard move, its progress (stderr):")
        for line in err.strip().splitlines():
            say(f"    {line}")
        report: dict[str, Any] = orjson.loads(out)
        return report

    async def finish(self) -> None:
        """Waits for the move and narrates it: what moved, how long it paused, the map."""
        assert self._task is not None, "start the move first"
        report = await self._task
        say()
        say(
            f"  the move of partition {report['partitions']} ended: {report['outcome']}, "
            f"{report['sagas']} saga(s) copied from shard {self.source} to {report['to']}"
        )
        say(
            f"    took {report['seconds']:.2f}s; the range was paused {report['paused_s']:.2f}s "
            "(its sagas' writes refused and retried meanwhile; the other partitions went on)"
        )
        copied = [f"{t} {n}" for t, n in report["rows"].items() if n and " " not in t]
        deleted = [
            f"{t.rsplit(': ', 1)[-1]} {n}" for t, n in report["rows"].items() if n and " " in t
        ]
        say(f"    rows copied: {', '.join(copied) or 'none'}")
        say(f"    rows deleted from {self.source} after the commit: {', '.join(deleted) or 'none'}")
        say(f"    the shard map is at epoch {report['epoch']}")
        check(
            report["outcome"] == "moved" and report["to"] == self.target,
            f"partition {self.partition} moved to shard {self.target}",
        )
        await self.status("after the move")

    async def check_histories(self) -> None:
        """Every saga's history through the admin API, and where each saga lives."""
        where = await self.demo.on_saga_dbs(
            "SELECT saga_id, saga_type, status, last_seq FROM {schema}.sagas ORDER BY saga_id"
        )
        shards_of: dict[str, list[str]] = {}
        rows: dict[str, Any] = {}
        for shard, found in where.items():
            for row in found:
                shards_of.setdefault(row["saga_id"], []).append(shard)
                rows[row["saga_id"]] = row
        check(
            all(len(s) == 1 for s in shards_of.values()),
            f"each of the {len(rows)} sagas lives in one shard only",
        )
        moved = sorted(i for i in rows if self.partition_of(i) == self.partition)
        check(
            bool(moved) and all(shards_of[i] == [self.target] for i in moved),
            f"the {len(moved)} saga(s) of partition {self.partition} are in shard "
            f"{self.target} only, none left in {self.source}:",
        )
        for saga_id in moved:
            say(f"      {saga_id} ({rows[saga_id]['saga_type']}, {rows[saga_id]['status']})")
        others = [i for i in rows if i not in moved]
        check(
            all(shards_of[i] == [self._shard_of(self.partition_of(i))] for i in others),
            "every other saga is in the shard its partition had from the start",
        )
        for saga_id in sorted(rows):
            await self._check_history(rows[saga_id])
        say(
            f"    ok  {len(rows)} histories read through GET /sagas/ID/history: each whole "
            "(seq 1..last_seq, one start), each replays to its recorded status"
        )

    async def _check_history(self, row: Any) -> None:
        saga_id = row["saga_id"]
        admin = self.demo.target.admin_url
        response = await self.demo.http.get(f"{admin}/sagas/{saga_id}/history")
        check(
            response.status_code == 200,
            f"GET /sagas/{saga_id}/history answered {response.status_code}",
            quiet=True,
        )
        doc = response.json()
        events = doc["events"]
        check(
            [e["seq"] for e in events] == list(range(1, row["last_seq"] + 1))
            and sum(e["kind"] == "saga_started" for e in events) == 1,
            f"{saga_id}: its history is whole ({len(events)} of {row['last_seq']} events)",
            quiet=True,
        )
        result = replay(SAGAS, load_history(doc), callbacks=self._callbacks)
        check(
            result.deterministic and result.status.value == row["status"],
            f"{saga_id} replays to {row['status']}: {result.status.value}, {result.error}",
            quiet=True,
        )
        placed = next((p for p in self.demo.placed if p.saga_id == saga_id), None)
        if placed is not None:
            check(
                [e["kind"] for e in events] == [e.kind for e in placed.events],
                f"{saga_id} ({placed.label}): the history the scenario checked as it ran",
                quiet=True,
            )

    @property
    def _callbacks(self) -> CallbackSettings:
        """The keys the engine signed its callback URLs with (the fraud check's)."""
        return CallbackSettings(
            keys={"demo": SecretStr(self.config.callback_key)}, base_url=self.config.admin_url
        )
