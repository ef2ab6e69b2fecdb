"""``SagaClient.update``, ``.query``, ``.retry_step`` and ``.skip_step``, beside the
client's Kafka path.

An update is a request that wants its answer: the client checks its input against the
update's model, then calls an engine's admin API (``POST /sagas/{id}/updates/{name}``),
which records it through the engine's one path and answers with the recorded result. A
refusal comes back as the error the engine raised (UpdateRefused, InvalidPayload,
SagaNotFound...). A query needs no engine: the client replays the saga's history from
the store with the saga's class and asks the replayed state; nothing is written. An
operator's retry or skip of a step goes through the admin API the same way
(``POST /sagas/{id}/retry|skip``): the engine checks an edited command or a result against
the step's models, which only the saga's run knows, and answers with the saga's status. A
trusted party's answer to a callback (``complete_callback``, ``fail_callback``) is a call
of the admin API's callback route with the URL's token (``POST /callbacks/{token}``), as
the third party's own call would be: the token is the credential.

A cancel and a signal go over Kafka and say what happened as far as the client can
know: refused at once, with the reason, when the saga's history says the engine would
refuse it (:func:`refuse_early`); sent once the broker holds it; OutcomeUnknown when the
broker took it and did not acknowledge it (:func:`publish`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final
from urllib.parse import quote

import httpx

from saga_engine.core.authoring._definition import Saga, SagaDefinition
from saga_engine.core.authoring._update import declared, name_of
from saga_engine.core.history._codec import CodecChain
from saga_engine.core.history._status import SagaStatus
from saga_engine.core.runtime._runtime import SagaRuntime
from saga_engine.core.views._view import saga_view_of
from saga_engine.kernel._callback_tokens import MAX_TOKEN_CHARS, token_of
from saga_engine.kernel._errors import (
    CallbackConflict,
    CallbackGone,
    CallbackTokenInvalid,
    DefinitionError,
    InvalidPayload,
    InvalidTransition,
    MigrationError,
    NewerVersionError,
    OutcomeUnknown,
    PastPivot,
    PermanentError,
    SagaError,
    SagaNotFound,
    TransientError,
    UpdateFailed,
    UpdateRefused,
)
from saga_engine.kernel._serde import JsonDict, check_storable
from saga_engine.runner._engine import CallbackAnswer
from saga_engine.store._store import EventStore
from saga_engine.transport._bus import await_acks
from saga_engine.transport._kafka import start_send
from saga_engine.transport._wire import Envelope

#: How long a retry or a skip may take: the engine records it and answers at once.
_ACTION_TIMEOUT_S: Final = 30.0

#: The errors the admin API names that the client raises as they are (their message).
_BY_NAME: Final[dict[str, type[SagaError]]] = {
    e.__name__: e for e in (CallbackTokenInvalid, CallbackGone, CallbackConflict)
}


def saga_class(handler: Any, saga: type[Saga[Any, Any]] | None, kind: str) -> type[Saga[Any, Any]]:
    """The saga class an update or query belongs to: ``saga=``, else the method's class."""
    owner = saga or getattr(handler, "owner", None)
    if owner is None:
        raise DefinitionError(
            f"{kind} {name_of(handler)!r}: pass the method (`Order.{name_of(handler)}`) or "
            "saga= (the saga's class)"
        )
    return owner


async def replayed_query(
    store: EventStore, saga_cls: type[Saga[Any, Any]], saga_id: str, name: str, args: JsonDict
) -> Any:
    """The query's answer from the saga's history, replayed here with ``saga_cls``."""
    loaded = await store.load_run(saga_id)
    events = [stored.event for stored in loaded.events]
    runtime, _ = SagaRuntime.replay(SagaDefinition.of(saga_cls), saga_id, events)
    try:
        return runtime.query(name, args)
    finally:
        runtime.close()


def checked_update(saga_cls: type[Saga[Any, Any]], name: str, payload: JsonDict) -> None:
    """The update's input checked against its model before anything is sent."""
    declared(saga_cls, "update", name).parse(payload, "payload")


async def post_update(
    url: str, token: str | None, saga_id: str, name: str, body: JsonDict, timeout_s: float
) -> Any:
    """Calls the update through the admin API at ``url``; its result, or the error."""
    path = f"/sagas/{quote(saga_id, safe='')}/updates/{quote(name, safe='')}"
    data = await _post(url, token, path, body, timeout_s, saga_id, f"update {name!r}")
    if data.get("error") is not None:
        raise UpdateFailed(data["update_id"], name, data["error"])
    return data.get("result")


async def post_action(
    url: str, token: str | None, saga_id: str, action: str, body: JsonDict, what: str
) -> SagaStatus:
    """An operator's action on one saga (``retry``, ``skip``) through the admin API at
    ``url``; the saga's status right after it, or the error the engine raised."""
    check_storable(body, what)
    path = f"/sagas/{quote(saga_id, safe='')}/{action}"
    data = await _post(url, token, path, body, _ACTION_TIMEOUT_S, saga_id, what)
    return SagaStatus(data["status"])


def callback_token(url_or_token: str) -> str:
    """The token of a callback URL (``cb.url`` or ``cb.fail_url``), or the token itself;
    CallbackTokenInvalid for anything else (nothing is sent)."""
    if not isinstance(url_or_token, str) or not url_or_token.strip():
        raise CallbackTokenInvalid("a callback URL or token is needed, got nothing")
    if "/" in url_or_token:
        token, _ = token_of(url_or_token)
    else:
        token = url_or_token
    if len(token) > MAX_TOKEN_CHARS or token.count(".") != 1 or not token.isprintable():
        raise CallbackTokenInvalid(f"{url_or_token[:80]!r} is not a callback URL or token")
    return token


async def post_callback(url: str, token: str, body: JsonDict, failed: bool) -> CallbackAnswer:
    """Completes (``failed``: fails) the wait a callback token names through the admin
    API at ``url`` (``POST /callbacks/{token}``, ``/fail``): what it completed, or the
    error the engine raised (nothing recorded then)."""
    check_storable(body, "the callback's body")
    path = f"/callbacks/{quote(token, safe='')}" + ("/fail" if failed else "")
    data = await _post(url, None, path, body, _ACTION_TIMEOUT_S, "", "the callback's body")
    return CallbackAnswer(data["saga_id"], data["wait_id"], data["outcome"] == "failed")


async def _post(
    url: str,
    token: str | None,
    path: str,
    body: JsonDict,
    timeout_s: float,
    saga_id: str,
    what: str,
) -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        async with httpx.AsyncClient(timeout=timeout_s) as http:
            response = await http.post(f"{url.rstrip('/')}{path}", json=body, headers=headers)
    except httpx.HTTPError as exc:
        raise TransientError(f"could not reach the admin API at {url}: {exc}") from None
    if response.status_code >= 400:
        raise error_of(response, saga_id, what)
    return response.json()


def error_of(response: httpx.Response, saga_id: str, what: str) -> SagaError:
    """The error an admin API's answer of 400 or above stands for (its body read)."""
    try:
        data = response.json()
    except ValueError:
        data = {"detail": response.text}
    return _error(response.status_code, data, saga_id, what)


def _error(status: int, data: Any, saga_id: str, what: str) -> SagaError:
    detail = data.get("detail") if isinstance(data, dict) else data
    error = data.get("error") if isinstance(data, dict) else None
    named = _BY_NAME.get(error) if isinstance(error, str) else None
    if named is not None:
        return named(str(detail))
    if status == 404:
        return SagaNotFound(saga_id)
    if status == 409:
        return (
            UpdateRefused(str(detail))
            if error == "UpdateRefused"
            else InvalidTransition(str(detail))
        )
    if status == 422:
        problems = (
            detail
            if isinstance(detail, list)
            else [{"loc": [], "msg": str(detail), "type": "invalid"}]
        )
        return InvalidPayload(what, problems)
    if status in (502, 503, 504):
        return TransientError(f"the admin API answered {status}: {detail}")
    return PermanentError(f"the admin API answered {status}: {detail}")


async def publish(producer: Any, topic: str, envelope: Envelope, codec: CodecChain | None) -> None:
    """Publishes ``envelope`` and says what happened: returns once the broker holds it;
    KafkaUnavailable when it was not handed over (nothing was sent: send it again);
    OutcomeUnknown when the broker took it and its acknowledgement did not come (it may
    or may not be in the topic)."""
    delivery = await start_send(producer, topic, envelope, codec)
    [error] = await await_acks([delivery])
    if error is not None:
        what = f"{envelope.message_type.value} for saga {envelope.saga_id}"
        raise OutcomeUnknown(
            f"the {what} was handed to the broker and not acknowledged ({error}): it may or "
            "may not be in the saga inbox; look at the saga (`saga show`) before sending "
            "it again"
        ) from error


async def refuse_early(
    store: Callable[[], Awaitable[EventStore]], saga_id: str, action: str
) -> None:
    """Raises now what the engine would refuse for certain, read from the saga's history
    with the view's rule of the actions a saga accepts (``SagaView.actions``): an action
    on a saga that ended, a signal or cancel to a saga undoing its steps, a cancel past
    its pivot. A saga not in the store yet (started through the inbox a moment ago), one
    parked by its code, a store that cannot be read, or a history written by a newer
    engine than this client reads: the engine decides (a refusal is then a dead letter
    saying why)."""
    try:
        loaded = await (await store()).load_run(saga_id)
    except (SagaNotFound, TransientError, MigrationError, NewerVersionError):
        return
    view = saga_view_of([stored.event for stored in loaded.events], saga_id=saga_id)
    if view.status is SagaStatus.NONDETERMINISTIC or action in {a.name for a in view.actions}:
        return
    if action == "cancel" and view.past_pivot and not view.status.is_terminal:
        raise PastPivot(
            f"saga {saga_id} is past its pivot (step {view.pivot_step!r} succeeded): it can "
            "only go forward, so a cancel is refused; retry or skip a parked step instead"
        )
    raise InvalidTransition(
        f"saga {saga_id} is {view.status.value}; it accepts no {action} now"
        + ("" if view.status.is_terminal else " (it is undoing its steps)")
    )
