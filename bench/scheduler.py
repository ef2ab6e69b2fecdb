"""What flow control's scheduler buys: light steps beside heavy ones on one participant
with a fixed CPU budget, and an adaptive limit on a participant whose capacity changes.

The engine is the shipped ``Engine`` (its input path, flow control and timers) on the
in-memory store, in this process; the participant is simulated in the same process, on
the same wall clock: ``SharedCpu``, a machine of ``--cores`` cores shared fairly among
the commands it is working on, as an operating system shares them among threads. A
command asks for ``threads`` cores for ``work_ms`` (it is done after ``work_ms`` when it
gets them); while the commands running ask for more cores than there are, each runs
slower by as much (processor sharing). Each command's reply is applied as the engine's
consumer applies a batch (``Engine.apply``), the replies of the moment together.

**Budgets** (``--phase-seconds`` each, one engine per phase, the same arrivals in every
phase from one seeded generator): light commands (1 core, ``--light-ms``) arrive as a
Poisson stream of ``--light-rate`` per second; heavy ones (``--heavy-threads`` cores,
``--heavy-ms``) in bursts of ``--burst`` every ``--burst-every`` seconds, a batch job's
way. The phases:

- ``light_alone``: the light stream only, no limits: the baseline;
- ``mix_no_budget``: both, no costs declared and no limits (what the engine did before
  costs and budgets);
- ``mix_budget``: each step declares its cores as its cost (``Cost(cpu=threads)``) and
  the participant a budget of its cores (``FlowLimit(budget={"cpu": cores})``);
- ``mix_budget_headroom``: as ``mix_budget``, and the heavy saga type may hold at most
  ``cores - --headroom`` of them (``saga_types={"transcode": FlowLimit(budget=...)}``);
- ``mix_budget_headroom_priority``: as ``mix_budget_headroom``, and light sagas are
  started with priority 1.

A light step's latency is its ``command_issued.at`` to its ``reply_received.at`` (the
engine's clock): the time flow control held it, the participant's time, and the engine's
own. Each phase also reports those parts apart.

**Adaptive** (``--adaptive-seconds``): ``--adaptive-in-flight`` sagas kept unfinished (a
new one started as one ends), each one command of 1 core for ``--adaptive-ms``, to a
participant of ``--adaptive-cores`` cores under ``FlowLimit(concurrency="adaptive")``;
at ``--adaptive-change-at`` seconds its cores are halved. The limit is sampled every
``--sample-ms``; the figure is the time from the change until the limit is within
±20 % of the new capacity's best concurrency (or of the algorithm's design point) and
stays there (5 s, probe dips aside). ``--adaptive-algorithm`` runs the gradient limit,
the AIMD one (``FlowLimit(algorithm="aimd")``), or both one after the other, side by
side in the JSON: what an operator would compare before rolling a flow policy out.

    python -m bench.scheduler [--phase-seconds 20] [--adaptive-seconds 75] [--part budgets|adaptive|both]

Prints one JSON object on stdout (progress on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import random
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from bench.e2e import loadavg, machine
from saga_engine import Cost, Saga, SagaContext
from saga_engine.core.history._decision import OutboundCommand
from saga_engine.core.history._events import CommandIssued, ReplyReceived
from saga_engine.kernel._mainloop import GC_THRESHOLDS
from saga_engine.kernel._settings import FlowLimit, LimitsSettings, Settings
from saga_engine.runner._engine import Engine
from saga_engine.runner._parts import EngineParts
from saga_engine.runner._path_inputs import Deliver
from saga_engine.store._memstore import InMemoryEventStore

PARTICIPANT = "encoder"

# ---------------------------------------------------------------------------- the sagas


class EncodeJob(BaseModel):
    work_ms: float
    threads: int
    #: Whether the step declares its cores as its cost (``Cost(cpu=threads)``).
    declare_cost: bool = False


class EncodeDone(BaseModel):
    ok: bool = True


class EncodeCommand(BaseModel):
    work_ms: float
    threads: int


async def _encode(ctx: SagaContext, job: EncodeJob) -> EncodeDone:
    await ctx.step(
        "encode",
        to=PARTICIPANT,
        command=EncodeCommand(work_ms=job.work_ms, threads=job.threads),
        cost=Cost(cpu=job.threads) if job.declare_cost else None,
        timeout=600,
    )
    return EncodeDone()


class Thumbnail(Saga[EncodeJob, EncodeDone]):
    """The light kind."""

    name = "thumbnail"

    async def run(self, ctx: SagaContext, job: EncodeJob) -> EncodeDone:
        return await _encode(ctx, job)


class Transcode(Saga[EncodeJob, EncodeDone]):
    """The heavy kind."""

    name = "transcode"

    async def run(self, ctx: SagaContext, job: EncodeJob) -> EncodeDone:
        return await _encode(ctx, job)


# ---------------------------------------------------------------------------- the participant


@dataclass(slots=True)
class _Running:
    command: OutboundCommand
    threads: int
    #: Core-seconds of work left.
    left: float
    received: float


@dataclass(slots=True)
class Served:
    """One command as the participant saw it (wall-clock seconds)."""

    saga_id: str
    command_id: str
    received: float
    done: float


class SharedCpu:
    """A participant of ``cores`` cores shared fairly among the commands it works on (a
    ``CommandSender``: the engine sends to it). A command asks for ``threads`` cores for
    ``work_ms``; while the commands running ask for more cores than there are, each
    gets its threads x cores / asked. ``done`` is called with each finished command."""

    def __init__(self, cores: float, done: Callable[[Served], None], pool: bool = False) -> None:
        self.cores = cores
        self._done = done
        #: A worker pool instead: as many commands run at once as their threads fit in
        #: the cores, each at full speed; the others wait, first come first served.
        self.pool = pool
        self._queued: deque[_Running] = deque()
        self._running: dict[str, _Running] = {}
        self._at = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0.0
        #: How late each completion timer fired (s): the machine's noise on this clock.
        self.lateness: list[float] = []
        self.received = 0

    @property
    def running(self) -> int:
        return len(self._running)

    async def send_command(self, command: OutboundCommand) -> None:
        loop = asyncio.get_running_loop()
        self._advance(loop.time())
        threads = int(command.payload["threads"])
        work = float(command.payload["work_ms"]) / 1000 * threads
        job = _Running(command, threads, work, time.time())
        self.received += 1
        if self.pool:
            self._queued.append(job)
            self._admit()
        else:
            self._running[command.command_id] = job
        self._schedule(loop)

    def _admit(self) -> None:
        """The worker pool's waiting commands that fit now, in order."""
        busy = sum(r.threads for r in self._running.values())
        while self._queued and (busy + self._queued[0].threads <= self.cores or not busy):
            job = self._queued.popleft()
            self._running[job.command.command_id] = job
            busy += job.threads

    def set_cores(self, cores: float) -> None:
        loop = asyncio.get_running_loop()
        self._advance(loop.time())
        self.cores = cores
        if self.pool:
            self._admit()
        self._schedule(loop)

    def _speed(self) -> float:
        if self.pool:
            return 1.0
        asked = sum(r.threads for r in self._running.values())
        return 1.0 if asked <= self.cores else self.cores / asked

    def _advance(self, now: float) -> None:
        elapsed = now - self._at
        self._at = now
        if elapsed <= 0 or not self._running:
            return
        speed = self._speed()
        for job in self._running.values():
            job.left -= job.threads * speed * elapsed

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._running:
            return
        speed = self._speed()
        soonest = min(max(0.0, j.left) / (j.threads * speed) for j in self._running.values())
        self._due = self._at + soonest
        self._timer = loop.call_at(self._due, self._tick)

    def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        self.lateness.append(now - self._due)
        self._timer = None
        self._advance(now)
        finished = [k for k, j in self._running.items() if j.left <= 1e-7]
        wall = time.time()
        for key in finished:
            job = self._running.pop(key)
            c = job.command
            self._done(Served(c.saga_id, c.command_id, job.received, wall))
        if self.pool:
            self._admit()
        self._schedule(loop)


class ReplyPump:
    """Applies the participant's replies as the engine's consumer does: what has come
    since the last batch, as one ``Engine.apply``."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._queue: asyncio.Queue[Served] = asyncio.Queue()
        self.served: dict[str, Served] = {}
        self.applied = 0
        self._task: asyncio.Task[None] | None = None
        self.applied_event = asyncio.Event()

    def done(self, served: Served) -> None:
        self._queue.put_nowait(served)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        engine = self._engine
        while True:
            batch = [await self._queue.get()]
            while not self._queue.empty():
                batch.append(self._queue.get_nowait())
            inputs = [
                Deliver(s.saga_id, engine.reply_input(s.command_id, "success")) for s in batch
            ]
            for outcome in await engine.apply(inputs):
                outcome.result()  # raises what went wrong: a bench must not hide it
            for s in batch:
                self.served[s.command_id] = s
            self.applied += len(batch)
            self.applied_event.set()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


@dataclass
class Rig:
    """An engine on the in-memory store in front of a ``SharedCpu``, replies pumped."""

    engine: Engine
    parts: EngineParts
    cpu: SharedCpu
    pump: ReplyPump
    started: list[tuple[str, str]] = field(default_factory=list)  # (kind, saga id)

    @classmethod
    def build(cls, limits: LimitsSettings, cores: float, pool: bool = False) -> Rig:
        holder: list[ReplyPump] = []
        cpu = SharedCpu(cores, lambda served: holder[0].done(served), pool)
        parts = EngineParts.build(
            Settings(limits=limits),
            sagas=[Thumbnail, Transcode],
            store=InMemoryEventStore(),
            sender=cpu,
        )
        engine = Engine(parts)
        pump = ReplyPump(engine)
        holder.append(pump)
        pump.start()
        return cls(engine, parts, cpu, pump)

    async def start(self, kind: str, job: EncodeJob, fairness_key: str | None = None) -> None:
        saga = Thumbnail if kind == "light" else Transcode
        saga_id = await self.engine.start(saga, job, fairness_key=fairness_key)
        self.started.append((kind, saga_id))

    async def drain(self, expected: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.pump.applied < expected:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"{self.pump.applied} of {expected} replies applied after {timeout_s} s"
                )
            self.pump.applied_event.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.pump.applied_event.wait(), min(left, 1.0))

    async def close(self) -> None:
        await self.pump.close()
        await self.engine.close()


# ---------------------------------------------------------------------------- figures


def percentiles(values: list[float]) -> dict[str, Any]:
    """n, p50, p90, p99, max, mean (ms, rounded); p-th = the value at rank ceil(p x n)."""
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    n = len(ordered)

    def at(p: float) -> float:
        return ordered[min(n - 1, max(0, math.ceil(p * n) - 1))]

    return {
        "n": n,
        "p50": round(at(0.50), 2),
        "p90": round(at(0.90), 2),
        "p99": round(at(0.99), 2),
        "max": round(ordered[-1], 2),
        "mean": round(statistics.fmean(ordered), 2),
    }


# ---------------------------------------------------------------------------- budgets


@dataclass(frozen=True)
class Phase:
    """One engine's run over the arrivals: which kinds come, and how it is configured."""

    name: str
    kinds: tuple[str, ...]
    limits: LimitsSettings
    declare_cost: bool = False
    #: Each kind started with its own fairness key ("light", "heavy"), equal weights.
    fair: bool = False

    def describe(self) -> dict[str, Any]:
        return {
            "kinds": list(self.kinds),
            "costs_declared": self.declare_cost,
            "fairness_key_per_kind": self.fair,
            "limits": self.limits.model_dump(
                include={"participants", "saga_types"}, exclude_none=True
            ),
        }


def phases(cores: int, headroom: int) -> list[Phase]:
    both = ("light", "heavy")
    budget = {PARTICIPANT: FlowLimit(budget={"cpu": cores})}
    heavy_share = {"transcode": FlowLimit(budget={"cpu": cores - headroom})}
    with_headroom = LimitsSettings(participants=budget, saga_types=heavy_share)
    return [
        Phase("light_alone", ("light",), LimitsSettings()),
        Phase("mix_no_budget", both, LimitsSettings()),
        Phase("mix_budget", both, LimitsSettings(participants=budget), declare_cost=True),
        Phase(
            "mix_budget_fair",
            both,
            LimitsSettings(participants=budget),
            declare_cost=True,
            fair=True,
        ),
        Phase("mix_budget_headroom", both, with_headroom, declare_cost=True),
    ]


def arrivals(args: argparse.Namespace) -> list[tuple[float, str]]:
    """(seconds from the phase's start, kind), sorted: a Poisson stream of light commands
    and bursts of heavy ones, the same for every phase (``--seed``)."""
    rng = random.Random(args.seed)
    out: list[tuple[float, str]] = []
    t = rng.expovariate(args.light_rate)
    while t < args.phase_seconds:
        out.append((t, "light"))
        t += rng.expovariate(args.light_rate)
    burst_at = args.burst_every / 4
    while burst_at < args.phase_seconds:
        out += [(burst_at, "heavy")] * args.burst
        burst_at += args.burst_every
    return sorted(out, key=lambda a: a[0])


def job_of(kind: str, args: argparse.Namespace, declare_cost: bool) -> EncodeJob:
    if kind == "light":
        return EncodeJob(work_ms=args.light_ms, threads=1, declare_cost=declare_cost)
    return EncodeJob(work_ms=args.heavy_ms, threads=args.heavy_threads, declare_cost=declare_cost)


async def step_figures(rig: Rig) -> dict[str, dict[str, list[float]]]:
    """Per kind, each step's latency (issued → reply taken, ms) and its parts: held by
    flow control (issued → the participant has it), at the participant, and after (the
    participant done → the reply recorded)."""
    out: dict[str, dict[str, list[float]]] = {}
    for kind, saga_id in rig.started:
        history = await rig.engine.history(saga_id)
        issued = next(e for e in history if isinstance(e, CommandIssued))
        reply = next(e for e in history if isinstance(e, ReplyReceived))
        served = rig.pump.served[issued.command_id]
        issued_s, reply_s = issued.at.timestamp(), reply.at.timestamp()
        figures = out.setdefault(kind, {"step": [], "held": [], "participant": [], "after": []})
        figures["step"].append((reply_s - issued_s) * 1000)
        figures["held"].append((served.received - issued_s) * 1000)
        figures["participant"].append((served.done - served.received) * 1000)
        figures["after"].append((reply_s - served.done) * 1000)
    return out


async def run_phase(phase: Phase, plan: list[tuple[float, str]], args: argparse.Namespace) -> Any:
    rig = Rig.build(phase.limits, args.cores)
    loop = asyncio.get_running_loop()
    jobs = {kind: job_of(kind, args, phase.declare_cost) for kind in phase.kinds}
    cpu0, t0 = time.process_time(), loop.time()
    starting: list[asyncio.Task[None]] = []
    for at, kind in plan:
        if kind not in jobs:
            continue
        delay = t0 + at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        key = kind if phase.fair else None
        starting.append(loop.create_task(rig.start(kind, jobs[kind], key)))
    await asyncio.gather(*starting)
    await rig.drain(len(rig.started), args.drain_timeout)
    wall, cpu = loop.time() - t0, time.process_time() - cpu0
    figures = await step_figures(rig)
    lateness = [x * 1000 for x in rig.cpu.lateness]
    await rig.close()
    result: dict[str, Any] = {"config": phase.describe()}
    for kind, parts in figures.items():
        result[kind] = {f"{part}_ms": percentiles(values) for part, values in parts.items()}
    result["wall_s"] = round(wall, 2)
    result["bench_cpu_fraction_of_core"] = round(cpu / wall, 3)
    result["timer_lateness_ms"] = percentiles(lateness)
    result["loadavg_after"] = loadavg()
    return result


async def budgets(args: argparse.Namespace) -> dict[str, Any]:
    plan = arrivals(args)
    out: dict[str, Any] = {}
    for phase in phases(args.cores, args.headroom):
        if args.phases and phase.name not in args.phases:
            continue
        print(f"budgets: {phase.name} ({args.phase_seconds} s)...", file=sys.stderr)
        out[phase.name] = await run_phase(phase, plan, args)
        light = out[phase.name]["light"]["step_ms"]
        print(f"  light step p50 {light['p50']} p99 {light['p99']} ms", file=sys.stderr)
    base = out.get("light_alone", {}).get("light", {}).get("step_ms", {}).get("p99")
    ratios = {}
    for name, figures in out.items():
        p99 = figures["light"]["step_ms"]["p99"]
        figures["light_p99_vs_alone"] = round(p99 / base, 2) if base else None
        ratios[name] = figures["light_p99_vs_alone"]
    light_work = args.light_rate * args.light_ms / 1000
    heavy_work = args.burst * args.heavy_ms / 1000 * args.heavy_threads / args.burst_every
    return {
        "participant": {
            "cores": args.cores,
            "light": {"threads": 1, "work_ms": args.light_ms, "rate_per_s": args.light_rate},
            "heavy": {
                "threads": args.heavy_threads,
                "work_ms": args.heavy_ms,
                "burst": args.burst,
                "burst_every_s": args.burst_every,
            },
            "offered_cores": {
                "light": round(light_work, 2),
                "heavy": round(heavy_work, 2),
                "utilisation": round((light_work + heavy_work) / args.cores, 3),
            },
        },
        "light_p99_ms_alone": base,
        "light_p99_vs_alone": ratios,
        "phases": out,
    }


# ---------------------------------------------------------------------------- adaptive


def adaptive_limit(args: argparse.Namespace, algorithm: str) -> FlowLimit | str:
    """The adaptive limit, or why this build has none."""
    try:
        return FlowLimit.model_validate(
            {
                "concurrency": "adaptive",
                "max_concurrency": args.adaptive_max,
                "algorithm": algorithm,
            }
        )
    except ValueError as exc:
        first = str(exc).splitlines()[:3]
        return (
            "pending: this build's FlowLimit has no adaptive concurrency (" + " ".join(first) + ")"
        )


def sample_of(rig: Rig, t: float) -> dict[str, Any] | None:
    flow = rig.parts.flow
    if flow is None:
        return None
    for gate in flow.snapshot():
        if gate["name"] == PARTICIPANT and gate["kind"] == "participant":
            view = gate.get("adaptive")
            if not isinstance(view, dict):
                return None
            return {
                "t": round(t, 2),
                "limit": view["limit"],
                "in_flight": gate["in_flight"],
                "waiting": gate["waiting"],
                "cores": rig.cpu.cores,
                "cause": view["cause"],
            }
    return None


def converged_after(
    samples: list[dict[str, Any]], since: float, target: float, hold_s: float, band: float = 0.2
) -> float | None:
    """Seconds from ``since`` until the limit is within ±``band`` of ``target`` and stays
    there for ``hold_s`` (samples of a probe's dip aside); None if it never does."""
    low, high = target * (1 - band), target * (1 + band)
    after = [s for s in samples if s["t"] >= since and s["cause"] != "probe"]
    for i, s in enumerate(after):
        if not low <= s["limit"] <= high:
            continue
        window = [w for w in after[i:] if w["t"] <= s["t"] + hold_s]
        if after[-1]["t"] < s["t"] + hold_s:
            return None  # not enough run left to say it stays
        if all(low <= w["limit"] <= high for w in window):
            return round(float(s["t"]) - since, 2)
    return None


async def _keep_in_flight(rig: Rig, job: EncodeJob, in_flight: int, until: float) -> None:
    loop = asyncio.get_running_loop()
    while loop.time() < until:
        missing = in_flight - (len(rig.started) - rig.pump.applied)
        if missing > 0:
            await asyncio.gather(*(rig.start("light", job) for _ in range(missing)))
        rig.pump.applied_event.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(rig.pump.applied_event.wait(), max(0.0, until - loop.time()))


def _settled(samples: list[dict[str, Any]], start: float, end: float) -> dict[str, Any]:
    """The limit's spread over [start, end) (a probe's dip aside): p10, median, p90."""
    values = sorted(
        float(s["limit"]) for s in samples if start <= s["t"] < end and s["cause"] != "probe"
    )
    if not values:
        return {"n": 0}
    n = len(values)
    return {
        "n": n,
        "p10": values[n // 10],
        "median": statistics.median(values),
        "p90": values[min(n - 1, (9 * n) // 10)],
    }


#: Where each algorithm is designed to settle on a participant serving ``cores`` at once:
#: the gradient near ``1.5 C + sqrt(1.5 C)``, AIMD between 1.5 and 2 x C.
def _gradient_design(cores: float) -> float:
    return 1.5 * cores + math.sqrt(1.5 * cores)


def _aimd_design(cores: float) -> float:
    return 1.75 * cores


DESIGN: dict[str, Callable[[float], float]] = {"gradient": _gradient_design, "aimd": _aimd_design}


async def adaptive(args: argparse.Namespace, algorithm: str) -> dict[str, Any]:
    print(f"adaptive ({algorithm}):", file=sys.stderr)
    limit = adaptive_limit(args, algorithm)
    if isinstance(limit, str):
        print(f"adaptive: {limit}", file=sys.stderr)
        return {"status": limit}
    pool = args.adaptive_participant == "pool"
    rig = Rig.build(LimitsSettings(participants={PARTICIPANT: limit}), args.adaptive_cores, pool)
    loop = asyncio.get_running_loop()
    job = EncodeJob(work_ms=args.adaptive_ms, threads=1)
    t0 = loop.time()
    samples: list[dict[str, Any]] = []

    async def sample() -> None:
        changed = False
        while True:
            t = loop.time() - t0
            if not changed and t >= args.adaptive_change_at:
                rig.cpu.set_cores(args.adaptive_cores / 2)
                changed = True
                print(f"adaptive: cores halved at {t:.1f} s", file=sys.stderr)
            s = sample_of(rig, t)
            if s is not None:
                samples.append(s)
            await asyncio.sleep(args.sample_ms / 1000)

    print(f"adaptive: {args.adaptive_seconds} s...", file=sys.stderr)
    sampler = loop.create_task(sample())
    await _keep_in_flight(rig, job, args.adaptive_in_flight, t0 + args.adaptive_seconds)
    sampler.cancel()
    completed = rig.pump.applied
    await rig.close()
    if not samples:
        return {"status": "no samples: the gate's snapshot has no adaptive view"}
    change = args.adaptive_change_at
    before, after = args.adaptive_cores, args.adaptive_cores / 2

    design = DESIGN[algorithm]
    return {
        "status": "ran",
        "algorithm": algorithm,
        "participant": {"cores_before": before, "cores_after": after, "work_ms": args.adaptive_ms},
        "change_at_s": change,
        "sagas_in_flight": args.adaptive_in_flight,
        "completed": completed,
        "best_concurrency": {"before": before, "after": after},
        "design_point": {"before": round(design(before), 1), "after": round(design(after), 1)},
        "limit_spread": {
            "last_10s_before": _settled(samples, change - 10, change),
            "last_20s": _settled(samples, args.adaptive_seconds - 20, args.adaptive_seconds),
        },
        "converged_after_change_s": {
            "to_best_concurrency": converged_after(samples, change, after, args.hold_s),
            "to_design_point": converged_after(samples, change, design(after), args.hold_s),
        },
        "first_converged_s": {
            "to_best_concurrency": converged_after(samples, 0, before, args.hold_s),
            "to_design_point": converged_after(samples, 0, design(before), args.hold_s),
        },
        "limit_each_second": _each_second(samples),
        "samples": [[s["t"], s["limit"], s["in_flight"], s["cause"]] for s in samples],
    }


def _each_second(samples: list[dict[str, Any]]) -> list[list[Any]]:
    """[second, the last limit sampled in it, cores]."""
    out: dict[int, list[Any]] = {}
    for s in samples:
        out[int(s["t"])] = [int(s["t"]), s["limit"], s["cores"]]
    return list(out.values())


# ---------------------------------------------------------------------------- main


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--part", choices=["budgets", "adaptive", "both"], default="both")
    ap.add_argument("--phases", nargs="*", help="only these budget phases (default: all)")
    ap.add_argument("--phase-seconds", type=float, default=20.0)
    ap.add_argument("--cores", type=int, default=8, help="the participant's cores")
    ap.add_argument("--headroom", type=int, default=2, help="cores heavy work may not hold")
    ap.add_argument("--light-ms", type=float, default=10.0)
    ap.add_argument("--light-rate", type=float, default=50.0, help="light commands per second")
    ap.add_argument("--heavy-ms", type=float, default=200.0)
    ap.add_argument("--heavy-threads", type=int, default=2)
    ap.add_argument("--burst", type=int, default=50, help="heavy commands per burst")
    ap.add_argument("--burst-every", type=float, default=5.0, help="seconds between bursts")
    ap.add_argument("--seed", type=int, default=40)
    ap.add_argument("--drain-timeout", type=float, default=120.0)
    ap.add_argument("--adaptive-seconds", type=float, default=75.0)
    ap.add_argument("--adaptive-change-at", type=float, default=30.0)
    ap.add_argument("--adaptive-cores", type=int, default=16)
    ap.add_argument("--adaptive-ms", type=float, default=200.0)
    ap.add_argument(
        "--adaptive-participant",
        choices=["pool", "shared"],
        default="pool",
        help="a worker pool (one command per core, the others wait) or shared cores",
    )
    ap.add_argument("--adaptive-in-flight", type=int, default=120)
    ap.add_argument("--adaptive-algorithm", choices=["gradient", "aimd", "both"], default="both")
    ap.add_argument("--adaptive-max", type=int, default=1000)
    ap.add_argument("--sample-ms", type=float, default=250.0)
    ap.add_argument("--hold-s", type=float, default=5.0, help="how long 'converged' must last")
    args = ap.parse_args(argv)
    if args.headroom >= args.cores or args.heavy_threads > args.cores - args.headroom:
        ap.error("--heavy-threads must fit in --cores minus --headroom")
    if min(args.phase_seconds, args.light_rate, args.light_ms, args.heavy_ms) <= 0:
        ap.error("--phase-seconds, --light-rate, --light-ms and --heavy-ms must be positive")
    if not 0 < args.adaptive_change_at < args.adaptive_seconds or args.adaptive_cores < 2:
        ap.error("--adaptive-change-at must be within the run, --adaptive-cores at least 2")
    return args


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {
        "bench": "scheduler",
        "engine_path": (
            "in-memory: the shipped Engine (input path, flow control, timers) on the "
            "in-memory store; the participant simulated in the same process (SharedCpu: "
            "processor sharing over its cores), on the same wall clock"
        ),
        "machine": machine(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    if args.part in ("budgets", "both"):
        result["budgets"] = await budgets(args)
    if args.part in ("adaptive", "both"):
        algorithms = (
            ["gradient", "aimd"] if args.adaptive_algorithm == "both" else [args.adaptive_algorithm]
        )
        runs = {a: await adaptive(args, a) for a in algorithms}
        result["adaptive"] = runs if len(runs) > 1 else runs[algorithms[0]]
    result["settings"] = dict(vars(args))
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    gc.set_threshold(*GC_THRESHOLDS)  # as saga_engine.run sets them for an engine
    result = asyncio.run(measure(args))
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
