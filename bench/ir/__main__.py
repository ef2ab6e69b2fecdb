"""``python -m bench.ir WORKLOAD N [FIXTURE]``: one workload of ``N`` in this process, as
callgrind runs it; prints ``{"units": ...}`` (for ``memory``, its figures) on stdout.

The cyclic collector is off after the imports (``gc.freeze``, then ``gc.disable``): a
collection is a discrete event, and the run at ``3N`` may do one more than the run at
``N`` (or one fewer), which moved a figure by several per cent; reference counting
still frees everything that is not a cycle. What the collector costs an engine shows in
``bench/e2e.py``'s CPU per saga."""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

from bench.ir import WORKLOADS, run_workload


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3) or argv[0] not in WORKLOADS:
        print(f"usage: python -m bench.ir {{{','.join(WORKLOADS)}}} N [FIXTURE]", file=sys.stderr)
        return 2
    name, n = argv[0], int(argv[1])
    fixture = Path(argv[2]) if len(argv) == 3 else None
    gc.freeze()
    gc.disable()
    print(json.dumps(run_workload(name, n, fixture)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
