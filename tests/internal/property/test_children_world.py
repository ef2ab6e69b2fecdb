"""Parents and children through a lossy network (``children_world``): whatever is lost,
doubled, reordered or refused, and whenever a parent is cancelled or the engine replaced,
every parent ends, every child ends, no effect is applied twice, and every step a
compensated (or cancelled) parent's child applied is undone exactly once."""

from __future__ import annotations

from hypothesis import given

from saga_engine import SagaStatus
from saga_engine._decision import child_saga_id
from tests.internal.property.children_world import Action, Item, World, actions, items
from tests.internal.property.test_runtime_properties import PROPERTY

UNDONE = (SagaStatus.COMPENSATED, SagaStatus.CANCELLED)


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
    for parent in world.parents:
        child = child_saga_id(parent, "world-shipment")
        ended = statuses[parent]
        for saga_id in (parent, child):
            for saga, step in applied:
                if saga != saga_id:
                    continue
                # Undone exactly once when the parent was undone (or the child undid
                # itself), never when the whole transaction completed.
                expected = 0 if ended == SagaStatus.COMPLETED else 1
                assert world.db.undone[(saga, step)] == expected, (saga, step, ended, statuses)
        if ended == SagaStatus.COMPLETED:
            assert statuses[child] == SagaStatus.COMPLETED
        elif child in statuses:
            assert statuses[child] in (*UNDONE, SagaStatus.FAILED, SagaStatus.COMPLETED)
