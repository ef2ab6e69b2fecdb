"""``python -m bench.ir WORKLOAD N [FIXTURE]``: one workload of ``N`` in this process, as
callgrind runs it; prints ``{"units": ...}`` (for ``memory``, its figures) on stdout.

The collector is tuned as an engine process tunes it (``saga_engine.run``:
``gc.freeze`` after the imports, young collections every 50,000 allocations)."""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

from bench.ir import WORKLOADS, run_workload
from saga_engine.kernel._mainloop import GC_THRESHOLDS


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3) or argv[0] not in WORKLOADS:
        print(f"usage: python -m bench.ir {{{','.join(WORKLOADS)}}} N [FIXTURE]", file=sys.stderr)
        return 2
    name, n = argv[0], int(argv[1])
    fixture = Path(argv[2]) if len(argv) == 3 else None
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    print(json.dumps(run_workload(name, n, fixture)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
