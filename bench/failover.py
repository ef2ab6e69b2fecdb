"""Engine failover under load: two engines and three participants, engines SIGKILLed.

    python -m bench.failover [--in-flight 128] [--warmup-seconds 5] [--after-seconds 20]
                             [--restart-after S]
    python -m bench.failover --mode churn [--kill-every 5] [--churn-seconds 60]

Needs Postgres and Kafka (``make up``), like bench/e2e.py, whose processes, resources and
pipeline it reuses: the ``bench.app`` roles ``engine`` (twice, ``engine-a`` and
``engine-b``, static group members ``bench-engine-a`` / ``bench-engine-b``) and
``participant alpha|beta|gamma``, on a fresh schema and topic prefix. The driver keeps
``--in-flight`` sagas unfinished, as bench/e2e.py's load does; with ``--rate`` it starts
that many a second instead (open loop, ``--in-flight`` only a cap), so that the sagas
stuck on a dead engine do not starve the survivor of load.

- ``kill``: after ``--warmup-seconds`` of load, engine-a is SIGKILLed (and started again
  ``--restart-after`` seconds later, if given); the load goes on for ``--after-seconds``,
  then stops, and the run waits for every saga to finish (at most ``--drain-timeout``).
- ``churn``: after the warm-up, every ``--kill-every`` seconds for ``--churn-seconds``,
  one engine is SIGKILLed and started again under the same name (``--restart-after``
  seconds later, default at once): engine-a, engine-b, engine-a ... alternately, so each
  kill's victim is the engine that has been up longest and both take both parts.

Each engine writes the history of its owned inbox partitions (bench/app.py,
``BENCH_OWNED_POLL_MS``); with the events' ``recorded_at`` in Postgres that gives, per
kill, how long until the victim's partitions were owned again and how long each open
saga waited for its next event. Progress goes to stderr; stdout gets one JSON object.
See bench/README.md for the fields and the targets.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg

from bench.app import PARTICIPANTS
from bench.e2e import (
    DONE_STATUSES,
    BenchError,
    EngineRun,
    Processes,
    Resources,
    engine_config,
    machine,
    pct,
    read_json,
    run_bench,
    say,
)
from saga_engine.kernel._partitioning import partition_for
from saga_engine.settings import KafkaSettings
from saga_engine.transport._kafka import ensure_topics

ENGINES = ("engine-a", "engine-b")
#: How often each engine looks at its owned partitions: the takeover's resolution.
OWNED_POLL_MS = 20
#: The issue's targets, each a ceiling (lost and duplicates: 0).
FIRST_PROGRESS_P99_S = 10.0
SURVIVOR_PAUSE_P99_S = 1.0
DRAIN_AFTER_LAST_KILL_S = 30.0
#: How long after a takeover the survivor's sagas are still watched for a pause.
PAUSE_MARGIN_S = 2.0


def dist_s(values: Sequence[float]) -> dict[str, float | int]:
    """n, p50/p90/p99 (nearest rank) and max, in seconds."""
    if not values:
        return {"n": 0}
    out: dict[str, float | int] = {"n": len(values)}
    for q in (50, 90, 99):
        out[f"p{q}"] = round(pct(values, q), 3)
    out["max"] = round(max(values), 3)
    return out


def target(value: float | None, limit: float) -> dict[str, Any]:
    """``value <= limit``; no value (nothing measured, or never reached) fails."""
    return {"value": value, "limit": limit, "pass": value is not None and value <= limit}


# --------------------------------------------------------------------------- ownership


@dataclass
class Owned:
    """One engine process's owned inbox partitions over time (its ``owned`` file) and
    when it was killed."""

    role: str
    pid: int
    history: list[tuple[float, frozenset[int]]]
    died: float = math.inf

    def at(self, t: float) -> frozenset[int]:
        """What it owned at ``t`` (at its kill: just before)."""
        current: frozenset[int] = frozenset()
        if t > self.died:
            return current
        for seen, parts in self.history:
            if seen > t:
                break
            current = parts
        return current

    def first_owning(self, partition: int, t: float) -> float | None:
        """The earliest time from ``t`` on at which this process owns ``partition``."""
        for i, (seen, parts) in enumerate(self.history):
            end = self.history[i + 1][0] if i + 1 < len(self.history) else math.inf
            end = min(end, self.died)
            if partition in parts and end > t and seen < end:
                return max(seen, t)
        return None


@dataclass
class Kill:
    victim: str
    pid: int
    at: float  # wall clock, just before the SIGKILL
    survivor: str
    survivor_pid: int | None
    restarted_at: float | None = None
    restarted_pid: int | None = None


@dataclass
class Load:
    sent: dict[str, float]  # saga id -> wall clock of its start
    t0: float  # wall clock when the load began
    stopped: float = 0.0  # wall clock when it stopped starting sagas
    drained: bool = False
    skipped: list[str] = field(default_factory=list)  # scheduled actions never reached


Action = tuple[float, str, Callable[[], None]]


# --------------------------------------------------------------------------- the run


class FailoverRun(EngineRun):
    """bench/e2e.py's engine pipeline with two engines, a load that kills them, and a
    report read from the ownership files and the event store."""

    def __init__(
        self, args: argparse.Namespace, res: Resources, procs: Processes, logs: Path, tag: str
    ) -> None:
        cfg = engine_config(args, load_s=0.0, probe=0, idle_s=0.0)
        super().__init__(cfg, res, procs, logs, tag)
        self.args = args
        self.roles = [*ENGINES, *(f"participant-{p}" for p in PARTICIPANTS)]
        self.kills: list[Kill] = []
        self.kafka_env: dict[str, str] = {}
        if args.session_timeout_ms:
            self.kafka_env["SAGA_KAFKA__SESSION_TIMEOUT_MS"] = str(args.session_timeout_ms)

    # ----------------------------------------------------------------- processes

    def _spawn_engine(self, role: str) -> int:
        env = self._env(
            BENCH_ROLE=role,
            BENCH_OWNED_POLL_MS=str(OWNED_POLL_MS),
            SAGA_KAFKA__GROUP_INSTANCE_ID=f"bench-{role}",
            **self.kafka_env,
        )
        return self.procs.spawn(
            role, ["-m", "bench.app", "engine"], env, self.dir / f"{role}.log"
        ).popen.pid

    def _spawn_all(self) -> None:
        for role in ENGINES:
            self._spawn_engine(role)
        for p in PARTICIPANTS:
            env = self._env(
                SAGA_PARTICIPANT__DB_SCHEMA=f"{self.schema}_{p}",
                SAGA_KAFKA__GROUP_INSTANCE_ID=f"bench-{p}",
                **self.kafka_env,
            )
            role = f"participant-{p}"
            self.procs.spawn(
                role, ["-m", "bench.app", "participant", p], env, self.dir / f"{role}.log"
            )

    def _kill(self, victim: str) -> None:
        proc = self.procs.procs.pop(victim, None)
        if proc is None:
            raise BenchError(f"{victim} is not running: cannot kill it (--restart-after too long?)")
        survivor = next(r for r in ENGINES if r != victim)
        alive = self.procs.procs.get(survivor)
        at = time.time()
        os.killpg(proc.popen.pid, signal.SIGKILL)
        try:
            proc.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            raise BenchError(f"{victim} (pid {proc.popen.pid}) outlived SIGKILL by 10 s") from None
        (self.dir / f"{victim}.ready").unlink(missing_ok=True)
        self.kills.append(
            Kill(victim, proc.popen.pid, at, survivor, alive.popen.pid if alive else None)
        )
        say(f"SIGKILLed {victim} (pid {proc.popen.pid})")

    def _restart(self, role: str) -> None:
        kill = next(k for k in reversed(self.kills) if k.victim == role)
        kill.restarted_at = time.time()
        kill.restarted_pid = self._spawn_engine(role)

    def _owned(self) -> dict[int, Owned]:
        """Every engine process's ownership history, by pid."""
        out: dict[int, Owned] = {}
        for path in self.dir.glob("engine-*.owned.*.json"):
            raw = read_json(path) or {}
            history = [
                (float(t), frozenset(int(p) for p in ps)) for t, ps in raw.get("history", [])
            ]
            pid = int(raw.get("pid", 0))
            out[pid] = Owned(path.name.split(".owned.")[0], pid, history)
        for k in self.kills:
            if k.pid in out:
                out[k.pid].died = k.at
        return out

    async def _wait_balanced(self, timeout_s: float) -> dict[str, list[int]]:
        """Until both engines own partitions and together all of them, each once."""
        deadline = time.monotonic() + timeout_s
        every = frozenset(range(self.cfg.partitions))
        while True:
            owned = self._owned()
            now = time.time()
            parts = [
                owned[p.popen.pid].at(now) if p.popen.pid in owned else frozenset()
                for p in (self.procs.procs[r] for r in ENGINES)
            ]
            if (
                all(parts)
                and sum(map(len, parts)) == len(every)
                and frozenset().union(*parts) == every
            ):
                return {r: sorted(ps) for r, ps in zip(ENGINES, parts, strict=True)}
            self.procs.check_alive()
            if time.monotonic() > deadline:
                raise BenchError(
                    f"the engines did not share the partitions within {timeout_s:.0f}s: {parts}"
                )
            await asyncio.sleep(0.05)

    # ----------------------------------------------------------------- the load

    async def _load(
        self, conn: asyncpg.Connection[Any], seconds: float, actions: list[Action]
    ) -> Load:
        """bench/e2e.py's load (``--in-flight`` sagas kept unfinished, a new one as soon as
        the completion poll sees room; with ``--rate``, on schedule) for ``seconds``,
        running each action when its time (seconds from the start) comes; then waits for
        the rest, at most ``--drain-timeout``. Unlike e2e's, a dead engine is expected and
        a drain that times out is reported, not raised: the sagas left are ``lost``."""
        pending = sorted(actions, key=lambda a: a[0])
        load = Load(sent={}, t0=time.time())
        inflight: set[str] = set()
        t0 = time.monotonic()
        stop = t0 + seconds
        deadline = stop + self.cfg.drain_timeout_s
        last_report = t0
        while True:
            now = time.monotonic()
            while pending and now >= t0 + pending[0][0]:
                pending.pop(0)[2]()
            if now < stop:
                room = self.cfg.concurrency - len(inflight)
                if self.args.rate:  # open loop: on schedule, whatever is stuck
                    room = min(room, int((now - t0) * self.args.rate) - len(load.sent))
                for _ in range(room):
                    inflight.add(await self._start(load.sent))
            else:
                if not load.stopped:
                    load.stopped = time.time()
                    say(f"load stopped after {len(load.sent)} sagas; draining")
                if not inflight:
                    load.drained = True
                    break
                if now > deadline:
                    say(f"drain timeout: {len(inflight)} sagas unfinished")
                    break
            self.check_starts()
            self.procs.check_alive()
            await asyncio.sleep(self.cfg.poll_s)
            if inflight:
                inflight -= await self._done(conn, inflight)
            if time.monotonic() - last_report > 5:
                last_report = time.monotonic()
                done = len(load.sent) - len(inflight)
                say(f"  {done}/{len(load.sent)} sagas done, {len(inflight)} in flight")
        load.skipped = [label for _, label, _ in pending]
        await self.settle_starts(30)
        return load

    def _actions(self) -> tuple[float, list[Action]]:
        """The load's length and what happens when."""
        a = self.args
        actions: list[Action] = []

        def kill_at(t: float, victim: str, restart_after: float | None) -> None:
            actions.append((t, f"kill {victim}", lambda: self._kill(victim)))
            if restart_after is not None:
                t_restart = t + restart_after
                actions.append((t_restart, f"restart {victim}", lambda: self._restart(victim)))

        if a.mode == "kill":
            kill_at(a.warmup_seconds, ENGINES[0], a.restart_after)
            return a.warmup_seconds + a.after_seconds, actions
        n = max(1, int(a.churn_seconds // a.kill_every))
        for i in range(n):
            kill_at(a.warmup_seconds + i * a.kill_every, ENGINES[i % 2], a.restart_after or 0.0)
        return a.warmup_seconds + a.churn_seconds, actions

    # ----------------------------------------------------------------- the report

    async def _events(
        self, conn: asyncpg.Connection[Any], ids: list[str], after: float, before: float
    ) -> dict[str, list[float]]:
        """Per saga, the ``recorded_at`` of its events strictly between the two times."""
        rows = await conn.fetch(
            """
            SELECT saga_id, array_agg(extract(epoch FROM recorded_at)::float8) AS ts
            FROM saga_events WHERE saga_id = ANY($1::text[])
              AND recorded_at > to_timestamp($2) AND recorded_at < to_timestamp($3)
            GROUP BY saga_id
            """,
            ids,
            after,
            before,
        )
        return {r["saga_id"]: sorted(r["ts"]) for r in rows}

    async def _kill_report(
        self,
        conn: asyncpg.Connection[Any],
        k: Kill,
        load: Load,
        finished: dict[str, float],
        owned: dict[int, Owned],
    ) -> tuple[dict[str, Any], dict[str, list[float]]]:
        """One kill's figures, and its raw waits (victim, survivor, pauses) for the totals."""
        none = Owned("", 0, [])
        victim_parts = owned.get(k.pid, none).at(k.at)
        survivor_parts = owned.get(k.survivor_pid or 0, none).at(k.at)
        taken: dict[int, tuple[float, str] | None] = {}
        for p in victim_parts:
            times = [
                (t, h.role)
                for h in owned.values()
                if h.pid != k.pid and (t := h.first_owning(p, k.at)) is not None
            ]
            taken[p] = min(times) if times else None
        takeover = (
            max((v[0] for v in taken.values() if v), default=k.at) - k.at
            if all(taken.values())
            else None
        )
        open_ids = [
            s for s, t in load.sent.items() if t < k.at and finished.get(s, math.inf) > k.at
        ]
        groups = {"victim": victim_parts, "survivor": survivor_parts}
        members = {
            g: [s for s in open_ids if partition_for(s, self.cfg.partitions) in parts]
            for g, parts in groups.items()
        }
        events = await self._events(
            conn, [*members["victim"], *members["survivor"]], k.at, math.inf
        )
        first = {s: ts[0] for s, ts in events.items()}
        waits = {g: [first[s] - k.at for s in ids if s in first] for g, ids in members.items()}
        never = {g: [s for s in ids if s not in first] for g, ids in members.items()}
        # The survivor's own sagas also wait through the rebalance that hands it the
        # victim's partitions: the longest time each went without an event, while open,
        # from the kill to PAUSE_MARGIN_S after the takeover.
        end = k.at + (load.stopped - k.at if takeover is None else takeover) + PAUSE_MARGIN_S
        ours = [
            s
            for s, t in load.sent.items()
            if t < end
            and finished.get(s, math.inf) > k.at
            and partition_for(s, self.cfg.partitions) in survivor_parts
        ]
        seen = await self._events(conn, ours, k.at, end)
        pauses: list[float] = []
        for s in ours:
            lo, hi = max(k.at, load.sent[s]), min(end, finished.get(s, math.inf))
            points = [lo, *(t for t in seen.get(s, []) if lo < t < hi), hi]
            pauses.append(max(b - a for a, b in itertools.pairwise(points)))
        restarted = owned.get(k.restarted_pid or 0)
        back = next((t for t, ps in restarted.history if ps), None) if restarted else None
        report = {
            "victim": k.victim,
            "at_s": round(k.at - load.t0, 3),
            "victim_partitions": sorted(victim_parts),
            "survivor_partitions": sorted(survivor_parts),
            "takeover_s": None if takeover is None else round(takeover, 3),
            "taken_over_by": sorted({v[1] for v in taken.values() if v}),
            "open_sagas": {g: len(ids) for g, ids in members.items()},
            "first_progress_s": dist_s(waits["victim"]),
            "survivor_first_progress_s": dist_s(waits["survivor"]),
            "survivor_pause_s": dist_s(pauses),
            "never_progressed": {g: len(ids) for g, ids in never.items()},
            "never_progressed_sample": never["victim"][:5] + never["survivor"][:5],
            "restarted_at_s": round(k.restarted_at - load.t0, 3) if k.restarted_at else None,
            "restarted_owns_partitions_after_s": round(back - k.restarted_at, 3)
            if back is not None and k.restarted_at
            else None,
        }
        return report, {**waits, "pauses": pauses}

    async def _duplicates(self, conn: asyncpg.Connection[Any]) -> dict[str, dict[str, int]]:
        """Per participant: command ids its ledger holds more than once, rows beyond one
        per command id, and all its rows."""
        out: dict[str, dict[str, int]] = {}
        for p in PARTICIPANTS:
            row = await conn.fetchrow(
                "SELECT count(*) FILTER (WHERE n > 1) AS dup, coalesce(sum(n - 1), 0) AS extra, "
                f'coalesce(sum(n), 0) AS rows FROM (SELECT count(*) AS n FROM "{self.schema}_{p}".ledger '
                "GROUP BY command_id) d"
            )
            assert row is not None
            out[p] = {
                "duplicate_command_ids": int(row["dup"]),
                "extra_rows": int(row["extra"]),
                "rows": int(row["rows"]),
            }
        return out

    def _summary(
        self,
        load: Load,
        statuses: dict[str, str],
        finished: dict[str, float],
        kills: list[dict[str, Any]],
        raw: list[dict[str, list[float]]],
        dup: dict[str, dict[str, int]],
    ) -> dict[str, Any]:
        a = self.args
        lost_ids = [s for s in load.sent if statuses.get(s) not in DONE_STATUSES]
        by_status = Counter(statuses.get(s, "missing") for s in load.sent)
        all_done = not lost_ids and bool(finished)
        last = max(finished.values(), default=None)
        ends = sorted(finished.values())

        def rate(start: float, end: float) -> float | None:
            n = sum(1 for t in ends if start < t <= end)
            return round(n / (end - start), 1) if end - start > 0.5 else None

        waits, survivor_waits, pauses = (
            [w for r in raw for w in r[g]] for g in ("victim", "survivor", "pauses")
        )
        never = sum(k["never_progressed"]["victim"] for k in kills)
        survivor_never = sum(k["never_progressed"]["survivor"] for k in kills)
        first = {**dist_s(waits), "never": never}
        survivor = {**dist_s(survivor_waits), "never": survivor_never}
        duplicates = sum(d["duplicate_command_ids"] for d in dup.values())
        kill_at = [k.at for k in self.kills]
        takeovers = [k["takeover_s"] for k in kills]
        p99 = first.get("p99") if not never else None
        pause = dist_s(pauses)
        targets: dict[str, Any] = {
            "first_progress_p99_s": target(p99, FIRST_PROGRESS_P99_S),
            "survivor_pause_p99_s": target(pause.get("p99"), SURVIVOR_PAUSE_P99_S),
            "never_progressed": target(never + survivor_never, 0),
            "lost": target(len(lost_ids), 0),
            "duplicates": target(duplicates, 0),
        }
        out: dict[str, Any] = {"benchmark": "failover", "mode": a.mode}
        if a.mode == "kill":
            k0 = kills[0] if kills else {}
            take = k0.get("takeover_s")
            out["takeover_s"] = take
            out["taken_over_by"] = k0.get("taken_over_by")
            sagas_per_s = {
                "before_kill": rate(load.t0, kill_at[0]) if kill_at else None,
                "after_kill": rate(kill_at[0], load.stopped) if kill_at else None,
                "after_takeover": rate(kill_at[0] + take, load.stopped)
                if kill_at and take is not None
                else None,
            }
        else:
            done = [t for t in takeovers if t is not None]
            out["takeover_s"] = {**dist_s(done), "never": len(takeovers) - len(done)}
            sagas_per_s = {
                "before_churn": rate(load.t0, kill_at[0]) if kill_at else None,
                "during_churn": rate(kill_at[0], load.stopped) if kill_at else None,
            }
            drain_after = round(last - kill_at[-1], 3) if all_done and last and kill_at else None
            out["drain_after_last_kill_s"] = drain_after
            targets["drain_after_last_kill_s"] = target(drain_after, DRAIN_AFTER_LAST_KILL_S)
        out.update(
            {
                "first_progress_s": first,
                "survivor_first_progress_s": survivor,
                "survivor_pause_s": pause,
                "drain_s": round(max(0.0, last - load.stopped), 3) if all_done and last else None,
                "lost": len(lost_ids),
                "duplicates": duplicates,
                "sagas": len(load.sent),
                "sagas_finished": len(finished),
                "sagas_per_s": sagas_per_s,
                # Open loop: starts the --in-flight cap held back.
                "behind_schedule": max(0, round((load.stopped - load.t0) * a.rate) - len(load.sent))
                if a.rate
                else None,
                "targets": targets,
                "pass": all(t["pass"] for t in targets.values()),
                "kills": kills,
                "statuses": dict(by_status),
                "lost_sample": lost_ids[:10],
                "ledger": dup,
                "timeline_s": {
                    "load_stopped": round(load.stopped - load.t0, 3),
                    "last_finished": round(last - load.t0, 3) if last else None,
                    "drained_within_timeout": load.drained,
                    "actions_not_reached": load.skipped,
                },
            }
        )
        return out

    # ----------------------------------------------------------------- the run

    async def run(self) -> dict[str, Any]:
        cfg = self.cfg
        self.res.schemas += [self.schema, *(f"{self.schema}_{p}" for p in PARTICIPANTS)]
        names = self.topic_names()
        self.res.topics += names
        kafka = KafkaSettings(
            bootstrap_servers=self.res.bootstrap,
            topic_prefix=self.prefix,
            partitions=cfg.partitions,
        )
        await ensure_topics(kafka, names)
        seconds, actions = self._actions()
        say(
            f"failover {self.tag}: mode {self.args.mode}, {cfg.concurrency} in flight for {seconds:g}s, "
            f"{cfg.partitions} partitions; {', '.join(f'{lbl} at {t:g}s' for t, lbl, _ in actions)}"
        )
        self._spawn_all()
        await self._wait_files(
            [f"{r}.ready" for r in self.roles], cfg.start_timeout_s, "the processes to be ready"
        )
        split = await self._wait_balanced(cfg.start_timeout_s)
        say(f"all processes ready; the engines own {split}")
        conn = await asyncpg.connect(
            self.res.dsn, timeout=10, server_settings={"search_path": self.schema}
        )
        try:
            await self.open_starter()
            try:
                if cfg.warmup:
                    say(f"warm-up: {cfg.warmup} sagas")
                    await self._drive(
                        conn,
                        count=cfg.warmup,
                        seconds=0,
                        concurrency=cfg.warmup,
                        timeout_s=cfg.start_timeout_s,
                        poll_s=0.05,
                    )
                load = await self._load(conn, seconds, actions)
            finally:
                await self.close_starter()
            rows = await conn.fetch(
                """
                SELECT s.saga_id, s.status, extract(epoch FROM max(e.recorded_at))::float8 AS last
                FROM sagas s LEFT JOIN saga_events e ON e.saga_id = s.saga_id
                WHERE s.saga_id = ANY($1::text[]) GROUP BY s.saga_id, s.status
                """,
                list(load.sent),
            )
            statuses = {r["saga_id"]: r["status"] for r in rows}
            finished = {
                r["saga_id"]: r["last"]
                for r in rows
                if r["status"] in DONE_STATUSES and r["last"] is not None
            }
            owned = self._owned()
            reports = [await self._kill_report(conn, k, load, finished, owned) for k in self.kills]
            say("stopping the processes")
            self.procs.stop_all()
            dup = await self._duplicates(conn)
        finally:
            await conn.close()
        report = self._summary(
            load, statuses, finished, [r for r, _ in reports], [w for _, w in reports], dup
        )
        final = {r: read_json(self.dir / f"{r}.stats.final.json") or {} for r in ENGINES}
        report["dead_lettered_by_last_engines"] = {
            r: final[r].get("dead_lettered") for r in ENGINES
        }
        return report


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m bench.failover", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--mode", choices=["kill", "churn"], default="kill")
    ap.add_argument("--in-flight", type=int, default=128, help="sagas kept unfinished")
    ap.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="open loop: start this many sagas a second, --in-flight only a cap (set it high)",
    )
    ap.add_argument("--warmup-seconds", type=float, default=5.0, help="load before the first kill")
    ap.add_argument("--after-seconds", type=float, default=20.0, help="kill: load after the kill")
    ap.add_argument(
        "--restart-after",
        type=float,
        help="restart a victim this long after its kill (kill: default never; churn: default 0)",
    )
    ap.add_argument("--kill-every", type=float, default=5.0, help="churn: seconds between kills")
    ap.add_argument(
        "--churn-seconds", type=float, default=60.0, help="churn: load after the warm-up"
    )
    ap.add_argument("--warmup", type=int, default=20, help="sagas run before the load")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--fetch-max-wait-ms", type=int, default=20)
    ap.add_argument(
        "--session-timeout-ms",
        type=int,
        help="SAGA_KAFKA__SESSION_TIMEOUT_MS (default: the engine's)",
    )
    ap.add_argument(
        "--drain-timeout",
        type=float,
        default=90.0,
        help="limit for the sagas to finish after the load",
    )
    ap.add_argument("--start-timeout", type=float, default=60.0)
    ap.add_argument("--poll-ms", type=float, default=20.0, help="completion polling interval")
    ap.add_argument("--max-seconds", type=float, default=600.0, help="limit for the whole run")
    ap.add_argument("--keep", action="store_true", help="keep schemas, topics and logs")
    ap.add_argument("--json-out", type=Path, help="also write the JSON result to this file")
    args = ap.parse_args(argv)
    if args.in_flight < 1 or args.partitions < 2:
        ap.error("--in-flight must be at least 1 and --partitions at least 2")
    if args.mode == "churn" and not 0 < args.kill_every <= args.churn_seconds:
        ap.error("--kill-every must be positive and at most --churn-seconds")
    if args.mode == "churn" and (args.restart_after or 0) >= args.kill_every:
        ap.error("--restart-after must be shorter than --kill-every")
    return args


async def bench(args: argparse.Namespace, res: Resources, procs: Processes, logs: Path) -> Any:
    date = datetime.now(UTC).isoformat(timespec="seconds")
    host = machine()
    run = FailoverRun(args, res, procs, logs, uuid.uuid4().hex[:8])
    result = await run.run()
    say(
        f"takeover {result['takeover_s']}, first progress {result['first_progress_s']}, "
        f"lost {result['lost']}, duplicates {result['duplicates']}, pass {result['pass']}"
    )
    settings = {k: v for k, v in vars(args).items() if k not in ("json_out", "keep")}
    settings["group_instance_ids"] = [f"bench-{r}" for r in ENGINES]
    settings["owned_poll_ms"] = OWNED_POLL_MS
    return {**result, "settings": settings, "machine": host, "date": date}


def main(argv: list[str]) -> int:
    return run_bench(parse_args(argv), bench, log_prefix="saga-failover-")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
