"""The admin API's rollouts: which version of a saga type new starts run, changed at run
time and audited (docs/operations.md, "Rolling out a new saga version").

``PUT /rollouts/{saga_type}`` writes the row and its audit row (principal from the
token, the given reason) in one transaction, applies it on this engine at once, and
every other engine within ``engine.rollout_refresh_s``.

No ``from __future__ import annotations``: FastAPI reads the endpoints' annotations at
runtime.
"""

import logging
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse
from pydantic import BaseModel, Field

from saga_engine.admin._auth import PRINCIPAL_KEY, Principal, auth_required
from saga_engine.admin._deps import Caller, PartsDep
from saga_engine.admin._http_errors import api_router
from saga_engine.admin._route_helpers import ACTION_ERRORS, READ_ERRORS, errors
from saga_engine.admin._schemas import RolloutRequest, TypeName
from saga_engine.admin._web import _render, _root
from saga_engine.core.planning._rollout import (
    Rollout,
    RolloutChange,
    RolloutSpec,
    RolloutStore,
    flow_policy_subject,
    spec_of,
)
from saga_engine.kernel._errors import InvalidTransition
from saga_engine.kernel._settings import AdminSettings
from saga_engine.runner._parts import EngineParts
from saga_engine.runner._rollouts import apply_rollout, check_predicate

__all__ = ["RolloutView", "rollout_view", "router", "ui_router"]

audit = logging.getLogger("saga_engine.admin.audit")

router = api_router()


class RolloutView(BaseModel):
    saga_type: str
    versions: list[int] = Field(description="The versions deployed on this engine.")
    rollout: RolloutSpec | None = Field(
        description="The stored rollout; null: new starts run the highest version deployed."
    )
    updated_by: str | None = None
    summary: str = Field(description="What new starts run, in words.")
    audit: list[RolloutChange] = Field(description="The latest changes, newest first.")


def _store(parts: EngineParts) -> RolloutStore:
    store = parts.store
    if not isinstance(store, RolloutStore):
        raise InvalidTransition("this engine's store keeps no rollouts")
    return store


def _version_rollout_names(parts: EngineParts, rows: list[Rollout]) -> list[str]:
    """Every saga type deployed here or with a stored rollout (the flow policies' rows
    are not saga types': ``/flow/policies`` shows them)."""
    stored = {r.saga_type for r in rows if flow_policy_subject(r.saga_type) is None}
    return sorted(set(parts.registry.names()) | stored)


def describe(versions: list[int], spec: RolloutSpec | None) -> str:
    if not versions:
        return "not deployed on this engine"
    if spec is None:
        return f"every new start runs version {max(versions)} (the highest deployed)"
    below = [v for v in versions if v < spec.version]
    stable = f"version {max(below)}" if below else None
    if spec.version not in versions:
        return (
            f"version {spec.version} is not deployed on this engine: new starts run "
            f"{stable or f'version {max(versions)}'} until it is"
        )
    if stable is None:
        return f"every new start runs version {spec.version} (nothing older is deployed)"
    who = f"{spec.percent}% of new starts (by saga id)"
    if spec.predicate:
        who += f" and those matching predicate {spec.predicate!r}"
    return f"{who} run version {spec.version}; the others {stable}"


async def rollout_view(parts: EngineParts, saga_type: str, limit: int = 20) -> RolloutView:
    store = _store(parts)
    rows = {r.saga_type: r for r in await store.rollouts()}
    versions = sorted(parts.registry.versions(saga_type))
    row: Rollout | None = rows.get(saga_type)
    spec = spec_of(row)
    return RolloutView(
        saga_type=saga_type,
        versions=versions,
        rollout=spec,
        updated_by=None if row is None else row.updated_by,
        summary=describe(versions, spec),
        audit=await store.rollout_audit(saga_type, limit),
    )


@router.get("/rollouts", response_model=list[RolloutView], responses=errors(*READ_ERRORS))
async def list_rollouts(parts: PartsDep) -> list[RolloutView]:
    """Every saga type deployed here or with a stored rollout, with its latest changes."""
    rows = await _store(parts).rollouts()
    names = _version_rollout_names(parts, rows)
    return [await rollout_view(parts, name, limit=5) for name in names]


@router.get(
    "/rollouts/{saga_type}", response_model=RolloutView, responses=errors(*READ_ERRORS, 404)
)
async def get_rollout(
    saga_type: TypeName,
    parts: PartsDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 20,
) -> RolloutView:
    """A saga type's rollout and its audit trail (newest first)."""
    view = await rollout_view(parts, saga_type, limit)
    if not view.versions and view.rollout is None and not view.audit:
        parts.registry.get(saga_type)  # raises UnknownSagaType: 404
    return view


@router.put("/rollouts/{saga_type}", response_model=RolloutView, responses=errors(*ACTION_ERRORS))
async def set_rollout(
    saga_type: TypeName, body: RolloutRequest, caller: Caller, parts: PartsDep
) -> RolloutView:
    """Sets which version new starts of the type run. Running sagas keep theirs."""
    parts.registry.get(saga_type)  # a type deployed here, else 404
    versions = parts.registry.versions(saga_type)
    if body.predicate is not None and body.version in versions:
        check_predicate(
            parts.registry, [saga_type], body.predicate, f"the rollout of {saga_type!r}"
        )
    spec = RolloutSpec(version=body.version, percent=body.percent, predicate=body.predicate)
    # This engine applies it now; the others at their next refresh.
    change = await apply_rollout(parts, saga_type, spec, principal=caller.name, reason=body.reason)
    audit.info(
        "rollout of %s by %s: %s -> %s: %r",
        saga_type,
        caller.name,
        change.before,
        change.after,
        body.reason,
    )
    return await rollout_view(parts, saga_type)


def ui_router(parts: EngineParts, admin: AdminSettings) -> APIRouter:
    """``/ui/rollouts``: every saga type's rollout and its audit trail, for reading (a
    change goes through ``PUT /rollouts/{type}`` or ``saga rollout set``, with a reason)."""
    pages = APIRouter(prefix="/ui", include_in_schema=False)
    auth_on = auth_required(admin) is not None

    @pages.get("/rollouts", name="ui_rollouts")
    async def rollouts_page(request: Request) -> HTMLResponse:
        principal = request.scope.get("state", {}).get(PRINCIPAL_KEY)
        rows = await _store(parts).rollouts()
        names = _version_rollout_names(parts, rows)
        return _render(
            "rollouts.html",
            root=_root(request),
            user=principal if auth_on and isinstance(principal, Principal) else None,
            views=[await rollout_view(parts, name, limit=20) for name in names],
        )

    return pages
