"""The admin API's flow-control view: each limit, in flight, waiting and budget in use
(``GET /flow``).

No ``from __future__ import annotations``: FastAPI reads the endpoints' annotations at
runtime.
"""

from fastapi import APIRouter

from saga_engine.admin._deps import PartsDep
from saga_engine.admin._route_helpers import READ_ERRORS, errors
from saga_engine.admin._schemas import FlowBody, FlowGate
from saga_engine.runner._parts import EngineParts

__all__ = ["flow_body", "flow_gates", "router"]

router = APIRouter()


def flow_gates(parts: EngineParts) -> list[FlowGate]:
    """This engine's limits with what they hold now (none when flow control is off)."""
    if parts.flow is None:
        return []
    return [FlowGate.model_validate(gate) for gate in parts.flow.snapshot()]


def flow_body(parts: EngineParts) -> FlowBody:
    return FlowBody(
        enabled=parts.flow is not None,
        aging_s=parts.settings.limits.aging_s,
        fairness_weights=parts.settings.limits.fairness_weights,
        policies=parts.settings.limits.versions,
        gates=flow_gates(parts),
    )


@router.get("/flow", response_model=FlowBody, responses=errors(*READ_ERRORS), tags=["flow"])
async def flow(parts: PartsDep) -> FlowBody:
    """Flow control on this engine: per flow policy, participant and saga type limit,
    the configured figures, this engine's partition share of them (and the policy's,
    where several policies limit one name), the commands in flight and waiting, what
    those in flight hold of a budget, and the fairness keys' weights. Each engine
    answers for itself; the cluster's figures are the sums."""
    return flow_body(parts)
