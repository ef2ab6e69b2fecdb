"""Keeping an engine's rollout table in step with the store (see ``_rollout``).

Every engine reads the rollout rows when its worker starts (before its inbox: a start
never runs on a version a stored rollout holds back, say a dark deploy at 0 %) and then
every ``engine.rollout_refresh_s``: a change made through another engine's admin API
applies here within that delay (the engine that took the change applies it at once).
An engine with one version of each saga type and one flow policy never reads them
(nothing to choose).
"""

from __future__ import annotations

import asyncio
import logging

from saga_engine.core.authoring._definition import SagaRegistry
from saga_engine.core.planning._rollout import (
    Rollout,
    RolloutChange,
    RolloutSpec,
    RolloutStore,
    predicate_named,
)
from saga_engine.kernel._errors import InvalidPayload, InvalidTransition, TransientError
from saga_engine.kernel._settings import LimitsSettings
from saga_engine.runner._parts import EngineParts
from saga_engine.telemetry._telemetry import detach_from_trace

log = logging.getLogger("saga_engine.rollout")


def needs_rollouts(registry: SagaRegistry, limits: LimitsSettings) -> bool:
    """Whether some saga type has several versions deployed (in ``registry``), or
    several flow policies are configured (in ``limits``): a start then chooses."""
    if len(limits.versions) > 1:
        return True
    return any(len(registry.versions(name)) > 1 for name in registry.names())


async def refresh_rollouts(parts: EngineParts) -> bool:
    """Reads the rollout rows into ``parts.rollouts``; False if its store keeps none."""
    store = parts.store
    if not isinstance(store, RolloutStore):
        return False
    parts.rollouts.replace(await store.rollouts(), parts.clock.now())
    return True


async def apply_rollout(
    parts: EngineParts, saga_type: str, spec: RolloutSpec, *, principal: str, reason: str
) -> RolloutChange:
    """Stores a type's rollout with its audit row, and applies it on this engine at once
    (the other engines at their next refresh)."""
    store = parts.store
    if not isinstance(store, RolloutStore):
        raise InvalidTransition("this engine's store keeps no rollouts")
    at = parts.clock.now()
    change = await store.set_rollout(saga_type, spec, principal=principal, reason=reason, at=at)
    parts.rollouts.put(
        saga_type,
        Rollout(saga_type=saga_type, updated_at=at, updated_by=principal, **spec.model_dump()),
    )
    return change


async def remove_rollout(
    parts: EngineParts, key: str, *, principal: str, reason: str
) -> RolloutChange:
    """Removes a rollout row (a flow policy's: ``flow_policy_key``) with its audit row,
    on this engine at once (the others at their next refresh)."""
    store = parts.store
    if not isinstance(store, RolloutStore):
        raise InvalidTransition("this engine's store keeps no rollouts")
    change = await store.set_rollout(
        key, None, principal=principal, reason=reason, at=parts.clock.now()
    )
    parts.rollouts.put(key, None)
    return change


async def keep_rollouts_fresh(parts: EngineParts, interval_s: float) -> None:
    """Refreshes ``parts.rollouts`` every ``interval_s`` until cancelled."""
    detach_from_trace()
    while True:
        await asyncio.sleep(interval_s)  # a period, not a synchronisation
        try:
            await refresh_rollouts(parts)
        except TransientError as exc:
            log.warning("reading the rollouts failed (%s); keeping the last ones", exc)
        except Exception:
            log.exception("reading the rollouts failed; keeping the last ones")


def check_predicate(registry: SagaRegistry, names: list[str], predicate: str, what: str) -> None:
    """A rollout's predicate must be declared (``rollout_predicates``) by some version of
    one of the saga types ``names``: else InvalidPayload on the body's ``predicate``,
    listing those declared."""
    if any(predicate_named(registry.versions(name), predicate) for name in names):
        return
    declared = {
        n
        for name in names
        for d in registry.versions(name).values()
        for n in d.cls.rollout_predicates
    }
    raise InvalidPayload(
        what,
        [
            {
                "loc": ["predicate"],  # under the body: invalid_detail adds it
                "msg": f"no version of {' or '.join(repr(n) for n in names) or 'any saga type'} "
                f"declares a rollout predicate {predicate!r} "
                f"(declared: {', '.join(sorted(declared)) or 'none'})",
                "type": "unknown_predicate",
            }
        ],
    )
