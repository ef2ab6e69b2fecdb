"""store/_coverage: a read across shards says which shards it could not reach."""

from __future__ import annotations

import asyncio

from saga_engine.store._coverage import coverage, missed


def test_a_block_collects_what_its_reads_missed_and_an_outer_block_sees_it_too() -> None:
    missed("a", "outside any block: not kept")
    with coverage() as outer:
        assert not outer.partial
        with coverage() as inner:
            missed("b", "connection refused")
            missed("b", "a second reason is not kept")
        assert inner.missing == {"b": "connection refused"}
        missed("c", "timeout")
    assert outer.missing == {"b": "connection refused", "c": "timeout"}
    assert outer.partial


def test_concurrent_requests_keep_their_own_coverage() -> None:
    async def request(shard: str | None) -> dict[str, str]:
        with coverage() as seen:
            await asyncio.sleep(0)
            if shard is not None:
                missed(shard, "down")
            await asyncio.sleep(0)
        return seen.missing

    async def both() -> list[dict[str, str]]:
        return list(await asyncio.gather(request("a"), request(None), request("b")))

    assert asyncio.run(both()) == [{"a": "down"}, {}, {"b": "down"}]
