"""The admin API's flow policies: the versions configured (``LimitsSettings.policies``)
and the rollout that gives each a share of new sagas, changed at run time and audited
(docs/operations.md, "Trying a flow policy on a share of sagas").

``PUT /flow/policies/rollout`` writes the row (``flow:*``, or ``flow:<saga type>`` for
one type) and its audit row in one transaction, through the saga versions' rollout
machinery (``core/planning/_rollout``); it applies on this engine at once and on every
other within ``engine.rollout_refresh_s``. ``DELETE`` removes a row: its starts go back
to the row of every type, or to version 1.

No ``from __future__ import annotations``: FastAPI reads the endpoints' annotations at
runtime.
"""

import logging
from typing import Annotated

from fastapi import Query
from pydantic import BaseModel, Field

from saga_engine.admin._deps import Caller, PartsDep
from saga_engine.admin._http_errors import api_router
from saga_engine.admin._route_helpers import ACTION_ERRORS, READ_ERRORS, errors
from saga_engine.admin._schemas import RolloutRequest, TypeName
from saga_engine.core.planning._rollout import (
    EVERY_TYPE,
    RolloutChange,
    RolloutSpec,
    RolloutStore,
    flow_policy_key,
    flow_policy_subject,
    spec_of,
)
from saga_engine.kernel._errors import InvalidTransition
from saga_engine.kernel._input_types import StorableText
from saga_engine.kernel._settings import FlowPolicy
from saga_engine.runner._parts import EngineParts
from saga_engine.runner._rollouts import apply_rollout, check_predicate, remove_rollout

__all__ = ["FlowPoliciesView", "flow_policies_view", "router"]

audit = logging.getLogger("saga_engine.admin.audit")

router = api_router()


class FlowRolloutRequest(RolloutRequest):
    """A saga version's rollout request, of a flow policy, and for one saga type or all."""

    saga_type: TypeName | None = Field(
        default=None,
        description="One saga type's rollout (it wins over the one of every type); "
        "null: every saga type's.",
    )


class FlowRollout(BaseModel):
    saga_type: str | None = Field(description="The saga type it is for; null: every type.")
    rollout: RolloutSpec
    updated_by: str
    summary: str = Field(description="What new sagas run under, in words.")


class FlowPoliciesView(BaseModel):
    versions: list[int] = Field(description="The flow policies configured on this engine.")
    policies: dict[int, FlowPolicy] = Field(
        description="Each version's limits, weights and learned-cost switch (1: the "
        "top-level SAGA_LIMITS__ fields)."
    )
    rollouts: list[FlowRollout] = Field(
        description="The stored flow-policy rollouts: of every type first, then per type."
    )
    audit: list[RolloutChange] = Field(description="The latest changes, newest first.")


def _store(parts: EngineParts) -> RolloutStore:
    store = parts.store
    if not isinstance(store, RolloutStore):
        raise InvalidTransition("this engine's store keeps no rollouts")
    return store


def describe_flow_rollout(versions: list[int], spec: RolloutSpec) -> str:
    """What the new sagas a flow-policy rollout covers run under, in words."""
    below = [v for v in versions if v < spec.version]
    stable = max(below) if below else 1
    if spec.version not in versions:
        return (
            f"flow policy {spec.version} is not configured on this engine: new sagas run "
            f"under policy {stable} until it is"
        )
    if spec.version == stable:
        return f"every new saga runs under flow policy {stable}"
    who = f"{spec.percent}% of new sagas (by saga id)"
    if spec.predicate:
        who += f" and those matching predicate {spec.predicate!r}"
    return f"{who} run under flow policy {spec.version}; the others under policy {stable}"


async def flow_policies_view(parts: EngineParts, limit: int = 20) -> FlowPoliciesView:
    """The versions, the rollouts, and the ``limit`` latest changes (0: none, and the
    audit is not read)."""
    store = _store(parts)
    limits = parts.settings.limits
    rollouts: list[FlowRollout] = []
    keys: list[str] = []
    for row in await store.rollouts():
        subject = flow_policy_subject(row.saga_type)
        if subject is None:
            continue
        spec = spec_of(row)
        assert spec is not None
        keys.append(row.saga_type)
        rollouts.append(
            FlowRollout(
                saga_type=None if subject == EVERY_TYPE else subject,
                rollout=spec,
                updated_by=row.updated_by,
                summary=describe_flow_rollout(limits.versions, spec),
            )
        )
    rollouts.sort(key=lambda r: (r.saga_type is not None, r.saga_type or ""))
    changes = []
    if limit > 0:
        audited = await store.rollout_audit(None, 500)
        changes = [c for c in audited if flow_policy_subject(c.saga_type)]
    return FlowPoliciesView(
        versions=limits.versions,
        policies={v: limits.policy(v) for v in limits.versions},
        rollouts=rollouts,
        audit=changes[:limit],
    )


@router.get(
    "/flow/policies",
    response_model=FlowPoliciesView,
    responses=errors(*READ_ERRORS),
    tags=["flow"],
)
async def get_flow_policies(
    parts: PartsDep, limit: Annotated[int, Query(ge=1, le=500)] = 20
) -> FlowPoliciesView:
    """The flow policies configured on this engine, the rollouts that give them a share
    of new sagas, and the latest changes (newest first)."""
    return await flow_policies_view(parts, limit)


@router.put(
    "/flow/policies/rollout",
    response_model=FlowPoliciesView,
    responses=errors(*ACTION_ERRORS),
    tags=["flow"],
)
async def set_flow_rollout(
    body: FlowRolloutRequest, caller: Caller, parts: PartsDep
) -> FlowPoliciesView:
    """Sets which flow policy new sagas (of every type, or of one) run under. Running
    sagas keep theirs."""
    if body.saga_type is not None:
        parts.registry.get(body.saga_type)  # a type deployed here, else 404
    if body.predicate is not None:
        names = [body.saga_type] if body.saga_type is not None else parts.registry.names()
        check_predicate(parts.registry, names, body.predicate, "the flow-policy rollout")
    spec = RolloutSpec(version=body.version, percent=body.percent, predicate=body.predicate)
    key = flow_policy_key(body.saga_type)
    change = await apply_rollout(parts, key, spec, principal=caller.name, reason=body.reason)
    audit.info(
        "flow-policy rollout %s by %s: %s -> %s: %r",
        key,
        caller.name,
        change.before,
        change.after,
        body.reason,
    )
    return await flow_policies_view(parts)


@router.delete(
    "/flow/policies/rollout",
    response_model=FlowPoliciesView,
    responses=errors(*ACTION_ERRORS),
    tags=["flow"],
)
async def clear_flow_rollout(
    caller: Caller,
    parts: PartsDep,
    reason: Annotated[str, StorableText(strip=True, min_length=1, max_length=2000), Query()],
    saga_type: Annotated[TypeName | None, Query()] = None,
) -> FlowPoliciesView:
    """Removes a flow-policy rollout: new sagas of the type go back to the rollout of
    every type; without a type, new sagas go back to policy 1 (where no type's own
    rollout applies). Running sagas keep theirs."""
    key = flow_policy_key(saga_type)
    change = await remove_rollout(parts, key, principal=caller.name, reason=reason)
    audit.info(
        "flow-policy rollout %s removed by %s (was %s): %r", key, caller.name, change.before, reason
    )
    return await flow_policies_view(parts)
