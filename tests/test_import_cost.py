"""``import saga_engine`` is cheap: defining a saga loads neither the engine nor its I/O.

The root package loads ``Engine`` and ``run`` on first use (PEP 562); everything a saga's
definition needs (``Saga``, ``SagaContext``, ``Signal``, ``RetryPolicy``, the errors) is
pure. Each check runs in a fresh interpreter, where nothing else has been imported yet.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import saga_engine

HEAVY = ("opentelemetry", "asyncpg", "aiokafka", "fastapi", "saga_engine.runner._engine")

DEFINE_A_SAGA = """
    import sys
    from datetime import timedelta

    from pydantic import BaseModel

    from saga_engine import RetryPolicy, Saga, SagaContext, SagaRegistry, Signal, StepFailed


    class Order(BaseModel):
        customer: str
        total: int


    class Approval(BaseModel):
        approved: bool


    class Reserve(BaseModel):
        amount: int


    class PlaceOrder(Saga[Order, Order]):
        name = "place-order"
        approval = Signal(Approval)

        async def run(self, ctx: SagaContext, order: Order) -> Order:
            await ctx.step(
                "reserve",
                to="payments",
                command=Reserve(amount=order.total),
                compensate=Reserve(amount=-order.total),
                retry=RetryPolicy(max_attempts=3),
            )
            decision = await ctx.wait_signal(self.approval, timeout=timedelta(hours=1))
            if not decision.approved:
                raise StepFailed("approval", "refused")
            return order


    SagaRegistry([PlaceOrder])
    print(" ".join(sorted(sys.modules)))
"""


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_defining_a_saga_loads_neither_the_engine_nor_its_io() -> None:
    modules = _run(DEFINE_A_SAGA).split()
    assert "saga_engine" in modules
    loaded = [m for m in modules if m in HEAVY or m.split(".")[0] in HEAVY]
    assert not loaded, f"import saga_engine and a saga's definition loaded: {loaded}"


def test_the_engine_and_run_load_on_first_use() -> None:
    loaded = _run(
        """
        import sys
        import saga_engine
        assert "saga_engine.runner._engine" not in sys.modules
        assert {"Engine", "run", "saga_id_for"} <= set(dir(saga_engine))
        from saga_engine import Engine, run
        assert Engine is saga_engine.Engine and run is saga_engine.run
        print("saga_engine.runner._engine" in sys.modules)
        """
    )
    assert loaded == "True"


def test_the_lazy_names_are_the_engines_own() -> None:
    from saga_engine import Engine, run

    assert Engine.__module__ == "saga_engine.runner._engine"
    assert run.__module__ == "saga_engine.kernel._mainloop"
    assert {"Engine", "run", "saga_id_for"} <= set(saga_engine.__all__)
    with pytest.raises(AttributeError, match="no_such_name"):
        getattr(saga_engine, "no_such_name")  # noqa: B009
