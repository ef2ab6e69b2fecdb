"""Test your sagas in memory: scripted participants, virtual time, no servers.

::

    from saga_engine.testing import SagaTestEnv

    async def test_out_of_stock_compensates():
        env = SagaTestEnv([PlaceOrder])
        env.participant("inventory").on(ReserveStock, reject="out of stock")
        run = await env.start(PlaceOrder, OrderRequest(customer="c1", total=30))
        assert await run.status() == SagaStatus.COMPENSATED
        assert env.compensated_steps() == ["reserve-credit"]

The environment runs the real engine and the real decision core, with an in-memory
event store, an in-memory command bus and a virtual clock that moves only when you
call ``advance`` (or ``run_until_settled``), so timers and timeouts take no real time.
"""

from saga_engine.runner._testing import (
    InMemoryCommandBus,
    SagaRun,
    SagaTestEnv,
    ScriptedParticipant,
)

__all__ = ["InMemoryCommandBus", "SagaRun", "SagaTestEnv", "ScriptedParticipant"]
