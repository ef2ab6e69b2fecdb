"""Callbacks through the public API (issue 41, section 2): ``ctx.callback``'s signed URL,
durable and replayable; its answer, its failure, its timeout; the first answer wins, a
repeat gets the same answer, another body a conflict; keys rotate like the codec's."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import orjson
import pytest
from pydantic import BaseModel, SecretStr

from saga_engine import (
    CallbackConflict,
    CallbackFailed,
    CallbackGone,
    CallbackSettings,
    CallbackTimeout,
    CallbackTokenInvalid,
    HttpRequest,
    InvalidPayload,
    PayloadTooLarge,
    Saga,
    SagaContext,
    SagaStatus,
    SagaTimeout,
    Settings,
    StepFailed,
    Winner,
)
from saga_engine.events import CallbackAwaited, CallbackReceived, event_to_json
from saga_engine.replay import HistoryExport, export_history, load_history, replay
from saga_engine.testing import SagaRun, SagaTestEnv


class Empty(BaseModel):
    pass


class Verdict(BaseModel):
    approved: bool
    score: int = 0


class Check(BaseModel):
    callback_url: str


class Out(BaseModel):
    outcome: str = ""


class Kyc(Saga[Empty, Out]):
    """Asks a KYC vendor for a verdict and waits two days for it on a callback URL."""

    name = "kyc"

    async def run(self, ctx: SagaContext, input: Empty) -> Out:
        cb = ctx.callback("kyc-verdict", model=Verdict, timeout=timedelta(days=2))
        await ctx.step("ask", to="kyc", command=Check(callback_url=cb.url))
        try:
            verdict = await cb
        except CallbackTimeout:
            return Out(outcome="timed out")
        except CallbackFailed as failed:
            return Out(outcome=f"failed: {failed.error} {failed.details}")
        return Out(outcome=f"approved={verdict.approved} score={verdict.score}")


class Raced(Saga[Empty, Out]):
    """The verdict races an hour's timer: the loser's URL stops working."""

    name = "raced"

    async def run(self, ctx: SagaContext, input: Empty) -> Out:
        cb = ctx.callback("verdict", model=Verdict, timeout=timedelta(days=1))
        await ctx.step("ask", to="kyc", command=Check(callback_url=cb.url))
        match await ctx.first(verdict=cb.wait(), expired=ctx.sleep(timedelta(hours=1))):
            case Winner("verdict", Verdict() as verdict):
                return Out(outcome=f"verdict {verdict.approved}")
            case _:
                await ctx.sleep(timedelta(days=3))  # still running when the URL is called
                return Out(outcome="expired")


class Plain(Saga[Empty, Out]):
    """A callback without a model: the body as a dict, read before the step answers."""

    name = "plain"

    async def run(self, ctx: SagaContext, input: Empty) -> Out:
        cb = ctx.callback("any", timeout=60)
        await ctx.step("ask", to="kyc", command=Check(callback_url=cb.url))
        body = await cb
        again = await cb  # awaiting it again gives the same answer
        assert body == again
        return Out(outcome=",".join(sorted(body)))


async def started(env: SagaTestEnv, saga: type[Saga[Empty, Out]] = Kyc) -> tuple[SagaRun, str]:
    run = await env.start(saga, Empty())
    ask = env.commands("kyc")[-1]
    assert ask.saga_id == run.saga_id
    url: str = ask.payload["callback_url"]
    return run, url


def received(history: Sequence[object]) -> list[CallbackReceived]:
    return [e for e in history if isinstance(e, CallbackReceived)]


def outcome(output: BaseModel) -> str:
    assert isinstance(output, Out)
    return output.outcome


# --------------------------------------------------------------------------- the URL


async def test_the_url_is_signed_bound_to_the_saga_and_its_wait_and_completes_it() -> None:
    env = SagaTestEnv([Kyc])
    run, url = await started(env)
    base, _, token = url.partition("/callbacks/")
    assert base == env.settings.callbacks.base_url
    claims, _, mac = token.partition(".")
    version, key_id, saga_id, wait_id, expires = orjson.loads(
        base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4))
    )
    assert (version, key_id, saga_id, wait_id) == (1, "test", run.saga_id, "callback:kyc-verdict:1")
    assert expires == int((env.now() + timedelta(days=2)).timestamp())
    # The wait is recorded before the step that carries its URL; its signature is not
    # (only the step's command holds it, because the saga's code put it there).
    history = await run.history()
    kinds = [e.kind for e in history]
    assert kinds.index("callback_awaited") < kinds.index("command_issued")
    holding = [e.kind for e in history if mac in event_to_json(e).decode()]
    assert holding == ["command_issued"]
    assert await run.status() == SagaStatus.RUNNING
    await env.callback(url, Verdict(approved=True, score=7))
    assert await run.status() == SagaStatus.COMPLETED
    assert outcome(await run.output()) == "approved=True score=7"


async def test_replaying_the_stored_json_derives_the_same_url() -> None:
    env = SagaTestEnv([Kyc])
    run, url = await started(env)
    text = orjson.dumps(export_history(run.saga_id, Kyc.name, await run.history()))
    stored = load_history(text)
    # The step's command carries the URL: the same URL replays, another would diverge.
    assert replay([Kyc], stored, callbacks=env.settings.callbacks).deterministic
    unsigned = replay([Kyc], stored)
    assert not unsigned.deterministic
    assert "callbacks.keys" in str(unsigned.error)
    # A restarted engine (everything from the store) takes the same URL's answer.
    env.engine = env.new_engine()
    await env.callback(url, {"approved": False})
    assert outcome(await run.output()) == "approved=False score=0"
    finished = HistoryExport(run.saga_id, Kyc.name, await run.history())
    assert replay([Kyc], finished, callbacks=env.settings.callbacks).deterministic


async def test_a_callback_without_a_model_gives_the_body_and_may_come_before_the_await() -> None:
    env = SagaTestEnv([Plain])
    env.participant("kyc").on(Check, no_reply=True)
    run, url = await started(env, Plain)
    await env.callback(url, {"b": 1, "a": [2]})  # before the step answered
    [ask] = env.commands("kyc")
    await env.engine.reply(run.saga_id, ask.command_id, "success", {})
    await env.settle()
    assert outcome(await run.output()) == "a,b"


# --------------------------------------------------------------------------- its answers


async def test_its_timeout_is_a_durable_timer_and_the_url_stops_working() -> None:
    env = SagaTestEnv([Kyc])
    run, url = await started(env)
    await env.advance(timedelta(days=2, seconds=1))
    assert outcome(await run.output()) == "timed out"
    before = len(await run.history())
    with pytest.raises(CallbackGone, match="expired"):
        await env.callback(url, {"approved": True})
    assert len(await run.history()) == before


async def test_a_call_of_its_fail_url_raises_callback_failed() -> None:
    env = SagaTestEnv([Kyc])
    run, url = await started(env)
    await env.callback(f"{url}/fail", {"error": "document unreadable", "code": 17})
    assert outcome(await run.output()) == "failed: document unreadable {'code': 17}"
    [answer] = received(await run.history())
    assert answer.failed


async def test_the_first_answer_wins_a_repeat_gets_it_and_another_body_conflicts() -> None:
    env = SagaTestEnv([Kyc])
    run, url = await started(env)
    await env.callback(url, {"approved": True, "score": 3})
    await env.callback(url, {"score": 3, "approved": True})  # the same body, keys reordered
    with pytest.raises(CallbackConflict, match="answered already"):
        await env.callback(url, {"approved": False})
    with pytest.raises(CallbackConflict):
        await env.callback(f"{url}/fail", {"approved": True, "score": 3})
    assert len(received(await run.history())) == 1
    assert outcome(await run.output()) == "approved=True score=3"


async def test_a_body_its_model_refuses_names_the_field_and_records_nothing() -> None:
    env = SagaTestEnv([Kyc])
    run, url = await started(env)
    before = len(await run.history())
    with pytest.raises(InvalidPayload) as refused:
        await env.callback(url, {"approved": "perhaps"})
    assert [e["loc"] for e in refused.value.errors] == [["approved"]]
    with pytest.raises(PayloadTooLarge):
        await env.callback(url, {"approved": True, "pad": "x" * 2_000_000})
    assert len(await run.history()) == before
    await env.callback(url, {"approved": True})  # the wait still takes a valid one
    assert await run.status() == SagaStatus.COMPLETED


async def test_a_race_lost_by_the_callback_closes_its_url() -> None:
    env = SagaTestEnv([Raced])
    run, url = await started(env, Raced)
    await env.advance(timedelta(hours=1, seconds=1))
    assert await run.status() == SagaStatus.RUNNING
    with pytest.raises(CallbackGone, match="no longer waits"):
        await env.callback(url, {"approved": True})
    await env.advance(timedelta(days=3))
    assert outcome(await run.output()) == "expired"
    assert received(await run.history()) == []
    won = SagaTestEnv([Raced])
    run, url = await started(won, Raced)
    await won.callback(url, {"approved": True})
    assert outcome(await run.output()) == "verdict True"
    history = await run.history()
    assert replay(
        [Raced], HistoryExport(run.saga_id, Raced.name, history), callbacks=won.settings.callbacks
    ).deterministic


# --------------------------------------------------------------------------- its tokens


def _tampered(url: str, claims: list[Any] | None = None, mac: bytes | None = None) -> str:
    base, _, token = url.partition("/callbacks/")
    text, _, signature = token.partition(".")
    if claims is not None:
        text = base64.urlsafe_b64encode(orjson.dumps(claims)).rstrip(b"=").decode()
    if mac is not None:
        signature = base64.urlsafe_b64encode(mac).rstrip(b"=").decode()
    return f"{base}/callbacks/{text}.{signature}"


def _claims(url: str) -> list[Any]:
    text = url.partition("/callbacks/")[2].partition(".")[0]
    claims: list[Any] = orjson.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    return claims


async def test_a_forged_or_foreign_token_is_refused_and_changes_nothing() -> None:
    env = SagaTestEnv([Kyc])
    run, url = await started(env)
    other, other_url = await started(env)
    before = len(await run.history())
    version, key, _, wait, expires = _claims(url)
    forged = [
        _tampered(url, mac=b"\0" * 32),  # a signature of nothing
        _tampered(url, claims=[version, key, other.saga_id, wait, expires]),  # another saga
        _tampered(url, claims=[version, key, run.saga_id, wait, expires + 86_400]),  # later
        _tampered(url, claims=[version, "other-key", run.saga_id, wait, expires]),  # a key
        url.replace("/callbacks/", "/callbacks/x"),
        url + "\0",
        url.partition(".")[0],
        f"{url.partition('/callbacks/')[0]}/callbacks/" + "a" * 2000,
    ]
    for bad in forged:
        with pytest.raises(CallbackTokenInvalid):
            await env.callback(bad, {"approved": True})
    # Another deployment's keys sign tokens this one refuses.
    stranger = SagaTestEnv(
        [Kyc],
        settings=Settings(
            callbacks=CallbackSettings(keys={"test": SecretStr("another-secret-" + "1" * 32)})
        ),
    )
    _, foreign = await started(stranger)
    with pytest.raises(CallbackTokenInvalid):
        await env.callback(foreign, {"approved": True})
    assert len(await run.history()) == before
    assert await other.status() == SagaStatus.RUNNING
    await env.callback(other_url, {"approved": True})  # each URL completes its own saga
    assert await other.status() == SagaStatus.COMPLETED
    assert await run.status() == SagaStatus.RUNNING


def _keys(current: str, **keys: str) -> Settings:
    secrets = {k: SecretStr(v * 40) for k, v in keys.items()}
    return Settings(callbacks=CallbackSettings(keys=secrets, current_key=current))


async def test_keys_rotate_several_verify_one_signs() -> None:
    env = SagaTestEnv([Kyc], settings=_keys("old", old="a"))
    run, url = await started(env)
    second, second_url = await started(env)
    assert _claims(url)[1] == "old"
    # The new key signs; the old one still verifies the URLs it signed.
    env.settings = _keys("new", old="a", new="b")
    env.engine = env.new_engine()
    third, third_url = await started(env)
    assert _claims(third_url)[1] == "new"
    await env.callback(url, {"approved": True})
    assert await run.status() == SagaStatus.COMPLETED
    # Once the old key is removed, its URLs stop working (and the saga that would read
    # one again parks for the key, it does not fail).
    env.settings = _keys("new", new="b")
    env.engine = env.new_engine()
    with pytest.raises(CallbackTokenInvalid, match="'old' is not configured"):
        await env.callback(second_url, {"approved": True})
    await env.callback(third_url, {"approved": True})
    assert await third.status() == SagaStatus.COMPLETED
    await env.engine.recover([second.saga_id])
    assert await second.status() == SagaStatus.NONDETERMINISTIC
    assert "configure that key" in str((await second.error()) or {})


def test_callback_settings_refuse_what_cannot_work() -> None:
    with pytest.raises(ValueError, match="shorter than 32"):
        CallbackSettings(keys={"k": SecretStr("short")})
    with pytest.raises(ValueError, match="current_key"):
        CallbackSettings(keys={"a": SecretStr("a" * 32), "b": SecretStr("b" * 32)})
    with pytest.raises(ValueError, match="not among the keys"):
        CallbackSettings(keys={"a": SecretStr("a" * 32)}, current_key="b")
    with pytest.raises(ValueError, match="base_url"):
        CallbackSettings(base_url="ftp://x")


async def test_callback_awaited_records_the_key_and_base_url() -> None:
    env = SagaTestEnv([Kyc])
    run, _ = await started(env)
    [awaited] = [e for e in await run.history() if isinstance(e, CallbackAwaited)]
    assert (awaited.name, awaited.key_id, awaited.base_url) == (
        "kyc-verdict",
        "test",
        env.settings.callbacks.base_url,
    )
    assert awaited.expires_at == awaited.at + timedelta(days=2)


# --------------------------------------------------------------------------- http_step


class Score(BaseModel):
    score: int


class Fraud(Saga[Empty, Out]):
    """A fraud check that answers 202 and posts its score later."""

    name = "fraud"

    async def run(self, ctx: SagaContext, input: Empty) -> Out:
        try:
            score = await ctx.http_step(
                "fraud-check",
                endpoint="fraud",
                path="/checks",
                json={"order": "o-1"},
                returns=Score,
                completion="callback",
                callback_timeout=timedelta(hours=2),
            )
        except StepFailed as failed:
            return Out(outcome=f"step failed: {failed.reason}")
        plain = await ctx.http_step("plain", endpoint="fraud", path="/plain")
        return Out(outcome=f"score {score.score}, plain {plain}")


async def test_an_http_step_completed_by_callback_returns_what_the_service_posts() -> None:
    env = SagaTestEnv([Fraud])
    env.participant("http:fraud").on(HttpRequest, reply={"accepted": True})
    run = await env.start(Fraud, Empty())
    [check] = env.commands("http:fraud")
    url = check.payload["callback_url"]
    assert check.payload["body"] == {"order": "o-1"}
    assert await run.status() == SagaStatus.RUNNING  # accepted (202), waiting for its call
    kinds = [e.kind for e in await run.history()]
    assert kinds.index("callback_awaited") < kinds.index("command_issued")
    with pytest.raises(InvalidPayload):
        await env.callback(url, {"score": "high"})
    await env.callback(url, {"score": 12})
    assert outcome(await run.output()) == "score 12, plain {'accepted': True}"
    # An ordinary HTTP step's request is stored as it always was (no callback_url).
    plain = env.commands("http:fraud")[-1]
    assert "callback_url" not in plain.payload
    history = HistoryExport(run.saga_id, Fraud.name, await run.history())
    assert replay([Fraud], history, callbacks=env.settings.callbacks).deterministic


async def test_an_http_steps_posted_failure_or_silence_fails_the_step() -> None:
    env = SagaTestEnv([Fraud])
    env.participant("http:fraud").on(HttpRequest, reply={})
    run = await env.start(Fraud, Empty())
    url = env.commands("http:fraud")[0].payload["callback_url"]
    await env.callback(f"{url}/fail", {"error": "card blocked"})
    assert outcome(await run.output()) == (
        "step failed: the service reported a failure: card blocked"
    )
    silent = await env.start(Fraud, Empty())
    await env.advance(timedelta(hours=2, seconds=1))
    assert "was not called before its timeout" in outcome(await silent.output())


# --------------------------------------------------------------------------- races


class Race(BaseModel):
    scope: bool = False


class RacedFraud(Saga[Race, Out]):
    """The fraud check, answered by callback, races 15 minutes (or runs in a 15-minute
    ``ctx.timeout`` scope); a check given up is withdrawn (``DELETE``)."""

    name = "raced-fraud"

    async def run(self, ctx: SagaContext, input: Race) -> Out:
        check = ctx.http_step(
            "fraud-check",
            endpoint="fraud",
            path="/checks",
            returns=Score,
            compensate=HttpRequest(method="DELETE", path="/checks/o-1"),
            completion="callback",
            callback_timeout=timedelta(hours=2),
        )
        if input.scope:
            try:
                async with ctx.timeout(timedelta(minutes=15)):
                    return Out(outcome=f"score {(await check).score}")
            except SagaTimeout:
                return Out(outcome="expired")
        match await ctx.first(scored=check, expired=ctx.sleep(timedelta(minutes=15))):
            case Winner("scored", Score() as score):
                return Out(outcome=f"score {score.score}")
            case _:
                return Out(outcome="expired")


@pytest.mark.parametrize("scope", [False, True], ids=["ctx.first", "ctx.timeout"])
async def test_an_http_step_by_callback_that_loses_is_undone_at_once(scope: bool) -> None:
    env = SagaTestEnv([RacedFraud])
    env.participant("http:fraud").on(HttpRequest, reply={})  # the 202, and the DELETE
    run = await env.start(RacedFraud, Race(scope=scope))
    url = env.commands("http:fraud")[0].payload["callback_url"]
    assert await run.status() == SagaStatus.RUNNING  # accepted, waiting for its call
    await env.advance(timedelta(minutes=15, seconds=1))
    assert outcome(await run.output()) == "expired"
    history = await run.history()
    # Accepted (applied), then given up while it waited: undone at once, as a Kafka
    # step that loses is, and once.
    assert [e.kind for e in history if getattr(e, "step", None) == "fraud-check"] == [
        "command_issued",
        "reply_received",
        "step_abandoned",
        "compensation_issued",
        "reply_received",
        "compensation_completed",
    ]
    assert "compensation_started" not in [e.kind for e in history]
    assert env.compensated_steps() == ["fraud-check"]
    [undo] = env.commands("http:fraud", compensation=True)
    assert undo.payload["method"] == "DELETE"
    # Its URL is closed: the service's late call changes nothing.
    with pytest.raises(CallbackGone):
        await env.callback(url, {"score": 3})
    assert len(await run.history()) == len(history)
    export = HistoryExport(run.saga_id, RacedFraud.name, history)
    assert replay([RacedFraud], export, callbacks=env.settings.callbacks).deterministic


async def test_an_http_step_by_callback_that_wins_owes_nothing_at_once() -> None:
    env = SagaTestEnv([RacedFraud])
    run = await env.start(RacedFraud, Race())
    await env.callback(env.commands("http:fraud")[0].payload["callback_url"], {"score": 4})
    assert outcome(await run.output()) == "score 4"
    assert env.commands("http:fraud", compensation=True) == []


class Refused(Saga[Empty, Out]):
    """A fraud check refused at once (a 4xx), then a day of something else."""

    name = "refused-fraud"

    async def run(self, ctx: SagaContext, input: Empty) -> Out:
        try:
            await ctx.http_step(
                "fraud-check", endpoint="fraud", path="/checks", completion="callback"
            )
        except StepFailed as failed:
            await ctx.sleep(timedelta(days=1))
            return Out(outcome=f"refused: {failed.reason}")
        return Out(outcome="checked")


async def test_an_http_step_by_callback_refused_at_once_closes_its_url() -> None:
    env = SagaTestEnv([Refused])
    env.participant("http:fraud").on(HttpRequest, reject="customer blocked")
    run = await env.start(Refused, Empty())
    url = env.commands("http:fraud")[0].payload["callback_url"]
    assert await run.status() == SagaStatus.RUNNING
    before = len(await run.history())
    with pytest.raises(CallbackGone, match="no longer waits"):
        await env.callback(url, {"score": 1})
    assert len(await run.history()) == before
    await env.advance(timedelta(days=1, seconds=1))
    assert outcome(await run.output()) == "refused: customer blocked"
