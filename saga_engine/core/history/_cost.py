"""What a step's command costs its participant (``Cost``), and the rule that refuses a
cost no budget could ever hold (``cost_refusal``, ``check_cost_fits``): at step time by
the budgets of the saga's flow policy, ahead of a run by those of every policy.

A cost is held by its command from its send until its attempt is over, and flow control
sends a command only while the sum of the costs in flight stays within every budget of
its gates (``FlowLimit.budget``; ``core/planning/_flow``, docs/operations.md "Costs and
budgets"). ``command_issued`` records the cost as amounts (a named class resolved when
the command is recorded), so a command sent again after a recovery costs what it cost.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from saga_engine.kernel._settings import FlowLimit, FlowPolicy, LimitsSettings, resource_amounts


class Cost(Mapping[str, float]):
    """Named amounts of resources a command holds while it is in flight:
    ``Cost(cpu=4, memory_mb=512)`` (or ``Cost({"cpu": 4})``). Each amount is a finite
    number, at least 0; a resource left out (or 0) costs nothing. Immutable and hashable;
    reads as a mapping of resource to amount."""

    __slots__ = ("_amounts",)

    _amounts: dict[str, float]

    def __init__(self, amounts: Mapping[str, float] | None = None, /, **named: float) -> None:
        given = {**(amounts or {}), **named}
        checked = resource_amounts(given, "Cost", positive=False)
        object.__setattr__(self, "_amounts", {k: v for k, v in sorted(checked.items()) if v})

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Cost is immutable")

    def __getitem__(self, resource: str) -> float:
        return self._amounts[resource]

    def __iter__(self) -> Iterator[str]:
        return iter(self._amounts)

    def __len__(self) -> int:
        return len(self._amounts)

    def __hash__(self) -> int:
        return hash(tuple(self._amounts.items()))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Cost):
            return self._amounts == other._amounts
        return NotImplemented

    def __repr__(self) -> str:
        return f"Cost({', '.join(f'{k}={v:g}' for k, v in self._amounts.items())})"

    def as_dict(self) -> dict[str, float]:
        """The amounts as ``command_issued`` records them."""
        return dict(self._amounts)


#: The cost a step declares to be sent with what its participant was measured to spend on
#: it (``cost="learned"``): its replies' handler and CPU times (PROTOCOL.md 7.4a), kept by
#: the insights and turned into amounts by :func:`learned_cost`.
LEARNED = "learned"
#: A learned cost needs this many replies that reported their times; before, the step
#: costs nothing of a budget (as a step that declares no cost).
LEARNED_MIN_SAMPLES = 20


def learned_cost(samples: int, handler_ms: float, cpu_ms: float | None) -> Cost | None:
    """A step's learned cost from the means its replies reported: ``handler_s`` (seconds
    of handler time it holds) and, when CPU time was reported (the Python kit), ``cpu``
    (the cores it keeps busy while it runs: CPU time over handler time). None: too few
    samples to go by."""
    if samples < LEARNED_MIN_SAMPLES or handler_ms <= 0:
        return None
    amounts = {"handler_s": round(handler_ms / 1000, 6)}
    if cpu_ms is not None:
        amounts["cpu"] = round(cpu_ms / handler_ms, 3)
    return Cost(amounts)


def cost_class(name: str, limits: LimitsSettings) -> Cost | str:
    """The cost named ``name`` in ``limits.cost_classes``; or, for a name not there, why
    not (naming the classes there are and the setting)."""
    amounts = limits.cost_classes.get(name)
    if amounts is not None:
        return Cost(amounts)
    known = ", ".join(repr(k) for k in sorted(limits.cost_classes)) or "none"
    return (
        f"cost class {name!r} is not configured (known: {known}); declare it in "
        "SAGA_LIMITS__COST_CLASSES (LimitsSettings.cost_classes) or give a Cost(...)"
    )


def _gates(policy: FlowPolicy, participant: str, saga_type: str) -> Iterator[tuple[str, FlowLimit]]:
    for what, name, table in (
        ("participant", participant, policy.participants),
        ("saga type", saga_type, policy.saga_types),
    ):
        limit = table.get(name)
        if limit is not None and limit.budget:
            yield f"{what} {name!r}", limit


def cost_refusal(
    cost: Cost,
    policy: FlowPolicy,
    participant: str,
    saga_type: str,
    what: str,
    version: int | None = None,
) -> str | None:
    """Why ``what`` (a command of ``cost`` to ``participant``, in a saga of ``saga_type``)
    could never be sent under flow ``policy``: an amount above a whole budget of one of
    its gates (the cluster's figure: nothing in flight elsewhere could make room). None:
    it fits. ``version``: the policy's, named in the reason (None: not named, as with
    one policy configured)."""
    for gate, limit in _gates(policy, participant, saga_type):
        assert limit.budget is not None
        over = {r: a for r, a in cost.items() if r in limit.budget and a > limit.budget[r]}
        if over:
            needs = ", ".join(f"{r}={a:g}" for r, a in over.items())
            has = ", ".join(f"{r}={limit.budget[r]:g}" for r in over)
            where = gate if version is None else f"{gate} in flow policy {version}"
            setting = (
                "SAGA_LIMITS__POLICIES"
                if version is not None and version > 1
                else ("SAGA_LIMITS__...")
            )
            return (
                f"{what} costs {needs}, above the whole budget of {where} ({has}): it could "
                f"never be sent; lower its cost or raise the budget ({setting})"
            )
    return None


def check_cost_fits(
    cost: Cost | str | None,
    limits: LimitsSettings,
    participant: str,
    saga_type: str,
    what: str = "the command",
) -> str | None:
    """For a cost declared ahead of a run (a graph node's, at engine start): why it could
    never be sent (an unknown class, or an amount above a whole budget of any flow
    policy configured: a saga may run under any of them), or None."""
    if cost is None or cost == LEARNED:  # a learned cost is what it was: it ran
        return None
    if isinstance(cost, str):
        found = cost_class(cost, limits)
        if isinstance(found, str):
            return f"{what}: {found}"
        cost = found
    versions = limits.versions
    for version in versions:
        named = version if len(versions) > 1 else None
        refusal = cost_refusal(cost, limits.policy(version), participant, saga_type, what, named)
        if refusal is not None:
            return refusal
    return None
