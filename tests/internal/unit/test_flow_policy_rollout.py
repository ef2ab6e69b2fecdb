"""Flow policies behind a flag: the versions configured in ``LimitsSettings.policies``,
the rollout that gives one a share of new sagas (``core/planning/_rollout``), and the
choice recorded in ``saga_started.flow_policy`` (a child runs under its parent's)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from saga_engine import Saga, SagaContext, SagaRegistry
from saga_engine.core.history._events import SagaStarted
from saga_engine.core.history._structs import to_data
from saga_engine.core.planning._rollout import (
    Rollout,
    RolloutSpec,
    RolloutTable,
    bucket,
    choose_flow_policy,
    flow_bucket,
    flow_policy_key,
    flow_policy_subject,
)
from saga_engine.replay import export_history, load_history, replay
from saga_engine.settings import FlowLimit, FlowPolicy, LimitsSettings, Settings
from saga_engine.testing import SagaTestEnv


class Order(BaseModel):
    tenant: str = "t"


class Done(BaseModel):
    ok: bool = True


class Leaf(Saga[Order, Done]):
    name = "leaf"

    async def run(self, ctx: SagaContext, input: Order) -> Done:
        return Done()


class Parent(Saga[Order, Done]):
    name = "parent"
    rollout_predicates = {"gold": lambda i: i.get("tenant") == "gold"}

    async def run(self, ctx: SagaContext, input: Order) -> Done:
        return await ctx.child(Leaf, input)


POLICIES = {"participants": {"p": {"concurrency": 4}}, "policies": {"2": {}, "3": {}}}


def _row(key: str, version: int, percent: int, predicate: str | None = None) -> Rollout:
    return Rollout(
        saga_type=key,
        version=version,
        percent=percent,
        predicate=predicate,
        updated_at=datetime.now(UTC),
        updated_by="t",
    )


# ---------------------------------------------------------------------------- settings


def test_version_1_is_the_top_level_fields_and_the_others_are_numbered_from_2() -> None:
    limits = LimitsSettings.model_validate(
        {
            "participants": {"p": {"concurrency": 4}},
            "policies": {"3": {"learned_costs": False}, "2": {"fairness_weights": {"a": 2}}},
        }
    )
    assert limits.versions == [1, 2, 3]
    assert limits.policy(None) is limits
    assert limits.policy(1) is limits
    assert limits.policy(2).weight_of("a") == 2
    assert limits.policy(3).learned_costs is False
    # A saga recorded on a version this engine does not configure (any more) runs under
    # the highest configured below it.
    assert limits.resolve(7) == 3
    assert limits.policy(7) is limits.policy(3)
    assert limits.resolve(0) == 1
    with pytest.raises(ValidationError, match="number the others from 2"):
        LimitsSettings.model_validate({"policies": {"1": {}}})
    with pytest.raises(ValidationError, match="2 to 10000"):
        LimitsSettings.model_validate({"policies": {"10001": {}}})
    with pytest.raises(ValidationError, match="extra"):
        LimitsSettings.model_validate({"policies": {"2": {"aging_s": 3}}})


def test_a_policy_of_its_own_enables_flow_control() -> None:
    assert not LimitsSettings().enabled
    only_v2 = LimitsSettings(policies={2: FlowPolicy(participants={"p": FlowLimit(rate=5)})})
    assert only_v2.enabled
    assert not only_v2.limits_anything


def test_an_algorithm_is_for_an_adaptive_limit() -> None:
    assert FlowLimit(concurrency="adaptive", algorithm="aimd").algorithm == "aimd"
    with pytest.raises(ValidationError, match='concurrency="adaptive"'):
        FlowLimit(concurrency=3, algorithm="aimd")
    with pytest.raises(ValidationError):
        FlowLimit.model_validate({"concurrency": "adaptive", "algorithm": "vegas"})


def test_policies_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "SAGA_LIMITS__POLICIES",
        '{"2": {"participants": {"payments": {"concurrency": "adaptive", "algorithm": "aimd"}}}}',
    )
    limits = Settings().limits
    assert limits.versions == [1, 2]
    assert limits.policy(2).participants["payments"].algorithm == "aimd"


# ---------------------------------------------------------------------------- the choice


def test_the_flow_bucket_is_salted_apart_from_the_version_bucket() -> None:
    ids = [f"s-{i}" for i in range(400)]
    same = sum(bucket("order", i) == flow_bucket("order", i) for i in ids)
    assert same < 20  # independent: about 1 in 100 agree by chance
    assert [flow_bucket("order", i) for i in ids] == [flow_bucket("order", i) for i in ids]


def test_the_rule_percent_predicate_and_a_version_not_configured() -> None:
    never = lambda name: False  # noqa: E731
    always = lambda name: name == "gold"  # noqa: E731
    spec = RolloutSpec(version=3, percent=30)
    assert choose_flow_policy([1, 2, 3], spec, 29, never) == 3
    assert choose_flow_policy([1, 2, 3], spec, 30, never) == 2  # the highest below
    spec = RolloutSpec(version=3, percent=0, predicate="gold")
    assert choose_flow_policy([1, 2, 3], spec, 5, always) == 3
    assert choose_flow_policy([1, 2, 3], spec, 5, never) == 2
    # Set before the engines that configure it are deployed: the stable one meanwhile.
    assert choose_flow_policy([1, 2], RolloutSpec(version=3, percent=100), 0, always) == 2
    # Rolled out to everyone, then back to 0: a rollback.
    assert choose_flow_policy([1, 2], RolloutSpec(version=2, percent=100), 99, never) == 2
    assert choose_flow_policy([1, 2], RolloutSpec(version=2, percent=0), 0, never) == 1


def test_no_row_is_version_1_and_a_type_s_row_wins_over_every_type_s() -> None:
    registry = SagaRegistry([Parent, Leaf])
    parent = registry.get("parent")
    table = RolloutTable()

    def pick(definition: Any, saga_id: str, input: dict[str, Any] | None = None) -> int | None:
        return table.flow_policy(registry, definition, [1, 2, 3], saga_id, input or {})

    assert pick(parent, "x") is None  # configured dark: no saga until rolled out
    table.put(flow_policy_key(None), _row(flow_policy_key(None), 2, 100))
    assert pick(parent, "x") == 2
    assert pick(registry.get("leaf"), "x") == 2
    table.put(flow_policy_key("parent"), _row(flow_policy_key("parent"), 3, 0, "gold"))
    assert pick(parent, "x", {"tenant": "gold"}) == 3
    assert pick(parent, "x", {"tenant": "lead"}) == 2  # the type's row: its stable is 2
    assert pick(registry.get("leaf"), "x") == 2
    # One policy configured: nothing is chosen, the rows are not even looked at.
    assert table.flow_policy(registry, parent, [1], "x", {"tenant": "gold"}) is None
    assert flow_policy_subject(flow_policy_key(None)) == "*"
    assert flow_policy_subject("parent") is None


# ---------------------------------------------------------------------------- recorded


def _env() -> SagaTestEnv:
    return SagaTestEnv(
        [Parent, Leaf], settings=Settings(limits=LimitsSettings.model_validate(POLICIES))
    )


async def test_a_start_records_its_policy_and_replay_reads_it() -> None:
    env = _env()
    await env.set_flow_rollout(3, 40)
    ids = [f"o-{i}" for i in range(30)]
    for saga_id in ids:
        await env.engine.start("parent", {"tenant": "t"}, saga_id=saga_id)
    await env.settle()
    chosen: dict[str, Any] = {}
    for saga_id in ids:
        history = await env.engine.history(saga_id)
        started = history[0]
        assert isinstance(started, SagaStarted)
        want = 3 if flow_bucket("parent", saga_id) < 40 else 2
        assert started.flow_policy == want, saga_id
        chosen[saga_id] = started.flow_policy
        # Through the stored JSON shape, as recovery and `saga replay` read it.
        export = load_history(export_history(saga_id, "parent", history))
        exported = export.events[0]
        assert isinstance(exported, SagaStarted)
        assert exported.flow_policy == want
        assert replay([Parent, Leaf], export).deterministic
    assert set(chosen.values()) == {2, 3}


async def test_version_1_is_left_out_of_the_stored_start() -> None:
    env = _env()
    run = await env.start(Parent, {"tenant": "t"})
    (started, *_) = await env.engine.history(run.saga_id)
    assert isinstance(started, SagaStarted)
    assert started.flow_policy is None
    assert "flow_policy" not in to_data(started)


async def test_a_child_runs_under_its_parent_s_policy() -> None:
    env = _env()
    await env.set_flow_rollout(2, 100, saga_type="parent")
    await env.set_flow_rollout(3, 100, saga_type="leaf")  # a start of its own would take 3
    run = await env.start(Parent, {"tenant": "t"})
    await run.output()
    children = [s for s in await env.store.list_sagas() if s.saga_type == "leaf"]
    assert len(children) == 1
    (started, *_) = await env.engine.history(children[0].saga_id)
    assert isinstance(started, SagaStarted)
    assert started.flow_policy == 2
    alone = await env.start(Leaf, {"tenant": "t"})
    (started, *_) = await env.engine.history(alone.saga_id)
    assert isinstance(started, SagaStarted)
    assert started.flow_policy == 3
