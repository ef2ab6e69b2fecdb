"""The sagas of the chaos run past one database (``test_shard_chaos``): the drill's order
saga over its three participants (``drill_app``: they record each applied command in their
``drill_ledger``), without a step timeout, so that a saga whose shard is down for a while
ends as its input says (completed, or compensated when the last participant refuses it),
whatever the outage did to the timing.

    saga worker tests.internal.e2e.shard_app              # an engine process
    python -m tests.internal.e2e.drill_app participant NAME   # its participants
"""

from __future__ import annotations

from saga_engine import Saga, SagaContext
from tests.internal.e2e.drill_app import OrderDone, OrderInput, order_steps


class ShardOrder(Saga[OrderInput, OrderDone]):
    name = "shard-order"

    async def run(self, ctx: SagaContext, req: OrderInput) -> OrderDone:
        return await order_steps(ctx, req, timeout=None)
