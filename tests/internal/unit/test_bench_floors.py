"""The straight-line floor in bench/floors.py stands for the same saga the decision core
runs: the same events, in the same order, with the same command ids' shape and payloads."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import orjson

from bench.app import Transfer
from bench.floors import _straight_line
from saga_engine.core.authoring._definition import SagaDefinition
from saga_engine.core.history._decision import Reply, StartSaga
from saga_engine.core.history._events import event_to_dict
from saga_engine.core.runtime._runtime import SagaRuntime


def _core_history() -> list[dict[str, object]]:
    now = datetime.now(UTC)
    definition = SagaDefinition.of(Transfer)
    start = StartSaga(
        saga_id=str(uuid.uuid4()), saga_type=Transfer.name, input={"amount": 5}, at=now
    )
    runtime, decision = SagaRuntime.start(definition, start)
    while decision.commands:
        cid = decision.commands[0].command_id
        decision = runtime.handle(Reply(cid, "success", now, payload={"receipt": "p:1"}))
    history = [event_to_dict(e) for e in runtime.history]
    runtime.close()
    return history


def test_the_straight_line_writes_the_core_s_events_in_its_order() -> None:
    core = _core_history()
    line = [orjson.loads(raw) for raw in _straight_line(datetime.now(UTC))]
    assert [e["kind"] for e in line] == [e["kind"] for e in core]
    assert [e.get("payload") for e in line] == [e.get("payload") for e in core]
    assert line[-1]["output"] == core[-1]["output"]
    assert line[0]["input"] == core[0]["input"]
