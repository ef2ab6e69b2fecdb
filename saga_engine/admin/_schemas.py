"""The admin API's request and response bodies (they are its OpenAPI schema)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from saga_engine.core.history._status import SagaStatus
from saga_engine.core.views._graph_view import NodeState
from saga_engine.core.views._view import OwedState, WaitKind
from saga_engine.kernel._input_types import StorableText
from saga_engine.store._coverage import ReadCoverage

#: A name or an id a request gives (a signal's, an update's, an idempotency key).
Name = Annotated[str, StorableText(min_length=1, max_length=200)]
#: An optional reason (the empty text when none is given).
OptionalReason = Annotated[str, StorableText(strip=True, max_length=2000)]

#: A required, human reason for an operator action: it goes into the saga's history.
Reason = Annotated[
    str,
    StorableText(strip=True, min_length=1, max_length=2000),
    Field(description="Why the operator acts; recorded in the saga's history with the principal."),
]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ErrorBody(BaseModel):
    detail: Any = Field(description="What is wrong, in words (or pydantic's error list).")
    error: str | None = Field(default=None, description="The engine's error class, if any.")


class Health(BaseModel):
    status: Literal["ok", "degraded", "failing"] = "ok"
    #: Present when degraded: what is wrong (a partition no fetch can read, a consumer
    #: group that does not settle), one line each.
    problems: list[str] | None = None


class SagaSummary(BaseModel):
    saga_id: str
    saga_type: str
    status: SagaStatus
    current_step: str | None = None
    next_wakeup: datetime | None = None
    error: dict[str, Any] | None = None
    created_at: datetime
    updated_at: datetime
    saga_version: int = Field(
        default=1, description="The version of its saga type it runs (chosen by the rollout)."
    )


class PendingCompensation(BaseModel):
    step: str
    participant: str
    command_type: str
    payload: dict[str, Any]
    state: OwedState = Field(
        description="owed: the step was applied and will be undone if the saga fails or is "
        "cancelled; in_doubt: the step's outcome is not known yet (in flight or timed out), "
        "so its compensation is owed if the saga stops now; pending: compensation begun, "
        "this one not sent yet; compensating: sent, awaiting its reply; stuck: it "
        "exhausted its retries (resume the saga to retry it)."
    )
    attempts: int = Field(default=0, description="Compensation attempts so far.")
    last_error: str | None = None


class WaitingFor(BaseModel):
    """One thing an open saga waits for before it can move on."""

    kind: WaitKind = Field(
        description="reply: a participant's answer to a command sent; signal: a named "
        "signal (until: its deadline, if the wait has one); timer: a durable sleep; "
        "backoff: the pause before a step's next attempt; operator: a human (a held "
        "reply, a stuck compensation, a parked saga); key: its concurrency key, held by "
        "other sagas (it is queued behind them, FIFO per key); event: another service's "
        "domain event, correlated by a business key (until: the wait's deadline)."
    )
    what: str = Field(description="The same, in words.")
    since: datetime
    until: datetime | None = Field(
        default=None,
        description="When it ends on its own: the attempt's timeout, the signal's "
        "deadline, the timer's time. Null: only its answer ends it.",
    )
    step: str | None = None
    name: str | None = Field(
        default=None, description="The signal's name, the timer's id or the concurrency key."
    )
    attempt: int | None = Field(
        default=None, description="The attempt a reply or a back-off is about."
    )
    compensation: bool = False
    last_error: str | None = Field(
        default=None, description="A back-off's cause: the error of the attempt it follows."
    )


class SagaListItem(SagaSummary):
    """A saga as the list shows it: its summary, when it last moved, what it waits for,
    its business keys and its parent."""

    activity_at: datetime = Field(
        description="Its last activity, the list's default order: when it ended, or for "
        "an open saga when it last changed."
    )
    ended_at: datetime | None = None
    waiting_for: list[WaitingFor] = Field(
        default_factory=list,
        description="What it waits for now, as on its own page (empty once it has ended).",
    )
    search_attributes: dict[str, str] = Field(
        default_factory=dict, description="Its type's declared search attributes."
    )
    parent_id: str | None = Field(
        default=None, description="The saga that started it with ctx.child, if one did."
    )


class StatusCount(BaseModel):
    status: SagaStatus
    count: int
    at_least: bool = Field(description="The count stopped at its cap: there are this many or more.")


class MissingShard(BaseModel):
    """A shard of a sharded store that a read could not reach: the answer lacks its
    sagas (``docs/operations.md``, "Past one database")."""

    shard: str = Field(description="The shard's name (SAGA_PG__SHARDS).")
    reason: str = Field(description="Why it could not be read.")

    @classmethod
    def of(cls, seen: ReadCoverage) -> list[MissingShard]:
        """The shards the reads of a ``coverage()`` block skipped, by name."""
        return [cls(shard=name, reason=reason) for name, reason in sorted(seen.missing.items())]


class SagaPage(BaseModel):
    items: list[SagaListItem]
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next page; null when there is none."
    )
    counts: list[StatusCount] | None = Field(
        default=None,
        description="How many sagas match every filter but `status`, per status (statuses "
        "with none left out); on the first page only (no `cursor`).",
    )
    missing_shards: list[MissingShard] = Field(
        default_factory=list,
        description="Sharded stores only: shards that did not answer. When not empty the "
        "page is partial: it lacks their sagas, and the counts lack theirs.",
    )


class SagaAction(BaseModel):
    """An operator action the saga accepts now (the engine would not refuse it)."""

    name: str = Field(
        description="signal, cancel, force-compensate, resume, retry (also re-sends a "
        "command waiting for its reply, same id) or skip: the action's POST path."
    )
    steps: list[str] = Field(
        default_factory=list, description="The steps it applies to (retry, skip)."
    )


class StepProgress(BaseModel):
    """A participant's report on the command it is handling (``tx.progress``): not
    durable, kept in this process's memory while the command runs."""

    attempt: int = Field(description="The participant's attempt at the command, from 1.")
    seq: int = Field(description="The report's number within that attempt, from 1.")
    at: datetime = Field(description="When the participant made it.")
    body: Any = Field(description="What it says: any JSON value.")


class InFlightCommand(BaseModel):
    """A command sent and not answered (or answered by a reply held as invalid)."""

    step: str
    command_id: str
    attempt: int
    participant: str
    command_type: str
    compensation: bool
    since: datetime
    timeout_at: datetime | None = None
    held: str | None = Field(
        default=None, description="Why its success reply is held, waiting for an operator."
    )
    progress: list[StepProgress] = Field(
        default_factory=list,
        description="The participant's latest reports on it, oldest first (docs/progress.md).",
    )


class SagaRef(BaseModel):
    saga_id: str
    status: SagaStatus


class RerunRef(BaseModel):
    """The saga an operator re-ran as this one (``POST /sagas/{id}/rerun``)."""

    saga_id: str
    principal: str
    reason: str


class ParentRef(BaseModel):
    """The saga that started this one with ``ctx.child``."""

    saga_id: str
    saga_type: str = ""
    command_id: str = Field(description="The parent's step command the child's end answers.")


class TriggerRef(BaseModel):
    """The Kafka record a trigger started this saga from."""

    topic: str
    partition: int
    offset: int


class ChildRef(BaseModel):
    """A child saga this one started with ``ctx.child``."""

    saga_id: str
    saga_type: str
    step: str = Field(description="The parent's step that started it.")
    status: SagaStatus | None = Field(description="Null while its start is on its way.")


class LineageNode(BaseModel):
    """One saga of a lineage tree, with the children it started."""

    saga_id: str
    saga_type: str
    status: SagaStatus | None = None
    step: str = Field(default="", description="The parent's step that started it.")
    children: list[LineageNode]
    truncated: bool = Field(
        default=False, description="More children exist than the tree shows (it is bounded)."
    )


class RunInfo(BaseModel):
    """One run of a saga (``ctx.continue_as_new`` begins the next)."""

    run: int = Field(description="Its number: the saga's first run is 1.")
    first_seq: int = Field(description="The sequence number of its first event.")
    events: int = Field(description="How many events it has.")


class SagaDetail(SagaSummary):
    input: dict[str, Any]
    output: dict[str, Any] | None = None
    waiting_for: list[WaitingFor] = Field(
        description="What the saga waits for now (empty once it has ended)."
    )
    in_flight: list[InFlightCommand]
    actions: list[SagaAction] = Field(
        default_factory=list,
        description="What an operator can do now; the page shows the same buttons.",
    )
    pending_compensations: list[PendingCompensation]
    deadline_at: datetime | None = None
    idempotency_key: str | None = None
    events: int = Field(description="How many events its history holds.")
    parent: ParentRef | None = Field(
        default=None, description="The saga that started it with ctx.child, if one did."
    )
    trigger: TriggerRef | None = Field(
        default=None, description="The trigger record it was started from, if a trigger did."
    )
    children: list[ChildRef] = Field(
        default_factory=list, description="The child sagas it started, in order."
    )
    rerun_of: RerunRef | None = Field(
        default=None, description="The saga an operator re-ran as this one, if one did."
    )
    reruns: list[SagaRef] = Field(
        default_factory=list,
        description="The sagas an operator started as reruns of this one (the first 50).",
    )
    pivot_step: str | None = Field(
        default=None,
        description="Its pivot step (pivot=True on a step, an HTTP step or a child), once issued.",
    )
    past_pivot: bool = Field(
        default=False,
        description="Its pivot step succeeded: it only goes forward (no cancel; a step "
        "that cannot succeed parks).",
    )
    parked_steps: list[str] = Field(
        default_factory=list,
        description="Forward steps parked for an operator (retry, maybe with an edited "
        "command, or skip).",
    )
    run: int = Field(
        default=1,
        description="The run shown (ctx.continue_as_new began it): `events` are its own, "
        "after its saga_started.",
    )
    runs: list[RunInfo] = Field(
        default_factory=list,
        description="The saga's chain of runs, first to current (one for a saga that never "
        "continued as new).",
    )
    history_warning: str | None = Field(
        default=None,
        description="Set when its current run's history has passed "
        "engine.continue_as_new_after events without continuing as new.",
    )


class SagaTypeInfo(BaseModel):
    name: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]


class GraphNodeInfo(BaseModel):
    """A node of a graph saga's declared graph (``saga_engine.graph``)."""

    name: str
    kind: Literal["step", "http", "each"] = Field(
        description="A command to a participant, an HTTP call, or a fan-out (one step per item)."
    )
    to: str = Field(description="The participant, or the HTTP endpoint.")
    after: list[str] = Field(description="The nodes it runs after.")
    conditional: bool = Field(description="It runs only if its `when` holds (else: skipped).")
    compensable: bool = Field(description="It declares what undoes it.")
    max_items: int | None = Field(description="A fan-out's bound on its items.")
    pivot: bool
    cost: dict[str, float] | str | None = Field(
        default=None,
        description="What its command costs its participant while in flight: amounts, the "
        "name of a cost class (or `learned`), or null (docs/graphs.md).",
    )


#: An edge of a graph: (the node depended on, the node that depends on it).
Edge = tuple[str, str]


class GraphInfo(BaseModel):
    nodes: list[GraphNodeInfo] = Field(
        description="In an order that runs each node after the nodes it depends on."
    )
    edges: list[Edge] = Field(description="Each [dependency, dependent].")


class SagaTypeDetail(SagaTypeInfo):
    version: int = Field(description="The highest version registered here.")
    versions: list[int] = Field(description="Every version registered here.")
    signals: list[str] = Field(description="The signals it accepts.")
    search_attributes: list[str]
    graph: GraphInfo | None = Field(
        description="A graph saga's declared graph (of its highest version); null for a "
        "saga written as code."
    )


class GraphNodeState(GraphNodeInfo):
    state: NodeState = Field(
        description="pending, running, done, skipped (its `when` was false), failed, "
        "stopped (the saga stopped while it was under way), stuck (an operator is "
        "needed), undoing or undone."
    )
    items: dict[str, int] = Field(description="A fan-out: how many items are in each state.")
    started_at: datetime | None = Field(description="Its first command.")
    ended_at: datetime | None = Field(description="Its last reply (null while under way).")
    latency_ms: float | None = Field(
        description="From its first command to the reply that ended it (retries included), "
        "once it succeeded or failed."
    )
    attempts: int = Field(description="The commands it sent (every attempt, every item).")


class SagaGraph(BaseModel):
    saga_id: str
    saga_type: str
    saga_version: int
    status: SagaStatus
    nodes: list[GraphNodeState] = Field(description="The declared graph, each node's state.")
    edges: list[Edge] = Field(description="Each [dependency, dependent].")


class HistoryDocument(BaseModel):
    """The export that `saga replay` and `saga_engine.replay.load_history` read."""

    format: str
    saga_id: str
    saga_type: str
    events: list[dict[str, Any]]


class StartAccepted(BaseModel):
    saga_id: str
    status_url: str
    status: SagaStatus | None = Field(
        default=None, description="The status when answering (null if not yet recorded)."
    )


class SignalRequest(_Body):
    name: Name
    payload: dict[str, Any] = Field(default_factory=dict)
    signal_id: Name | None = Field(
        default=None, description="The same id twice is delivered once; generated if absent."
    )
    reason: OptionalReason = Field(
        default="", description="Why the operator sends it (written to the audit log)."
    )


class CancelRequest(_Body):
    reason: Reason


class ResumeRequest(_Body):
    reason: Reason


StepName = Annotated[
    str,
    StorableText(min_length=1, max_length=200),
    Field(description="The step's name, as the saga's code gives it."),
]


class RetryRequest(_Body):
    step: StepName
    reason: Reason
    command: dict[str, Any] | None = Field(
        default=None,
        description="For a step parked after it could not succeed: the command to send "
        "instead of its own (its command model's JSON; a 422 names each wrong field). It "
        "goes under a new command id; the original stays in the history.",
    )


class SkipRequest(_Body):
    step: StepName
    result: dict[str, Any] | None = Field(
        default=None,
        description="The step's result (its reply model's JSON); the step is not "
        "compensated. Required for a step waiting for its reply; not for a stuck "
        "compensation (the operator undid it by hand).",
    )
    reason: Reason


class RerunRequest(_Body):
    input: dict[str, Any] | None = Field(
        default=None,
        description="The new saga's input (its input model's JSON; a 422 names each wrong "
        "field); absent: the original's input.",
    )
    idempotency_key: Name | None = Field(
        default=None,
        description="The same key (and input) twice starts one saga; absent: derived from "
        "the original's id and the input, so the same rerun asked twice starts one saga.",
    )
    reason: Reason


class RerunAccepted(StartAccepted):
    rerun_of: str = Field(description="The saga re-run.")


class ForceCompensateRequest(_Body):
    reason: Reason


class ActionResult(BaseModel):
    saga_id: str
    action: Literal["signal", "cancel", "resume", "retry", "skip", "force-compensate"]
    principal: str
    status: SagaStatus = Field(description="The saga's status right after the action.")
    signal_id: str | None = None
    dropped: str | None = Field(
        default=None,
        description="Why the engine ignored the input, e.g. duplicate_signal (a repeated "
        "signal_id); null when it was applied.",
    )
    outcome: Literal["accepted"] = Field(
        default="accepted",
        description="What happened: accepted, the action is recorded in the saga's history "
        "(a refusal is a 4xx naming the reason; a 503 says whether it was recorded: "
        "error TransientError, nothing recorded, send it again; error OutcomeUnknown, "
        "the history could not be read to tell).",
    )
    note: str | None = Field(
        default=None,
        description="Set when the action is recorded but what it decided (a compensation, "
        "a step's command) could not be sent yet: it is owed from the history and sent "
        "when the broker takes it.",
    )


class FlowAdaptive(BaseModel):
    """An adaptive concurrency limit as this engine has found it."""

    algorithm: Literal["gradient", "aimd"] = Field(
        description="How it moves (FlowLimit.algorithm): in proportion to the latency's "
        "rise, or one more per round trip and a tenth less when latency doubles."
    )
    limit: int = Field(description="The commands it lets be in flight now.")
    min: int = Field(description="This engine's share of min_concurrency.")
    max: int = Field(description="This engine's share of max_concurrency.")
    cause: Literal["start", "latency_held", "latency_rose", "timeout", "probe", "bounds"] = Field(
        description="Why it last moved."
    )
    reason: str = Field(description="Why it last moved, with the figures.")
    baseline_ms: float | None = Field(description="A reply's latency with no queue.")
    recent_ms: float | None = Field(description="The recent replies' average latency.")
    replies: int = Field(description="Replies it learnt from since the engine started.")
    timeouts: int = Field(description="Timeouts it learnt from since the engine started.")


class FlowGate(BaseModel):
    """One flow-control limit as this engine applies it (``GET /flow``)."""

    kind: Literal["participant", "saga_type"]
    name: str
    policy: int = Field(
        description="The flow policy whose limit it is (1: SAGA_LIMITS__'s own fields; "
        "others: SAGA_LIMITS__POLICIES). Its sagas' commands go through it."
    )
    concurrency_limit: int | Literal["adaptive"] | None = Field(
        description='The configured cluster-wide limit ("adaptive": found from latency).'
    )
    rate_limit: float | None = Field(description="The configured commands per second.")
    share: float = Field(description="This engine's share: owned inbox partitions / all.")
    policy_share: float = Field(
        description="The policy's share of the limit where several policies limit the same "
        "name (its share of their recent commands); 1 where it alone does."
    )
    effective_concurrency: int | None = Field(
        description="ceil(limit x share x policy_share); an adaptive limit's current value"
    )
    effective_rate: float | None = Field(description="rate x share x policy_share")
    in_flight: int = Field(description="Commands sent and not yet answered, timed out or ended.")
    waiting: int = Field(description="Commands recorded and held back by this limit.")
    sent: int = Field(description="Commands sent through this limit since the engine started.")
    budget: dict[str, float] | None = Field(
        default=None, description="The configured cluster-wide budget, per resource."
    )
    effective_budget: dict[str, float] | None = Field(
        default=None,
        description="This engine's share of the budget: amount x share x policy_share.",
    )
    budget_in_use: dict[str, float] | None = Field(
        default=None,
        description="What the commands in flight hold of the budget: the sum of their costs.",
    )
    adaptive: FlowAdaptive | None = Field(
        default=None, description="The adaptive concurrency limit (null: not adaptive)."
    )


class FlowBody(BaseModel):
    enabled: bool = Field(description="A limit is configured (SAGA_LIMITS__...).")
    aging_s: float | None = Field(description="Seconds per priority level a waiting command gains.")
    fairness_weights: dict[str, float] = Field(
        default_factory=dict,
        description='Each fairness key\'s weight under contention ("*": the others; default 1), '
        "in flow policy 1 (GET /flow/policies: every policy's).",
    )
    policies: list[int] = Field(
        default_factory=lambda: [1],
        description="The flow policies configured on this engine (1 always).",
    )
    gates: list[FlowGate]


class MetricsBody(BaseModel):
    open_sagas: dict[str, int] = Field(description="Open sagas by status.")
    open_total: int
    oldest_stuck_age_seconds: float | None = Field(
        description="Seconds since the longest-parked saga (compensation_stuck or "
        "nondeterministic) last changed; null when none is parked."
    )
    dead_lettered: int = Field(description="Messages this engine sent to the dead-letter topic.")
    counters: dict[str, int] = Field(description="The engine's counters since it started.")
    flow: list[FlowGate] = Field(
        default_factory=list,
        description="Flow control: in flight and waiting per limit (empty with no limit).",
    )


#: A saga type named in a path or a query.
TypeName = Annotated[str, StorableText(min_length=1, max_length=100)]


class RolloutRequest(_Body):
    version: int = Field(ge=1, le=10_000, description="The version rolled out.")
    percent: int = Field(
        ge=0, le=100, description="Share of new starts (by a bucket of their saga id) that get it."
    )
    predicate: Annotated[str, StorableText(min_length=1, max_length=200)] | None = Field(
        default=None,
        description="A named predicate of the saga classes (`rollout_predicates`): starts "
        "whose input it accepts get the version too.",
    )
    reason: Reason
