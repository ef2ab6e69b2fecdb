"""What a payload codec costs: encode + decode, in microseconds per payload.

    python -m bench.codec                      # the default sizes, ~20 s
    python -m bench.codec --sizes 100 10000 --rounds 3

Prints one JSON object on stdout. For each payload size (a JSON object of about that
many bytes, text that compresses like real business data) and each chain, three paths:

- ``bytes``: ``chain.encode`` then ``chain.decode`` of the JSON text, the codec alone;
- ``marker``: ``seal`` then ``open`` of the value (JSON, base64 and the marker around
  it): what a Kafka record and a stored payload field cost;
- ``event``: a ``saga_started`` event with that input, written and read the way the
  Postgres store does (``seal_event`` + JSON, JSON + ``open_event``), against the same
  without a codec (``event_clear``), which is what every store write and read already
  pays.

``noop`` is the ceiling in the same run: a codec that does nothing, so its figures are
the machinery's own cost (JSON, base64, the marker), and the difference to it is the
cryptography's and the compression's. Each figure is the best of ``--rounds`` rounds
(the machine is shared: the minimum is the least disturbed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from saga_engine import AesGcmCodec, CodecChain, GzipCodec, NoopCodec, ZstdCodec
from saga_engine.core.history._codec import open_event, seal_event
from saga_engine.core.history._events import SagaStarted, event_from_dict, event_to_dict
from saga_engine.kernel._serde import dumps, loads

WORDS = [
    "order",
    "customer",
    "address",
    "street",
    "city",
    "payment",
    "card",
    "amount",
    "currency",
    "item",
    "sku",
]


def payload(size: int) -> dict[str, Any]:
    """A JSON object of about ``size`` bytes: records of business-like text."""
    items: list[dict[str, Any]] = []
    i = 0
    while len(dumps({"items": items})) < size:
        items.append({"name": f"{WORDS[i % len(WORDS)]}-{i}", "qty": i % 7, "note": WORDS[i % 5]})
        i += 1
    return {"items": items}


def chains(threshold: int) -> dict[str, CodecChain]:
    key = {"k1": os.urandom(32)}
    return {
        "noop": CodecChain(NoopCodec()),
        "aes-gcm": CodecChain(AesGcmCodec(key, "k1")),
        "zstd,aes-gcm": CodecChain(ZstdCodec(threshold), AesGcmCodec(key, "k1")),
        "gzip,aes-gcm": CodecChain(GzipCodec(threshold), AesGcmCodec(key, "k1")),
    }


def best_us(fn: Callable[[], object], rounds: int, min_s: float) -> float:
    """The best per-call time over ``rounds`` rounds of at least ``min_s`` each."""
    best = float("inf")
    for _ in range(rounds):
        n, start = 0, time.perf_counter()
        while True:
            for _ in range(20):
                fn()
            n += 20
            elapsed = time.perf_counter() - start
            if elapsed >= min_s:
                break
        best = min(best, elapsed / n * 1e6)
    return round(best, 2)


def _figures(
    chain: CodecChain, value: dict[str, Any], event: SagaStarted, rounds: int, min_s: float
) -> dict[str, Any]:
    raw = dumps(value)

    def on_bytes() -> object:
        return chain.decode(chain.encode(raw))

    def on_marker() -> object:
        return chain.open(chain.seal(value))

    def on_event() -> object:
        return open_event(chain, loads(dumps(seal_event(chain, event_to_dict(event)))))

    return {
        "bytes": best_us(on_bytes, rounds, min_s),
        "marker": best_us(on_marker, rounds, min_s),
        "event": best_us(on_event, rounds, min_s),
        "encoded_bytes": len(chain.encode(raw)),
    }


def measure(sizes: list[int], rounds: int, min_s: float, threshold: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    at = datetime.now(UTC)
    for size in sizes:
        value = payload(size)
        event = SagaStarted(at=at, saga_type="bench", input=value)

        def clear(event: SagaStarted = event) -> object:
            return event_from_dict(loads(dumps(event_to_dict(event))))

        row: dict[str, Any] = {
            "json_bytes": len(dumps(value)),
            "event_clear": best_us(clear, rounds, min_s),
        }
        for name, chain in chains(threshold).items():
            row[name] = _figures(chain, value, event, rounds, min_s)
            print(f"size {size}: {name} done", file=sys.stderr, flush=True)
        out[str(size)] = row
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1_000, 10_000, 100_000])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--min-seconds", type=float, default=0.2, help="per round")
    parser.add_argument("--threshold", type=int, default=1024, help="compression threshold")
    args = parser.parse_args(argv)
    result = {
        "bench": "codec",
        "unit": "microseconds per payload, encode + decode, best of rounds",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "compress_threshold": args.threshold,
        "sizes": measure(args.sizes, args.rounds, args.min_seconds, args.threshold),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
