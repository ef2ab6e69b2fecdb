"""Gradual rollout of saga versions: which version of its type a new saga runs.

A saga type may have several versions registered side by side (``Saga.version``). A
start names the type; the rollout picks the version, once, and ``saga_started``
records it (``saga_version``): the saga runs that class for its whole life, replay
included (``SagaRegistry.for_history``).

- **No rollout row** for the type: the highest version registered.
- **A row** ``(version, percent, predicate)``: a start whose *bucket* (a hash of the
  saga type and id, 0-99) is below ``percent``, or whose input the named predicate
  accepts, runs ``version``; any other runs the highest registered version below it.
  The bucket depends on the id only, so a start delivered twice picks the same
  version. ``percent=0`` and no predicate is a *dark* deploy, or a rollback: no new
  start runs ``version``, the sagas already on it finish on it.
- A row naming a version this engine does not have (set before a deploy) leaves its
  starts on the highest version below it, until the version is deployed.

**Flow policies** (``LimitsSettings.policies``) are rolled out by the same rows, under
keys no saga type can have (a type's name has no ``:``): ``flow:*`` for every saga type
and ``flow:<type>`` for one (which wins over ``flow:*``). The rule is the one above, with
two differences: no row means version 1 (a policy is configured dark and takes no saga
until a rollout gives it some), and the bucket is salted (``flow_bucket``), so the
starts a flow policy takes are not the ones a saga version's rollout at the same
percent takes: two experiments at once do not confound each other. ``saga_started``
records the choice (``flow_policy``, left out when 1); a child takes its parent's.

Nothing here does I/O: the rows live in Postgres (migration 0008) or the in-memory
store, behind the ``RolloutStore`` port; every engine reads them every
``engine.rollout_refresh_s`` (``_rollout_runner``). A type with a single version
registered, with one flow policy configured, never looks at them: the start path's cost
is one dict lookup.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from saga_engine.kernel._serde import JsonDict

if TYPE_CHECKING:
    from saga_engine.core.authoring._definition import SagaDefinition, SagaRegistry

log = logging.getLogger("saga_engine.rollout")


def bucket(saga_type: str, saga_id: str) -> int:
    """The start's bucket, 0 to 99: the same for the same saga id, whatever engine or
    process computes it (sha256, not Python's salted ``hash``)."""
    digest = hashlib.sha256(f"{saga_type}\x00{saga_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 100


#: Where a flow policy's rollout rows are kept: ``flow:*`` (every saga type) and
#: ``flow:<saga type>`` (one type, winning over ``flow:*``).
FLOW_POLICY_PREFIX = "flow:"
#: The key of the flow-policy rollout of every saga type.
EVERY_TYPE = "*"


def flow_policy_key(saga_type: str | None) -> str:
    """The rollout row of the flow policy of ``saga_type`` (None: of every type)."""
    return FLOW_POLICY_PREFIX + (EVERY_TYPE if saga_type is None else saga_type)


def flow_policy_subject(key: str) -> str | None:
    """The saga type a flow-policy row is for (``EVERY_TYPE``: all), or None if ``key``
    is a saga type's own row."""
    return key[len(FLOW_POLICY_PREFIX) :] if key.startswith(FLOW_POLICY_PREFIX) else None


def flow_bucket(saga_type: str, saga_id: str) -> int:
    """A start's bucket for flow policies, 0 to 99: salted, so independent of its saga
    version bucket (``bucket``)."""
    return bucket(f"flow\x00{saga_type}", saga_id)


class RolloutSpec(BaseModel):
    """What an operator sets: the version rolled out, to which share, and/or to which
    starts (a predicate the saga classes name in ``rollout_predicates``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: int = Field(ge=1, le=10_000)
    percent: int = Field(default=0, ge=0, le=100)
    predicate: str | None = Field(default=None, min_length=1, max_length=200)


class Rollout(RolloutSpec):
    """A saga type's rollout as stored: the spec, and who set it when."""

    saga_type: str
    updated_at: datetime
    updated_by: str


class RolloutChange(BaseModel):
    """One audit row: a change of a saga type's rollout (``None``: no row)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    saga_type: str
    at: datetime
    principal: str
    reason: str
    before: RolloutSpec | None = None
    after: RolloutSpec | None = None


@runtime_checkable
class RolloutStore(Protocol):
    """Where rollouts live, so every engine applies the same ones (both stores have it)."""

    async def rollouts(self) -> list[Rollout]:
        """Every saga type's rollout row."""
        ...

    async def set_rollout(
        self,
        saga_type: str,
        spec: RolloutSpec | None,
        *,
        principal: str,
        reason: str,
        at: datetime,
    ) -> RolloutChange:
        """Sets (``None``: removes) a type's rollout and writes its audit row, together."""
        ...

    async def rollout_audit(
        self, saga_type: str | None = None, limit: int = 50
    ) -> list[RolloutChange]:
        """The audit trail, newest first (of one type, or of all)."""
        ...


class RolloutRows:
    """The in-memory store's rollouts: the same behaviour as Postgres's tables."""

    def __init__(self) -> None:
        self.rows: dict[str, Rollout] = {}
        self.audit: list[RolloutChange] = []


class InMemoryRollouts:
    """Mixed into InMemoryEventStore: ``RolloutStore`` over a ``RolloutRows``."""

    _rollouts: RolloutRows

    async def rollouts(self) -> list[Rollout]:
        return sorted(self._rollouts.rows.values(), key=lambda r: r.saga_type)

    async def set_rollout(
        self,
        saga_type: str,
        spec: RolloutSpec | None,
        *,
        principal: str,
        reason: str,
        at: datetime,
    ) -> RolloutChange:
        state = self._rollouts
        old = state.rows.get(saga_type)
        if spec is None:
            state.rows.pop(saga_type, None)
        else:
            state.rows[saga_type] = Rollout(
                saga_type=saga_type, updated_at=at, updated_by=principal, **spec.model_dump()
            )
        change = RolloutChange(
            saga_type=saga_type,
            at=at,
            principal=principal,
            reason=reason,
            before=spec_of(old),
            after=spec,
        )
        state.audit.append(change)
        return change

    async def rollout_audit(
        self, saga_type: str | None = None, limit: int = 50
    ) -> list[RolloutChange]:
        rows = [c for c in self._rollouts.audit if saga_type is None or c.saga_type == saga_type]
        return list(reversed(rows))[:limit]


def spec_of(rollout: Rollout | None) -> RolloutSpec | None:
    if rollout is None:
        return None
    return RolloutSpec(
        version=rollout.version, percent=rollout.percent, predicate=rollout.predicate
    )


class RolloutTable:
    """One engine's copy of the rollout rows, and the version choice of a start."""

    def __init__(self) -> None:
        self._rows: dict[str, Rollout] = {}
        #: When the rows were last read from the store (None: never).
        self.refreshed_at: datetime | None = None

    def replace(self, rows: list[Rollout], at: datetime) -> None:
        self._rows = {r.saga_type: r for r in rows}
        self.refreshed_at = at

    def put(self, saga_type: str, rollout: Rollout | None) -> None:
        """One type's row changed here (through this engine's admin API): applied at once."""
        if rollout is None:
            self._rows.pop(saga_type, None)
        else:
            self._rows[saga_type] = rollout

    def get(self, saga_type: str) -> Rollout | None:
        return self._rows.get(saga_type)

    def choose(
        self, registry: SagaRegistry, definition: SagaDefinition, saga_id: str, payload: JsonDict
    ) -> SagaDefinition:
        """The version a new saga of ``definition``'s type with this id and input runs."""
        versions = registry.versions(definition.name)
        if len(versions) < 2:
            return definition  # one version: nothing to choose (the common case)
        return choose_version(versions, self._rows.get(definition.name), saga_id, payload)

    def flow_rollout(self, saga_type: str) -> Rollout | None:
        """The flow-policy rollout that applies to a saga type's new starts."""
        rows = self._rows
        return rows.get(flow_policy_key(saga_type)) or rows.get(flow_policy_key(None))

    def flow_policy(
        self,
        registry: SagaRegistry,
        definition: SagaDefinition,
        policies: Sequence[int],
        saga_id: str,
        payload: JsonDict,
    ) -> int | None:
        """The flow policy a new saga runs under, among the versions configured
        (``policies``, 1 first); None: version 1."""
        if len(policies) < 2:
            return None  # one policy: nothing to choose (the common case)
        rollout = self.flow_rollout(definition.name)
        if rollout is None:
            return None
        chosen = choose_flow_policy(
            policies,
            rollout,
            flow_bucket(definition.name, saga_id),
            lambda name: _accepts(registry.versions(definition.name), name, payload),
        )
        return None if chosen == 1 else chosen


def choose_flow_policy(
    policies: Sequence[int],
    rollout: Rollout | RolloutSpec,
    flow_bucket: int,
    accepts: Callable[[str], bool],
) -> int:
    """The module docstring's rule for flow policies: the rolled-out version for a start
    whose bucket is below the percent or whose input the predicate accepts (if that
    version is configured here), else the highest configured below it (1 at least)."""
    below = [v for v in policies if v < rollout.version]
    stable = max(below) if below else 1
    if rollout.version not in policies:
        return stable  # not configured here (yet)
    if flow_bucket < rollout.percent:
        return rollout.version
    if rollout.predicate is not None and accepts(rollout.predicate):
        return rollout.version
    return stable


def choose_version(
    versions: Mapping[int, SagaDefinition],
    rollout: Rollout | RolloutSpec | None,
    saga_id: str,
    payload: JsonDict,
) -> SagaDefinition:
    """The rule of the module docstring, over the versions registered."""
    highest = versions[max(versions)]
    if rollout is None:
        return highest
    below = [v for v in versions if v < rollout.version]
    stable = versions[max(below)] if below else None
    target = versions.get(rollout.version)
    if target is None:
        return stable or highest  # not deployed here yet
    if stable is None:
        return target  # nothing older to stay on
    name = target.name
    if bucket(name, saga_id) < rollout.percent:
        return target
    if rollout.predicate is not None and _accepts(versions, rollout.predicate, payload):
        return target
    return stable


def predicate_named(versions: Mapping[int, SagaDefinition], name: str) -> Any:
    """The predicate ``name`` as the newest version that declares it has it, or None."""
    for version in sorted(versions, reverse=True):
        found = versions[version].cls.rollout_predicates.get(name)
        if found is not None:
            return found
    return None


def _accepts(versions: Mapping[int, SagaDefinition], name: str, payload: JsonDict) -> bool:
    predicate = predicate_named(versions, name)
    if predicate is None:
        return False  # a predicate of a newer deploy: nobody is selected by it here
    try:
        return bool(predicate(payload))
    except Exception:
        # A predicate that fails on an input must not fail the start: that start stays
        # on the stable version, and the log says why.
        log.warning(
            "rollout predicate %r failed on a start; it runs the stable version",
            name,
            exc_info=True,
        )
        return False
