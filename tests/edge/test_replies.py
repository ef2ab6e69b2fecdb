"""A participant's reply that does not match its step's model parks the saga as
step_stuck, with the raw reply kept in history, and nothing is compensated; an operator
retries the step after deploying a fix, skips it with a valid result (checked like the
reply), or cancels. Over the real Kafka, Postgres and admin API."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from saga_engine import Saga, SagaContext, Settings, Signal
from saga_engine.protocol import Envelope, ReplyBody
from tests.cli.conftest import invoke, one_line_error
from tests.edge.conftest import (
    OPERATOR,
    Charge,
    Charged,
    Checkout,
    CheckoutFixed,
    Done,
    Go,
    Order,
    Refund,
    events,
    settled_on,
    start,
    status,
)
from tests.integration.kafka_helpers import fake_participant
from tests.served_worker import OPERATOR_TOKEN, ServedWorker, served_worker

pytestmark = pytest.mark.integration


def _bank(payload: dict[str, Any]) -> Any:
    """A bank that answers Charge with ``payload`` (success) and Refund with success."""

    def script(command: Envelope) -> ReplyBody:
        if command.subject == "Charge":
            return ReplyBody(outcome="success", payload=payload)
        return ReplyBody(outcome="success")

    return script


async def _stuck(served: ServedWorker, customer: str) -> tuple[str, list[dict[str, Any]]]:
    saga_id = await start(served, customer)
    await settled_on(served, saga_id, "step_stuck")
    return saga_id, await events(served, saga_id)


async def test_a_malformed_reply_parks_the_saga_and_a_valid_skip_lets_it_go_on(
    settings: Settings, served: ServedWorker
) -> None:
    malformed = {"receipt": "r-9", "amount": "one"}
    async with fake_participant(settings, "bank", _bank(malformed)) as received:
        saga_id, history = await _stuck(served, "c-skip")

        held = history[-1]
        assert held["kind"] == "invalid_reply_received"
        assert held["step"] == "charge"
        assert held["payload"] == malformed  # the raw reply, kept
        assert held["error"]["details"]["errors"][0]["loc"] == ["payload", "amount"]
        detail = (await served.http.get(f"/sagas/{saga_id}", headers=OPERATOR)).json()
        assert detail["status"] == "step_stuck"
        assert detail["error"]["type"] == "InvalidReply"
        assert "does not match Charged" in detail["error"]["message"]
        # The bank applied the charge: its refund would be owed if the saga stopped now.
        [owed] = detail["pending_compensations"]
        assert (owed["step"], owed["state"]) == ("charge", "owed")
        assert [c.subject for c in received] == ["Charge"]  # nothing compensated
        page = await served.http.get(f"/ui/sagas/{saga_id}", headers=OPERATOR)
        assert page.status_code == 200
        assert 'class="status s-step_stuck">step_stuck<' in page.text
        assert 'class="bar fwd o-invalid"' in page.text

        url = f"/sagas/{saga_id}"
        retry = await served.http.post(
            f"{url}/retry", json={"step": "charge", "reason": "again"}, headers=OPERATOR
        )
        assert retry.status_code == 409, retry.text
        assert "still does not match Charged" in retry.json()["detail"]
        bad_skip = await served.http.post(
            f"{url}/skip",
            json={"step": "charge", "result": {"receipt": "r-9", "amount": "one"}, "reason": "x"},
            headers=OPERATOR,
        )
        assert bad_skip.status_code == 422, bad_skip.text
        assert bad_skip.json()["detail"][0]["loc"] == ["body", "result", "amount"]
        resume = await served.http.post(f"{url}/resume", json={"reason": "go"}, headers=OPERATOR)
        assert resume.status_code == 409
        assert await events(served, saga_id) == history

        skip = await served.http.post(
            f"{url}/skip",
            json={"step": "charge", "result": {"receipt": "r-9", "amount": 1}, "reason": "ledger"},
            headers=OPERATOR,
        )
        assert skip.status_code == 200, skip.text
        assert skip.json()["status"] == "running"
        signal = await served.http.post(
            f"{url}/signal", json={"name": "go", "payload": {"ok": True}}, headers=OPERATOR
        )
        assert signal.status_code == 200, signal.text
        await settled_on(served, saga_id, "completed")
        done = (await served.http.get(url, headers=OPERATOR)).json()
        assert done["output"] == {"ok": True, "receipt": "r-9"}
        assert done["error"] is None
        assert [c.subject for c in received] == ["Charge"]


async def test_cancelling_a_stuck_saga_refunds_the_charge_the_bank_applied(
    settings: Settings, served: ServedWorker
) -> None:
    # A reply Postgres could not even store as it came: kept escaped, held all the same.
    nul = {"receipt": "r\u0000", "amount": 1}
    async with fake_participant(settings, "bank", _bank(nul)) as received:
        saga_id, history = await _stuck(served, "c-cancel")
        held = history[-1]
        assert held["kind"] == "invalid_reply_received"
        assert held["unstorable"] is True
        assert held["payload"] == {"receipt": "r\\u0000", "amount": 1}
        retry = await served.http.post(
            f"/sagas/{saga_id}/retry", json={"step": "charge", "reason": "r"}, headers=OPERATOR
        )
        assert retry.status_code == 409
        assert "skip the step with a corrected result" in retry.json()["detail"]
        cancel = await served.http.post(
            f"/sagas/{saga_id}/cancel", json={"reason": "bank contract broken"}, headers=OPERATOR
        )
        assert cancel.status_code == 200, cancel.text
        await settled_on(served, saga_id, "cancelled")
        assert [c.subject for c in received] == ["Charge", "Refund"]


async def test_a_skip_result_the_steps_model_refuses_is_a_422_from_api_and_cli(
    settings: Settings, served: ServedWorker
) -> None:
    async with fake_participant(settings, "bank", lambda _: None):  # never answers
        saga_id = await start(served, "c-silent")
        await settled_on(served, saga_id, "running")
        before = await events(served, saga_id)
        assert before[-1]["kind"] == "command_issued"

        bad = await served.http.post(
            f"/sagas/{saga_id}/skip",
            json={"step": "charge", "result": {"receipt": "by hand"}, "reason": "done by hand"},
            headers=OPERATOR,
        )
        assert bad.status_code == 422, bad.text
        assert bad.json()["detail"][0]["loc"] == ["body", "result", "amount"]
        assert bad.json()["detail"][0]["type"] == "missing"

        env = {"SAGA_ADMIN_TOKEN": OPERATOR_TOKEN, "SAGA_ADMIN_URL": served.url}
        args = ["skip", saga_id, "charge", "--result", '{"amount": "x"}', "--reason", "r"]
        line = await asyncio.to_thread(lambda: one_line_error(invoke(args, env), 5))
        assert line.startswith("error: 422: result.receipt: Field required")
        assert await events(served, saga_id) == before

        good = await asyncio.to_thread(
            invoke,
            [*args[:3], "--result", '{"receipt": "by hand", "amount": 1}', "--reason", "r"],
            env,
        )
        assert good.exit_code == 0, good.output
        assert (await events(served, saga_id))[len(before)]["kind"] == "step_skipped"


async def test_retry_after_deploying_a_fix_accepts_the_held_reply(settings: Settings) -> None:
    decimal = {"receipt": "r-5", "amount": "1.5"}  # the bank now sends decimals
    async with fake_participant(settings, "bank", _bank(decimal)) as received:
        async with served_worker(settings, [Checkout]) as old:
            saga_id, history = await _stuck(old, "c-fix")
        # The fix is deployed: a new engine, whose code reads decimals, takes the saga
        # over (replaying its history: the reply stays held until someone retries).
        async with served_worker(settings, [CheckoutFixed]) as new:
            assert await status(new, saga_id) == "step_stuck"
            assert await events(new, saga_id) == history
            retry = await new.http.post(
                f"/sagas/{saga_id}/retry",
                json={"step": "charge", "reason": "deployed the decimal fix"},
                headers=OPERATOR,
            )
            assert retry.status_code == 200, retry.text
            assert retry.json()["status"] == "running"
            signal = await new.http.post(
                f"/sagas/{saga_id}/signal",
                json={"name": "go", "payload": {"ok": True}},
                headers=OPERATOR,
            )
            assert signal.status_code == 200, signal.text
            await settled_on(new, saga_id, "completed")
            done = (await new.http.get(f"/sagas/{saga_id}", headers=OPERATOR)).json()
            assert done["output"] == {"ok": True, "receipt": "r-5"}
        assert [c.subject for c in received] == ["Charge"]  # accepted, not charged again


class Forgetful(Saga[Order, Done]):
    """Charges, then waits for a signal its class forgot to declare: a bug in the code."""

    name = "edge-forgetful"

    async def run(self, ctx: SagaContext, order: Order) -> Done:
        charged = await ctx.step(
            "charge",
            to="bank",
            command=Charge(customer=order.customer, amount=order.amount),
            compensate=Refund(customer=order.customer, amount=order.amount),
            returns=Charged,
        )
        decision = await ctx.wait_signal("go", Go)
        return Done(ok=decision.ok, receipt=charged.receipt)


class ForgetfulFixed(Forgetful):
    name = "edge-forgetful"
    go = Signal(Go)


async def test_a_bug_in_the_code_parks_the_saga_until_a_fixed_deploy(settings: Settings) -> None:
    charged = {"receipt": "r-1", "amount": 1}
    async with fake_participant(settings, "bank", _bank(charged)) as received:
        async with served_worker(settings, [Forgetful]) as old:
            start = await old.http.post(
                "/sagas/edge-forgetful", json={"customer": "c-bug"}, headers=OPERATOR
            )
            saga_id = start.json()["saga_id"]
            await settled_on(old, saga_id, "nondeterministic")
            detail = (await old.http.get(f"/sagas/{saga_id}", headers=OPERATOR)).json()
            assert detail["error"]["type"] == "DefinitionError"
            assert "add `go = Signal(Go)`" in detail["error"]["message"]
            history = await events(old, saga_id)
            assert history[-1]["kind"] == "saga_parked"
            assert history[-1]["reason"] == "definition_error"
            refused = await old.http.post(
                f"/sagas/{saga_id}/resume", json={"reason": "try"}, headers=OPERATOR
            )
            assert refused.status_code == 409
        async with served_worker(settings, [ForgetfulFixed]) as new:
            resumed = await new.http.post(
                f"/sagas/{saga_id}/resume", json={"reason": "declared go"}, headers=OPERATOR
            )
            assert resumed.status_code == 200, resumed.text
            signal = await new.http.post(
                f"/sagas/{saga_id}/signal",
                json={"name": "go", "payload": {"ok": True}},
                headers=OPERATOR,
            )
            assert signal.status_code == 200, signal.text
            await settled_on(new, saga_id, "completed")
        # The charge was applied once and never refunded: nothing compensated for a bug.
        assert [c.subject for c in received] == ["Charge"]
