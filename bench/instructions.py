"""Instructions per saga, per command and per event, counted by callgrind: a measure this
machine's noise cannot move, for the before/after of one change (wall-clock ratios stay
in ``bench/e2e.py``).

Each figure is a workload of ``bench/ir`` (the same three-step sagas everywhere: half
complete, half fail at their third step and compensate), run in a fresh process under
``valgrind --tool=callgrind`` twice, at ``N`` and at ``3N`` units of work. The difference
of the two runs' instruction totals over the difference of their units is the figure:
the interpreter's start, the imports and whatever a run does once cancel out.
The cyclic collector is off in the workloads (``bench/ir/__main__.py`` says why).

- ``decision_core_instructions_per_saga``: ``SagaRuntime`` alone (``bench/ir/decision_core.py``);
- ``coroutine_floor_instructions_per_saga``: the same saga as a bare coroutine on the
  runtime's loop with its models and nothing of the runtime (``bench/ir/coroutine_floor.py``):
  the floor the decision core is compared with;
- ``engine_path_instructions_per_saga``: ``SagaTestEnv`` driving the real ``Engine`` on
  its in-memory store and bus (``bench/ir/engine_path.py``);
- ``participant_instructions_per_command``: the participant kit's batch path against an
  in-memory transaction and producer (``bench/ir/participant.py``);
- ``replay_instructions_per_event``: a stored history read (the Postgres store's read
  path from the rows' bytes) and the saga rebuilt, per event; ``replay_read_...`` and
  ``replay_rebuild_...`` are the two parts (``bench/ir/replay.py``);
- ``insights_rollup_instructions_per_saga``: the insights' roll-up between its read and
  its upsert: each finished saga's marks made, summarised and added into the aggregate
  rows (``bench/ir/insights.py``);
- ``wire_instructions_per_record``: the Kafka record's encode and decode, a command's
  (the engine makes it, a participant reads it) and a reply's (the other way), each
  with its partition chosen (``bench/ir/wire.py``);
- ``reply_decode_instructions_per_reply`` and ``reply_decode_untimed_...``: the engine's
  decode of a reply with the five timing headers a participant adds and without them
  (``bench/ir/reply_decode.py``): what those headers cost per reply;
- ``memory_bytes_per_resident_saga``: Python's traced allocations per waiting saga an
  in-memory engine holds (``bench/ir/memory.py``; not under valgrind);
  ``memory_floor_bytes_per_resident_saga``: the same saga as a bare coroutine holding
  its models and waiting on a future, nothing of the runtime: its floor.

::

    python -m bench.instructions            # 2-3 min on 2 cores
    python -m bench.instructions --quick    # smaller N, the same figures within 0.2 %
    python -m bench.instructions --only decision_core engine_path --json-out /tmp/ir.json

valgrind comes from Debian's packages: installed with apt-get (as root, or through
passwordless sudo) when missing. Prints one JSON object on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import compileall
import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Figure:
    """A workload of ``bench.ir`` counted at ``n`` and ``3n`` (``quick`` with ``--quick``)."""

    workload: str
    key: str
    unit: str
    n: int
    quick: int


# n of the participant workload is sagas, 32 to a wave (bench/ir/fixtures.BATCH): whole
# waves at n and 3n.
FIGURES = (
    Figure("decision_core", "decision_core_instructions_per_saga", "saga", 100, 40),
    # The decision core's floor, a ceiling measured in the same run (bench/ir/coroutine_floor).
    Figure("coroutine_floor", "coroutine_floor_instructions_per_saga", "saga", 100, 40),
    Figure("engine_path", "engine_path_instructions_per_saga", "saga", 60, 20),
    Figure("participant", "participant_instructions_per_command", "command", 64, 32),
    Figure("read", "replay_read_instructions_per_event", "event", 100, 40),
    Figure("replay", "replay_instructions_per_event", "event", 100, 40),
    Figure("insights", "insights_rollup_instructions_per_saga", "saga", 100, 40),
    Figure("wire", "wire_instructions_per_record", "record", 400, 200),
    Figure("reply_decode", "reply_decode_instructions_per_reply", "reply", 2000, 1000),
    Figure(
        "reply_decode_untimed", "reply_decode_untimed_instructions_per_reply", "reply", 2000, 1000
    ),
)
MEMORY_SAGAS = (2000, 500)


def say(text: str) -> None:
    print(f"instructions: {text}", file=sys.stderr, flush=True)


def ensure_valgrind() -> str:
    """valgrind's path, installed from Debian's packages when missing (as
    ``scripts/devstack.py`` installs its tools)."""
    found = shutil.which("valgrind")
    if found:
        return found
    # scripts/devstack_base.py's apt_install, the one way the project installs Debian's
    # packages (scripts/ is a directory of scripts, not a package: imported by path).
    sys.path.insert(0, str(ROOT / "scripts"))
    base = importlib.import_module("devstack_base")
    try:
        base.apt_install(["valgrind"], "valgrind", sudo=True)
    except base.AptError as exc:
        raise SystemExit(
            f"valgrind is not installed and cannot be ({exc.reason}): "
            "install Debian's valgrind package (apt-get install valgrind)"
        ) from None
    found = shutil.which("valgrind")
    if not found:
        raise SystemExit("valgrind: still not on PATH after apt-get install valgrind")
    return found


def _environ() -> dict[str, str]:
    env = dict(os.environ)
    # The same string hashes in every run: dict and set layouts, so instruction counts,
    # do not change between the two runs of a figure.
    env["PYTHONHASHSEED"] = "0"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def total_ir(out_file: Path) -> int:
    """The instruction total of a callgrind output file (its ``totals:`` line)."""
    for line in out_file.read_text().splitlines():
        if line.startswith(("totals:", "summary:")):
            return int(line.split()[1])
    raise RuntimeError(f"{out_file}: no totals line; did callgrind finish?")


def counted(valgrind: str, workload: str, n: int, fixture: Path, out_dir: Path) -> dict[str, int]:
    """One run of ``workload`` at ``n`` under callgrind: its units and instructions."""
    out_file = out_dir / f"callgrind.{workload}.{n}"
    cmd = [
        valgrind,
        "--tool=callgrind",
        f"--callgrind-out-file={out_file}",
        "--dump-line=no",  # totals are all we read: a smaller, faster dump
        sys.executable,
        "-m",
        "bench.ir",
        workload,
        str(n),
        str(fixture),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, env=_environ(), cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{workload} at {n} failed:\n{done.stderr[-3000:]}")
    units = json.loads(done.stdout.strip().splitlines()[-1])["units"]
    return {"n": n, "units": units, "instructions": total_ir(out_file)}


def memory(sagas: int) -> dict[str, int]:
    done = subprocess.run(
        [sys.executable, "-m", "bench.ir", "memory", str(sagas)],
        capture_output=True,
        text=True,
        env=_environ(),
        cwd=ROOT,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"memory failed:\n{done.stderr[-3000:]}")
    result: dict[str, int] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _git_commit() -> str:
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
        return done.stdout.strip()

    commit = git("rev-parse", "HEAD") or "unknown"
    return commit + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def per_unit(small: dict[str, int], large: dict[str, int]) -> int:
    """Instructions per unit: the difference of two run lengths."""
    units = large["units"] - small["units"]
    if units <= 0:
        raise RuntimeError(f"the larger run did no more work ({small} against {large})")
    return round((large["instructions"] - small["instructions"]) / units)


def measure(args: argparse.Namespace, valgrind: str, out_dir: Path) -> dict[str, Any]:
    figures = [f for f in FIGURES if not args.only or f.workload in args.only]
    sizes = {f.workload: (f.quick if args.quick else f.n) * args.scale for f in figures}
    from bench.ir import fixtures

    fixture = fixtures.write(out_dir / "fixture.json", 3 * max(sizes.values(), default=1))
    # Every module compiled before any run: a run that compiled one (a source changed
    # since its .pyc) would count the parser, and its pair would not.
    compileall.compile_dir(ROOT / "bench", quiet=1)
    compileall.compile_dir(ROOT / "saga_engine", quiet=1)
    runs = [(f.workload, n) for f in figures for n in (sizes[f.workload], 3 * sizes[f.workload])]
    # The longest first, so that the last to finish is a short one.
    runs.sort(key=lambda r: -r[1] * (4 if r[0] == "engine_path" else 1))
    say(f"{len(runs)} callgrind runs, {args.jobs} at a time ...")

    def one(run: tuple[str, int]) -> tuple[str, int, dict[str, int]]:
        t0 = time.monotonic()
        result = counted(valgrind, run[0], run[1], fixture, out_dir)
        say(f"{run[0]} at {run[1]}: {result['instructions']:,} Ir ({time.monotonic() - t0:.0f} s)")
        return run[0], run[1], result

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        done = list(pool.map(one, runs))
    raw: dict[str, list[dict[str, int]]] = {}
    for workload, _, result in sorted(done, key=lambda d: (d[0], d[1])):
        raw.setdefault(workload, []).append(result)
    out: dict[str, Any] = {}
    for f in figures:
        small, large = raw[f.workload]
        out[f.key] = per_unit(small, large)
    if "replay" in raw and "read" in raw:
        out["replay_rebuild_instructions_per_event"] = (
            out["replay_instructions_per_event"] - out["replay_read_instructions_per_event"]
        )
    out["raw"] = {f.workload: {"unit": f.unit, "runs": raw[f.workload]} for f in figures}
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.instructions",
        description="Instructions per saga, command and event, counted by callgrind "
        "(bench/README.md).",
    )
    ap.add_argument(
        "--quick", action="store_true", help="smaller N (the same figures within 0.2 %%)"
    )
    ap.add_argument("--scale", type=int, default=1, help="multiply every N by this")
    ap.add_argument("--jobs", type=int, default=2, help="callgrind runs at once")
    ap.add_argument("--only", nargs="+", choices=[f.workload for f in FIGURES] + ["memory"])
    ap.add_argument("--json-out", type=Path, help="also write the JSON here")
    ap.add_argument("--keep", type=Path, help="keep the callgrind files in this directory")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    valgrind = ensure_valgrind()
    version = subprocess.run([valgrind, "--version"], capture_output=True, text=True).stdout
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-ir-") as tmp:
        out_dir = args.keep or Path(tmp)
        out_dir.mkdir(parents=True, exist_ok=True)
        if not args.only or set(args.only) - {"memory"}:
            out.update(measure(args, valgrind, out_dir))
    if not args.only or "memory" in args.only:
        sagas = MEMORY_SAGAS[1 if args.quick else 0]
        say(f"memory: {sagas} resident sagas ...")
        mem = memory(sagas)
        out["memory_bytes_per_resident_saga"] = mem["bytes_per_resident_saga"]
        out["memory_with_history_bytes_per_saga"] = mem["with_history_bytes_per_saga"]
        # Its floor, a ceiling measured in the same run (bench/ir/memory.floor).
        out["memory_floor_bytes_per_resident_saga"] = mem["floor_bytes_per_resident_saga"]
        out["memory_sagas"] = sagas
    out.update(
        {
            "git_commit": _git_commit(),
            "python": platform.python_version(),
            "valgrind": version.strip(),
            "quick": args.quick,
            "seconds": round(time.monotonic() - t0),
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
    )
    text = json.dumps(out, indent=2)
    print(text)
    if args.json_out is not None:
        args.json_out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
