"""Saga versions and the rollout's choice: deterministic by saga id, a named predicate,
dark deploys and rollbacks, and the registry that holds several versions of a name."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from saga_engine import (
    DefinitionError,
    Saga,
    SagaContext,
    SagaRegistry,
    SagaStatus,
    UnknownSagaType,
    UnknownSagaVersion,
)
from saga_engine.core.planning._rollout import (
    Rollout,
    RolloutSpec,
    RolloutTable,
    bucket,
    choose_version,
)
from saga_engine.core.runtime._runtime import SagaRuntime
from saga_engine.replay import export_history, load_history, replay
from saga_engine.testing import SagaTestEnv


class Order(BaseModel):
    tenant: str = "t"


class Done(BaseModel):
    version: int


class OrderV1(Saga[Order, Done]):
    name = "order"

    async def run(self, ctx: SagaContext, input: Order) -> Done:
        return Done(version=1)


class OrderV2(Saga[Order, Done]):
    name = "order"
    version = 2
    rollout_predicates = {"beta": lambda i: str(i.get("tenant", "")).startswith("beta-")}

    async def run(self, ctx: SagaContext, input: Order) -> Done:
        return Done(version=2)


class OrderV3(Saga[Order, Done]):
    name = "order"
    version = 3

    async def run(self, ctx: SagaContext, input: Order) -> Done:
        return Done(version=3)


IDS = [f"id-{i}" for i in range(2000)]


def test_the_bucket_is_a_stable_function_of_type_and_id() -> None:
    # Pinned: an engine of any version, in any process, buckets a saga id the same way.
    assert [bucket("transfer", f"id-{i}") for i in range(10)] == [
        69,
        0,
        22,
        27,
        67,
        21,
        72,
        52,
        21,
        24,
    ]
    # The type is part of the hash: one id is not in the same bucket for every type.
    assert [bucket("other", f"id-{i}") for i in range(10)] != [
        bucket("transfer", f"id-{i}") for i in range(10)
    ]
    assert all(0 <= bucket("order", i) < 100 for i in IDS)


def test_registry_holds_several_versions_of_a_name() -> None:
    registry = SagaRegistry([OrderV1, OrderV2])
    assert registry.get("order").cls is OrderV2  # the highest
    assert registry.get("order", 1).cls is OrderV1
    assert sorted(registry.versions("order")) == [1, 2]
    assert registry.names() == ["order"]
    assert registry.resolve(OrderV1).version == 1
    with pytest.raises(UnknownSagaVersion, match=r"version 3 is not deployed.*versions: 1, 2"):
        registry.get("order", 3)
    with pytest.raises(UnknownSagaType):
        registry.get("nope", 1)

    class Clash(Saga[Order, Done]):
        name = "order"
        version = 2

        async def run(self, ctx: SagaContext, input: Order) -> Done:
            return Done(version=0)

    with pytest.raises(DefinitionError, match="named 'order' at version 2"):
        registry.register(Clash)


def test_a_bad_version_is_refused_at_definition() -> None:
    with pytest.raises(DefinitionError, match="`version` must be an integer from 1"):

        class Bad(Saga[Order, Done]):
            name = "bad"
            version = 0

            async def run(self, ctx: SagaContext, input: Order) -> Done:
                return Done(version=0)


def _versions(*classes: type[Saga[Any, Any]]) -> Any:
    return SagaRegistry(classes).versions("order")


def test_no_rollout_row_runs_the_highest_version() -> None:
    versions = _versions(OrderV1, OrderV2)
    assert {choose_version(versions, None, i, {}).version for i in IDS} == {2}


def test_a_percentage_picks_exactly_the_ids_whose_bucket_is_below_it() -> None:
    versions = _versions(OrderV1, OrderV2)
    spec = RolloutSpec(version=2, percent=30)
    on_v2 = {i for i in IDS if choose_version(versions, spec, i, {}).version == 2}
    assert on_v2 == {i for i in IDS if bucket("order", i) < 30}
    assert 0.25 < len(on_v2) / len(IDS) < 0.35
    # Raising the share keeps every id already on the new version there.
    wider = {
        i
        for i in IDS
        if choose_version(versions, RolloutSpec(version=2, percent=50), i, {}).version == 2
    }
    assert on_v2 < wider


def test_zero_percent_is_dark_and_a_rollback_and_100_is_everyone() -> None:
    versions = _versions(OrderV1, OrderV2)
    assert {
        choose_version(versions, RolloutSpec(version=2, percent=0), i, {}).version for i in IDS
    } == {1}
    assert {
        choose_version(versions, RolloutSpec(version=2, percent=100), i, {}).version for i in IDS
    } == {2}


def test_a_predicate_selects_by_input() -> None:
    versions = _versions(OrderV1, OrderV2)
    spec = RolloutSpec(version=2, percent=0, predicate="beta")
    assert choose_version(versions, spec, "x", {"tenant": "beta-1"}).version == 2
    assert choose_version(versions, spec, "x", {"tenant": "acme"}).version == 1
    # A predicate this engine does not know (a newer deploy's) selects nobody here.
    unknown = RolloutSpec(version=2, percent=0, predicate="gamma")
    assert choose_version(versions, unknown, "x", {"tenant": "beta-1"}).version == 1


def test_a_failing_predicate_keeps_the_start_on_the_stable_version() -> None:
    class Raising(Saga[Order, Done]):
        name = "order"
        version = 2
        rollout_predicates = {"boom": lambda i: 1 / 0 > 0}

        async def run(self, ctx: SagaContext, input: Order) -> Done:
            return Done(version=2)

    versions = _versions(OrderV1, Raising)
    assert choose_version(versions, RolloutSpec(version=2, predicate="boom"), "x", {}).version == 1


def test_a_version_not_deployed_here_leaves_starts_below_it() -> None:
    assert (
        choose_version(_versions(OrderV1), RolloutSpec(version=2, percent=100), "x", {}).version
        == 1
    )
    # Rolling v2 out while v3 is deployed too: v2 against v1, v3 gets nothing.
    versions = _versions(OrderV1, OrderV2, OrderV3)
    picked = {
        choose_version(versions, RolloutSpec(version=2, percent=50), i, {}).version for i in IDS
    }
    assert picked == {1, 2}


def test_the_table_skips_types_with_one_version() -> None:
    table = RolloutTable()
    registry = SagaRegistry([OrderV2])
    definition = registry.get("order")
    assert table.choose(registry, definition, "x", {}) is definition


async def test_running_sagas_keep_their_version_and_replay_picks_it() -> None:
    env = SagaTestEnv([OrderV1, OrderV2])
    now = datetime.now(UTC)
    env.parts.rollouts.put(
        "order", Rollout(saga_type="order", version=2, percent=30, updated_at=now, updated_by="t")
    )
    ids = [f"s-{i}" for i in range(40)]
    for saga_id in ids:
        await env.engine.start("order", {"tenant": "t"}, saga_id=saga_id)
    for saga_id in ids:
        record = await env.engine.get(saga_id)
        want = 2 if bucket("order", saga_id) < 30 else 1
        assert record.saga_version == want, saga_id
        history = await env.engine.history(saga_id)
        assert history[-1].output == {"version": want}  # type: ignore[union-attr]
        # A replay (recovery, `saga replay`) picks the class the history recorded.
        assert env.parts.registry.for_history("order", history).version == want


class NapV1(Saga[Order, Done]):
    name = "nap"

    async def run(self, ctx: SagaContext, input: Order) -> Done:
        return Done(version=1)


class NapV2(Saga[Order, Done]):
    name = "nap"
    version = 2

    async def run(self, ctx: SagaContext, input: Order) -> Done:
        await ctx.sleep(timedelta(seconds=1))  # an intent v1 does not have
        return Done(version=2)


async def test_saga_replay_picks_the_class_of_the_recorded_version() -> None:
    env = SagaTestEnv([NapV1, NapV2])
    await env.set_rollout("nap", version=2, percent=100)
    run = await env.start(NapV1, Order())
    await env.advance(timedelta(seconds=2))
    assert await run.status() == SagaStatus.COMPLETED
    history = load_history(export_history(run.saga_id, "nap", await run.history()))
    result = replay([NapV1, NapV2], history)
    assert result.deterministic, result.error
    # The choice matters: the newest class (or v1's) would not match this history.
    v1 = SagaRegistry([NapV1]).get("nap")
    runtime, decision = SagaRuntime.replay(v1, run.saga_id, history.events)
    runtime.close()
    assert decision.nondeterminism is not None
    # An engine without the recorded version says so instead of replaying another class.
    with pytest.raises(UnknownSagaVersion):
        replay([NapV1], history)
