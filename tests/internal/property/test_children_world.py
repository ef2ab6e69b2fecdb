"""Parents, children and grandchildren through a lossy network (``children_world``):
whatever is lost, doubled, reordered or refused, and whenever a parent is cancelled or
the engine replaced, every saga ends, no effect is applied twice, and every step applied
anywhere in a transaction that did not complete is undone exactly once (and none of one
that completed)."""

from __future__ import annotations

from hypothesis import given

from saga_engine import SagaStatus
from saga_engine.events import SagaStarted
from tests.internal.property.children_world import Action, Item, World, actions, items
from tests.internal.property.test_runtime_properties import PROPERTY


@PROPERTY
@given(orders=items, script=actions)
async def test_every_parent_and_child_ends_and_each_applied_step_is_undone_once(
    orders: list[Item], script: list[Action]
) -> None:
    world = World()
    for index, item in enumerate(orders):
        await world.start(item, index)
    for kind, n in script:
        await world.act(kind, n)
    await world.drain()
    assert world.unexpected == []
    statuses = {r.saga_id: r.status for r in await world.store.list_sagas(limit=1000)}
    assert all(s.is_terminal for s in statuses.values()), statuses
    # No effect applied twice: one forward command applied per step of each saga.
    applied = list(world.db.applied.values())
    assert len(applied) == len(set(applied)), applied
    roots = await _roots(world)
    for saga, step in applied:
        # Undone exactly once when the whole transaction (its root parent) did not
        # complete, whether its parent undid it or it undid itself; never otherwise.
        completed = statuses[roots[saga]] == SagaStatus.COMPLETED
        expected = 0 if completed else 1
        assert world.db.undone[(saga, step)] == expected, (saga, step, statuses)
    for saga_id, status in statuses.items():
        if statuses[roots[saga_id]] == SagaStatus.COMPLETED:
            assert status == SagaStatus.COMPLETED, (saga_id, statuses)


async def _roots(world: World) -> dict[str, str]:
    """Each saga's root: the order whose transaction it belongs to."""
    parents: dict[str, str | None] = {}
    for record in await world.store.list_sagas(limit=1000):
        started = (await world.store.first_event(record.saga_id)).event
        assert isinstance(started, SagaStarted)
        parents[record.saga_id] = started.parent.saga_id if started.parent else None
    roots = {}
    for saga_id in parents:
        root = saga_id
        while parents[root] is not None:
            root = parents[root]  # type: ignore[assignment]
        roots[saga_id] = root
    return roots
