"""The key slots (in-memory adapter, which the contract suite holds to the Postgres one)
under generated asks and releases over a few keys: against a model of the rules.

After every operation, per key:
- never more holders than the limit;
- no saga waits while a slot is free (work-conserving);
- grants go in the order the sagas first asked (FIFO), whatever the asks again;
- a saga's turn says what the table says (held, holders, its place).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from saga_engine.store._keyslots import KeyTurn
from saga_engine.store._memstore import InMemoryEventStore

AT = datetime(2026, 3, 1, tzinfo=UTC)
LIMITS = {"k1": 1, "k2": 2, "k3": 3}


@dataclass(frozen=True)
class Ask:
    saga: int
    key: str


@dataclass(frozen=True)
class Release:
    saga: int


ops = st.lists(
    st.one_of(
        st.builds(Ask, st.integers(0, 11), st.sampled_from(sorted(LIMITS))),
        st.builds(Release, st.integers(0, 11)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_slots_follow_the_rules(script: list[Ask | Release]) -> None:
    asyncio.run(_check(script))


async def _check(script: list[Ask | Release]) -> None:
    store = InMemoryEventStore()
    key_of: dict[int, str] = {}  # a saga keeps the key it first asked for
    asked: dict[str, list[int]] = {k: [] for k in LIMITS}  # first asks, in order
    for op in script:
        if isinstance(op, Ask):
            key = key_of.setdefault(op.saga, op.key)
            if op.saga not in asked[key]:
                asked[key].append(op.saga)
            turn = await store.acquire_key("t", key, str(op.saga), LIMITS[key], AT)
            _check_turn(turn, str(op.saga), await _rows(store, key))
        else:
            await store.release_key(str(op.saga), AT)
            if op.saga in key_of:
                asked[key_of.pop(op.saga)].remove(op.saga)
        for k, limit in LIMITS.items():
            rows = await _rows(store, k)
            holders = [s for s, held in rows if held]
            waiting = [s for s, held in rows if not held]
            assert len(holders) <= limit
            assert not waiting or len(holders) == limit
            # The rows are the live first-askers of the key, holders first in FIFO order.
            assert [int(s) for s, _ in rows] == asked[k]
            # No one granted ahead of a saga that asked before it and still waits.
            for s in waiting:
                earlier = asked[k][: asked[k].index(int(s))]
                assert all(int(h) in earlier for h in holders)


async def _rows(store: InMemoryEventStore, key: str) -> list[tuple[str, bool]]:
    return [(r.saga_id, r.held) for r in await store.key_slots("t", key)]


def _check_turn(turn: KeyTurn, saga: str, rows: list[tuple[str, bool]]) -> None:
    holders = tuple(s for s, held in rows if held)
    waiting = [s for s, held in rows if not held]
    assert turn.holders == holders
    assert turn.held == (saga in holders)
    assert turn.position == (0 if turn.held else waiting.index(saga) + 1)
