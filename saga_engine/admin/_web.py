"""The admin web page: server-rendered HTML over the same store and listing as the API.

``GET /ui/sagas`` lists sagas (filters as a GET form, cursor paging); ``GET
/ui/sagas/{id}`` shows one: a header, a timeline of steps and compensations computed
from the history's timestamps, the owed compensations, the operator actions (they call
the JSON API with ``fetch``) and the event table.

Signing in: with tokens configured, ``/ui/login`` trades a token (a form field) for a
signed session cookie and ``POST /ui/logout`` ends the session (every page's header has
the button); the session itself (contents, key, idle expiry, revocation, the same-origin
guard) is :mod:`saga_engine.admin._auth`'s. In the loopback no-auth mode (bound to
loopback, no tokens) the pages are open. Every redirect is a relative path under the
app's root_path, never built from the Host header.

Pages are sent with a strict Content-Security-Policy: scripts and styles come only from
``/ui/static``, no form posts elsewhere, and no other site may frame them (clickjacking);
:class:`SecurityHeadersMiddleware` adds ``X-Frame-Options: DENY`` and ``nosniff`` to
every response of the admin app, and the framing CSP to any HTML one that lacks it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from datetime import datetime
from importlib import resources
from typing import Annotated, Any, Literal
from urllib.parse import parse_qs, quote, urlencode

import jinja2
from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, Response
from starlette.datastructures import MutableHeaders
from starlette.requests import cookie_parser
from starlette.types import Message, Receive, Scope, Send

from saga_engine.admin._auth import (
    COOKIE,
    LEGACY_COOKIE,
    PRINCIPAL_KEY,
    SESSIONS_KEY,
    Principal,
    Sessions,
    auth_required,
    clear_session,
    is_https,
    relative_redirect,
    session_cookie,
)
from saga_engine.admin._flow import flow_gates
from saga_engine.admin._flow_policies import FlowPoliciesView, flow_policies_view
from saga_engine.admin._graph_svg import declared_svg
from saga_engine.admin._http_errors import HttpMiddleware
from saga_engine.admin._lineage import children, reruns, tree
from saga_engine.admin._listing import attribute_filters, saga_page
from saga_engine.admin._timeline import TimelineChart, relative, span_text, timeline
from saga_engine.admin._views import awaited, detail_of, graph_of, view_of, with_runs
from saga_engine.admin._web_updates import query_answers, update_forms
from saga_engine.core.authoring._definition import SagaRegistry
from saga_engine.core.history._codec import Undecodable
from saga_engine.core.history._events import Event, ProgressEmitted
from saga_engine.core.history._status import SagaStatus
from saga_engine.core.history._structs import to_data
from saga_engine.core.views._event_lines import event_line
from saga_engine.core.views._graph_view import NodeState
from saga_engine.core.views._view import SagaView
from saga_engine.kernel._errors import InvalidTransition, SagaError, UnknownSagaType
from saga_engine.kernel._input_types import StorableText, Text
from saga_engine.kernel._settings import AdminSettings
from saga_engine.runner._parts import EngineParts
from saga_engine.store._store import SagaFilter, SagaRecord, StoredEvent

__all__ = ["SecurityHeadersMiddleware", "web_router"]

audit = logging.getLogger("saga_engine.admin.audit")

PAGE_SIZE = 50
#: The files under ``static/`` the page may load (nothing else is served from there).
STATIC_TYPES = {
    "admin.css": "text/css; charset=utf-8",
    "admin.js": "text/javascript",
    "favicon.svg": "image/svg+xml",
}
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",  # frame-ancestors' predecessor, for older browsers
    # Not "no-referrer": under it browsers send "Origin: null" with every POST, the
    # page's own forms and fetches included, and the same-origin guard refuses those.
    # "same-origin" still sends nothing (no saga id in a URL) to other sites.
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
#: For HTML answered by anything but :func:`_render` (none today): no framing, at least.
FRAME_CSP = "frame-ancestors 'none'"
#: Operator actions a saga page can show: (API path, label, what the form asks for).
#: Only those the saga's view says apply now are shown (see ``SagaView.actions``).
ACTIONS = {
    "signal": ("Send signal", "signal"),
    "cancel": ("Cancel", ""),
    "resume": ("Resume", ""),
    # Also re-sends a command waiting for its reply (same id; its participant dedupes).
    "retry": ("Retry / re-send step", "step"),
    "skip": ("Skip step", "step result"),
    "force-compensate": ("Force compensate", ""),
}

_env = jinja2.Environment(
    loader=jinja2.PackageLoader("saga_engine.admin", "templates"),
    autoescape=True,  # every template, whatever its name: payloads are untrusted
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def _when(value: datetime | None) -> str:
    return value.isoformat(sep=" ", timespec="milliseconds") if value is not None else ""


_env.filters["pretty"] = _pretty
_env.filters["when"] = _when


# --------------------------------------------------------------------------- routes


def _offers(view: SagaView, action: str) -> bool:
    return any(a.name == action for a in view.actions)


def _actions(view: SagaView) -> list[tuple[str, str, str, tuple[str, ...]]]:
    """(path, label, what it asks, steps it applies to) for the actions that apply now.
    Skipping a stuck compensation needs no result: the operator undid it by hand."""
    out = []
    for action in view.actions:
        label, asks = ACTIONS[action.name]
        if action.name == "skip" and action.steps and set(action.steps) <= set(view.stuck_steps):
            asks = "step"
        out.append((action.name, label, asks, action.steps))
    return out


def _signals(registry: SagaRegistry, saga_type: str) -> list[tuple[str, str]]:
    """The saga type's declared signals: (name, an example payload of its model)."""
    try:
        definition = registry.get(saga_type)
    except UnknownSagaType:
        return []  # not deployed here: the API refuses its signals too
    return [
        (name, json.dumps(_example(signal.model.model_json_schema()), indent=1))
        for name, signal in sorted(definition.signals.items())
    ]


def _example(schema: dict[str, Any]) -> dict[str, Any]:
    """A starting payload for the signal form: each required field, empty of its type."""
    blank = {"string": "", "integer": 0, "number": 0, "boolean": False, "array": [], "object": {}}
    props = schema.get("properties", {})
    return {
        name: blank.get(str(props.get(name, {}).get("type"))) for name in schema.get("required", [])
    }


def _render(name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    html = _env.get_template(name).render(**context)
    return HTMLResponse(html, status_code=status_code, headers=HEADERS)


def _blank(value: str | None) -> str | None:
    value = value.strip() if value is not None else None
    return value or None


def _root(request: Request) -> str:
    root: str = request.scope.get("root_path", "")
    return root


def _sessions(request: Request) -> Sessions | None:
    """The app's sessions (its AuthMiddleware's), or None when auth is off."""
    sessions = request.scope.get("state", {}).get(SESSIONS_KEY)
    return sessions if isinstance(sessions, Sessions) else None


def _login_page(request: Request, error: str = "", status_code: int = 200) -> HTMLResponse:
    return _render("login.html", status_code, root=_root(request), user=None, error=error)


class SecurityHeadersMiddleware(HttpMiddleware):
    """Adds ``X-Frame-Options: DENY`` and ``X-Content-Type-Options: nosniff`` to every
    response of the admin app (JSON errors and redirects included), and a CSP forbidding
    framing to any HTML response whose CSP does not already (clickjacking)."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers.setdefault("X-Frame-Options", "DENY")
                headers.setdefault("X-Content-Type-Options", "nosniff")
                if headers.get("content-type", "").lower().startswith("text/html"):
                    csp = headers.get("content-security-policy", "")
                    if "frame-ancestors" not in csp:
                        headers["Content-Security-Policy"] = (
                            f"{csp}; {FRAME_CSP}" if csp else FRAME_CSP
                        )
            await send(message)

        await self.app(scope, receive, sending)


def web_router(parts: EngineParts, admin: AdminSettings) -> APIRouter:
    """The ``/ui`` pages over ``parts``' store; the admin app includes them behind its
    auth."""
    router = APIRouter(prefix="/ui", include_in_schema=False)
    auth_on = auth_required(admin) is not None

    def user(request: Request) -> Principal | None:
        """Who the header shows as signed in (with the sign-out button); nobody when
        auth is off."""
        principal = request.scope.get("state", {}).get(PRINCIPAL_KEY)
        return principal if auth_on and isinstance(principal, Principal) else None

    _session_routes(router, auth_on)
    _static_routes(router)

    @router.get("/sagas", name="ui_list")
    async def list_view(
        request: Request,
        status: Annotated[Annotated[str, StorableText(max_length=50)] | None, Query()] = None,
        saga_type: Annotated[
            Annotated[str, StorableText(max_length=100)] | None, Query(alias="type")
        ] = None,
        q: Annotated[Annotated[str, StorableText(max_length=200)] | None, Query()] = None,
        cursor: Annotated[Annotated[str, StorableText(max_length=2000)] | None, Query()] = None,
        sort: Annotated[Literal["activity", "id"], Query()] = "activity",
        roots: Annotated[bool, Query()] = False,
    ) -> HTMLResponse:
        status, saga_type, q, cursor = map(_blank, (status, saga_type, q, cursor))
        shown = _Shown(status, saga_type, q, cursor, sort, roots)
        return await _list_page(request, parts, user(request), shown)

    @router.get("/sagas/{saga_id}", name="ui_saga")
    async def saga_view(request: Request, saga_id: Text) -> HTMLResponse:
        return await _saga_page(request, parts, user(request), saga_id)

    return router


def _session_routes(router: APIRouter, auth_on: bool) -> None:
    """Signing in and out of the pages (a signed session cookie for a token)."""

    @router.get("/login")
    async def login_form(request: Request) -> Response:
        if not auth_on:
            return relative_redirect(request.scope, "/ui/sagas")
        return _login_page(request)

    @router.post("/login")
    async def login(request: Request) -> Response:
        """Trades a bearer token (a form field, never a URL: URLs end up in access logs)
        for an HttpOnly, SameSite=Strict cookie holding a signed session (not the token).
        The middleware has already refused it unless it came from this origin."""
        sessions = _sessions(request)
        if sessions is None:
            return relative_redirect(request.scope, "/ui/sagas")
        body = (await request.body())[:4096].decode(errors="replace")
        token = parse_qs(body).get("token", [""])[0].strip()
        signed_in = sessions.sign_in(token) if token else None
        if signed_in is None:
            # Never the token itself, not even a wrong one: it may be a near miss.
            audit.info("a sign-in to the web page with a token that is not valid")
            return _login_page(request, "that token is not valid", status_code=401)
        principal, value = signed_in
        audit.info("sign-in to the web page by %s (%s)", principal.name, principal.role.value)
        response = relative_redirect(request.scope, "/ui/sagas")
        secure = is_https(request.scope)
        # Earlier versions kept the raw token in a cookie of their own: drop it.
        response.headers.append(
            "set-cookie", session_cookie("", max_age=0, secure=secure, name=LEGACY_COOKIE)
        )
        response.headers.append(
            "set-cookie", session_cookie(value, max_age=sessions.idle_s, secure=secure)
        )
        return response

    @router.post("/logout")
    async def logout(request: Request) -> Response:
        """Ends the session: expires the cookie, and refuses its value in this process
        from now on (someone may have copied it). Same-origin only, like sign-in."""
        sessions = _sessions(request)
        if sessions is not None:
            session = sessions.read(
                cookie_parser(request.headers.get("cookie", "")).get(COOKIE, "")
            )
            if session is not None:
                sessions.revoke(session)
                audit.info("sign-out from the web page by %s", session.principal.name)
        response = relative_redirect(request.scope, "/ui/login")
        clear_session(response, request.scope)
        return response


def _static_routes(router: APIRouter) -> None:
    static = resources.files("saga_engine.admin").joinpath("static")

    @router.get("")
    @router.get("/")
    async def home(request: Request) -> Response:
        return relative_redirect(request.scope, "/ui/sagas")

    @router.get("/static/{name}", name="ui_static")
    async def static_file(name: str) -> Response:
        if name not in STATIC_TYPES:
            raise HTTPException(404, "no such file")
        body = static.joinpath(name).read_bytes()
        return Response(
            body,
            media_type=STATIC_TYPES[name],
            headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"},
        )


@dataclass(frozen=True, slots=True)
class _Shown:
    """The list page's own query parameters (search attributes come on top)."""

    status: str | None
    saga_type: str | None
    q: str | None
    cursor: str | None
    sort: Literal["activity", "id"]
    roots: bool


async def _list_page(
    request: Request, parts: EngineParts, user: Principal | None, shown: _Shown
) -> HTMLResponse:
    status, saga_type, q = shown.status, shown.saga_type, shown.q
    if status is not None and status not in {s.value for s in SagaStatus}:
        raise HTTPException(422, f"unknown status {status!r}")
    for text in (saga_type, q):
        if text is not None and "\x00" in text:
            raise HTTPException(422, "filters may not contain NUL characters")
    declared = sorted({name for d in parts.registry for name in d.search_attributes})
    try:
        # Blank inputs of the form are no filter (the form sends every field).
        attributes = attribute_filters(
            [(k, v) for k, v in request.query_params.multi_items() if v.strip()],
            set(declared),
        )
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    where = SagaFilter(
        statuses=frozenset({SagaStatus(status)}) if status else None,
        saga_type=saga_type,
        search=q,
        attributes=dict(attributes),
        roots_only=shown.roots,
    )
    page = await saga_page(
        parts.store,
        parts.registry,
        where,
        limit=PAGE_SIZE,
        cursor=shown.cursor,
        order=shown.sort,
    )
    filters: dict[str, str | None] = {
        "status": status,
        "type": saga_type,
        "q": q,
        **dict(attributes),
        "sort": None if shown.sort == "activity" else shown.sort,
        "roots": "true" if shown.roots else None,
    }
    kept = {k: v for k, v in filters.items() if v}
    next_url = None
    if page.next_cursor is not None:
        next_url = f"?{urlencode({**kept, 'cursor': page.next_cursor})}"
    # The status tabs link to the same filters with that status.
    tab = {k: v for k, v in kept.items() if k != "status"}
    flow = flow_gates(parts)
    policies = await _flow_policies(parts)
    return _render(
        "list.html",
        root=_root(request),
        user=user,
        sagas=page.items,
        counts=page.counts,
        missing_shards=page.missing_shards,
        tab_url=lambda s: "?" + urlencode({**tab, **({"status": s} if s else {})}),
        filters=filters,
        sort=shown.sort,
        roots=shown.roots,
        statuses=[s.value for s in SagaStatus],
        types=sorted(parts.registry.names()),
        attribute_names=declared,
        next_url=next_url,
        first_page=shown.cursor is None,
        first_url="?" + urlencode(kept),
        quote=quote,
        flow=flow,  # flow control's queues (none when it is off)
        flow_budgets=any(g.budget for g in flow),
        flow_weights=parts.settings.limits.fairness_weights if flow else {},
        # Several flow policies: a column of the table, and their versions and rollouts.
        flow_policies=len(parts.settings.limits.versions) > 1,
        flow_policy_view=policies,
    )


async def _flow_policies(parts: EngineParts) -> FlowPoliciesView | None:
    """The flow policies and their rollouts, when several are configured and the store
    keeps rollouts (None: one policy, or a store without rollouts)."""
    if len(parts.settings.limits.versions) < 2:
        return None
    try:
        return await flow_policies_view(parts, limit=0)  # no audit: the page's table
    except InvalidTransition:  # this engine's store keeps no rollouts
        return None


async def _saga_page(
    request: Request, parts: EngineParts, user: Principal | None, saga_id: str
) -> HTMLResponse:
    # An impossible id is not found there; what cannot be decoded shows as encrypted.
    # Its current run only (a saga that continued as new shows its chain of runs).
    loaded = await parts.store.load_run(saga_id, undecodable=Undecodable.SHOW)
    events = [stored.event for stored in loaded.events]
    record = loaded.record
    view = view_of(record, events, awaited(parts.registry, record, events))
    info = await with_runs(
        parts.store,
        detail_of(
            record,
            view,
            events,
            await children(parts.store, record.saga_id, events),
            await reruns(parts.store, record.saga_id),
        ),
        parts.settings.engine.continue_as_new_after,
    )
    root = _root(request)
    api = f"{root}/sagas/{quote(record.saga_id, safe='')}"
    # The request's time: an open saga's timeline runs to it (a saga waiting four hours
    # is drawn four hours long), and the waits read "waiting 2 h", "in 1 h 50 m".
    now = parts.clock.now()
    return _render(
        "saga.html",
        root=root,
        now=now,
        since=lambda moment: span_text(now - moment),
        relative=lambda moment: relative(moment, now),
        user=user,
        saga=info,
        lineage=await tree(parts.store, record.saga_id),
        api=api,
        history_url=f"{api}/history?download=1",
        # Its progress items (ctx.emit), live from the stream: shown once it has some, or
        # while it runs (it may emit).
        progress_shown=not view.status.is_terminal
        or any(isinstance(event, ProgressEmitted) for event in events),
        **_timeline_page(request, timeline(view, now=None if view.status.is_terminal else now)),
        **_history_page(request, loaded.events),
        actions=_actions(view),
        signals=_signals(parts.registry, record.saga_type) if _offers(view, "signal") else [],
        # Updates go where signals go: to a saga still going forward.
        updates=update_forms(parts.registry, record.saga_type, _example)
        if _offers(view, "signal")
        else [],
        queries=await query_answers(parts, record.saga_id, record.saga_type),
        urlencode=urlencode,  # the links to the domain events and key pages, filtered
        **_graph_drawing(parts, record, view, events),
    )


#: The history table shows this many events at a time: a saga with a long run (one that
#: never continued as new) keeps a page of a bounded size.
HISTORY_PAGE = 200


#: The timeline shows this many rows (steps, waits) at a time.
TIMELINE_PAGE = 100


def _timeline_page(request: Request, chart: TimelineChart) -> dict[str, Any]:
    """One page of the timeline's rows (``?timeline_page=N``, from 1; the last, the
    newest rows, by default): a long run's page stays small, its axis the run's."""
    pages = max(1, -(-len(chart.rows) // TIMELINE_PAGE))
    asked = request.query_params.get("timeline_page", "")
    page = min(max(int(asked), 1), pages) if asked.isdigit() else pages
    rows = chart.rows[(page - 1) * TIMELINE_PAGE : page * TIMELINE_PAGE]
    return {
        "timeline": replace(chart, rows=rows),
        "timeline_page": page,
        "timeline_pages": pages,
    }


def _history_page(request: Request, stored: list[StoredEvent]) -> dict[str, Any]:
    """One page of the run's events for the history table (``?events_page=N``, from 1;
    the last page, the newest events, by default), numbered as the store numbers them."""
    pages = max(1, -(-len(stored) // HISTORY_PAGE))
    asked = request.query_params.get("events_page", "")
    page = min(max(int(asked), 1), pages) if asked.isdigit() else pages
    shown = stored[(page - 1) * HISTORY_PAGE : page * HISTORY_PAGE]
    return {
        "events": [
            (
                s.seq,
                s.event,
                event_line(s.event),
                {k: v for k, v in to_data(s.event).items() if k not in ("at", "kind")},
            )
            for s in shown
        ],
        "events_page": page,
        "events_pages": pages,
    }


def _graph_drawing(
    parts: EngineParts, record: SagaRecord, view: SagaView, events: list[Event]
) -> dict[str, Any]:
    """A graph saga's declared graph drawn with each node's state, and the states it
    shows (for the legend); nothing for a saga written as code, or of a type or version
    not deployed here."""
    try:
        state = graph_of(parts.registry, record, view, events)
    except SagaError:
        state = None
    if state is None:
        return {"graph_svg": "", "graph_states": []}
    label = f"the declared graph of {record.saga_type}, each node's state"
    shown = {n.state for n in state.nodes}
    return {
        "graph_svg": declared_svg(state.as_dict(), "saga-graph", label),
        "graph_states": [s.value for s in NodeState if s in shown],
    }
