"""What the ``saga`` commands share: the consoles, the shared options, running a command's
work with errors as one line, JSON output, and the client of an engine's admin API.

Reads and operator actions go through an engine's admin API, so the CLI answers exactly
what the API answers, with the same checks and the same audit trail: a 409 names the
state that refuses the action, a 422 the field that is wrong, and each kind of refusal
has its exit code (3 not found, 4 conflict, 5 invalid, 6 auth, 7 unreachable; 1 is any
other error, 2 a usage error). The API's address is ``--admin-url`` (or
``SAGA_ADMIN_URL``); without it, the address the engine's own settings make it listen
on (``SAGA_ADMIN__HOST`` / ``SAGA_ADMIN__PORT``). The token is ``SAGA_ADMIN_TOKEN``.

This module imports no other module of the CLI: every command group imports it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Annotated, Any, NoReturn, TypeVar
from urllib.parse import quote

import httpx
import orjson
import typer
from rich.console import Console, OverflowMethod
from rich.table import Table

from saga_engine.kernel._errors import AdminCallError, CliError, SagaError
from saga_engine.kernel._mainloop import run
from saga_engine.kernel._retry import is_transient
from saga_engine.kernel._settings import AdminSettings, Settings

T = TypeVar("T")

out = Console()
err = Console(stderr=True)


class Debug:
    """``saga --debug``: errors show their traceback instead of one line."""

    on = False


# ---------------------------------------------------------------------- options

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
AdminUrl = Annotated[
    str | None,
    typer.Option(
        "--admin-url",
        envvar="SAGA_ADMIN_URL",
        show_default=False,
        help="An engine's admin API (token from SAGA_ADMIN_TOKEN). Default: where "
        "SAGA_ADMIN__HOST / SAGA_ADMIN__PORT make it listen (127.0.0.1:8080).",
    ),
]
ReasonOpt = Annotated[str, typer.Option("--reason", help="Why; recorded in the saga's history.")]


# ---------------------------------------------------------------------- running and output


def run_async(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Runs a coroutine; turns expected errors into one line and exit code 1 (or the
    error's own ``exit_code``)."""
    try:
        return run(make())
    except (SagaError, OSError, ValueError, CliError) as exc:
        if Debug.on:
            raise
        # The one rule of what is transient (kernel._retry): say that trying again may do.
        hint = " (transient: it may succeed if you try again)" if is_transient(exc) else ""
        err.print(f"[red]error:[/red] {exc}{hint}", markup=True, highlight=False, soft_wrap=True)
        raise typer.Exit(getattr(exc, "exit_code", 1)) from None
    except Exception as exc:
        if Debug.on:
            raise
        err.print(f"[red]error:[/red] {type(exc).__name__}: {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None


def run_sync(fn: Callable[[], T]) -> T:
    """``run_async`` for plain work: the same errors, the same one line."""

    async def wrapper() -> T:
        return fn()

    return run_async(wrapper)


def fail(message: str) -> NoReturn:
    """Reports ``message`` as the one-line error and exits 1."""
    if Debug.on:
        raise CliError(message)
    err.print(f"[red]error:[/red] {message}", markup=True, highlight=False)
    raise typer.Exit(1)


def make_table(
    title: str,
    columns: Iterable[str],
    rows: Iterable[Sequence[str]],
    overflow: OverflowMethod = "fold",
) -> Table:
    """A titled table, one column per name; long cells fold onto more lines (or as
    ``overflow`` says)."""
    result = Table(title=title)
    for column in columns:
        result.add_column(column, overflow=overflow)
    for row in rows:
        result.add_row(*row)
    return result


def field_table(title: str, rows: Iterable[tuple[str, str]]) -> Table:
    """A titled table of fields (in bold) and their values, without a header."""
    result = Table(title=title, show_header=False)
    result.add_column("field", style="bold")
    result.add_column("value", overflow="fold")
    for field, value in rows:
        result.add_row(field, value)
    return result


def print_json(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_UTC_Z).decode())
    sys.stdout.write("\n")


# ---------------------------------------------------------------------- the admin API

#: The exit code of each kind of refusal (1 is any other error, 2 a usage error).
EXIT_CODES = {
    404: 3,  # no such saga (or saga type, or schedule)
    409: 4,  # the action does not apply to the saga's state now
    422: 5,  # the request is wrong: a field, a payload, a result
    401: 6,  # no token, or a token the API does not know
    403: 6,  # a reader's token for an operator's action
}
#: The API could not be reached at all.
UNREACHABLE = 7
#: An action whose outcome cannot be known: it may or may not be recorded (the admin API
#: answered 503 OutcomeUnknown, or sent no answer in time): read the saga's history.
OUTCOME_UNKNOWN = 8
#: Addresses a server listens on that a client cannot call.
_ANY_ADDRESS = {"", "0.0.0.0", "::", "[::]"}


def admin_url(option: str | None, admin: AdminSettings | None = None) -> str:
    """``--admin-url``/``SAGA_ADMIN_URL`` if given, else where the engine's settings
    (``SAGA_ADMIN__HOST``, ``SAGA_ADMIN__PORT``) make its admin API listen."""
    if option:
        return option.rstrip("/")
    settings = admin or Settings().admin
    host = "127.0.0.1" if settings.host in _ANY_ADDRESS else settings.host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 literal
    return f"http://{host}:{settings.port}"


def admin_call(option: str | None, call: Callable[[AdminApi], T]) -> T:
    """One call to the admin API at ``option`` (see ``admin_url``) with the token of
    ``SAGA_ADMIN_TOKEN``; a refusal is the one-line error and its exit code."""
    api = AdminApi(admin_url(option), os.environ.get("SAGA_ADMIN_TOKEN"))
    return run_sync(lambda: call(api))


class AdminApi:
    """Synchronous calls to one admin API (the CLI does one request per command)."""

    def __init__(self, url: str, token: str | None, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout = timeout_s

    @staticmethod
    def path(collection: str, name: str, *rest: str) -> str:
        """``/{collection}/{name}/{rest...}``, with ``name`` quoted."""
        return "/".join([f"/{collection}/{quote(name, safe='')}", *rest])

    def get(self, path: str, params: list[tuple[str, str]] | None = None) -> Any:
        return self.call("GET", path, params=params)

    def put(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.post(path, body, method="PUT")

    def post(self, path: str, body: dict[str, Any], method: str = "POST") -> dict[str, Any]:
        data = self.call(method, path, body=body)
        if not isinstance(data, dict):
            raise CliError(f"unexpected answer from the admin API: {str(data)[:200]}")
        return data

    def call(
        self,
        method: str,
        path: str,
        *,
        params: list[tuple[str, str]] | None = None,
        body: dict[str, Any] | None = None,
    ) -> Any:
        try:
            response = httpx.request(
                method,
                self.url + path,
                params=httpx.QueryParams(tuple(params or ())),
                json=body,
                headers=self._headers,
                timeout=self._timeout,
            )
        except httpx.HTTPError as exc:
            # Sent, and no answer came (a read timeout, a dropped connection): an action
            # may or may not be recorded. Not sent at all: the API is not there.
            sent = isinstance(
                exc, httpx.ReadTimeout | httpx.WriteTimeout | httpx.RemoteProtocolError
            )
            if sent and method != "GET":
                raise AdminCallError(
                    f"outcome unknown: the admin API at {self.url} took the request and sent "
                    f"no answer ({exc!r}); it may or may not be recorded: look at the saga "
                    "(`saga show ID`, `saga history ID`) before sending it again",
                    OUTCOME_UNKNOWN,
                ) from None
            raise AdminCallError(
                f"could not reach the admin API at {self.url} ({exc}); set --admin-url or "
                "SAGA_ADMIN_URL (or SAGA_ADMIN__HOST / SAGA_ADMIN__PORT)",
                UNREACHABLE,
            ) from None
        try:
            data = response.json()
        except ValueError:
            data = None
        if response.status_code >= 400:
            code = EXIT_CODES.get(response.status_code, 1)
            detail = _detail(data, response.text)
            if isinstance(data, dict) and data.get("error") == "OutcomeUnknown":
                raise AdminCallError(f"outcome unknown: {detail}", OUTCOME_UNKNOWN)
            raise AdminCallError(f"{response.status_code}: {detail}", code)
        return data


def _detail(data: Any, text: str) -> str:
    detail = data.get("detail") if isinstance(data, dict) else None
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list) and all(isinstance(d, dict) for d in detail):
        # A 422's field errors, as "payload.ok: Input should be a valid boolean; ...".
        return "; ".join(
            f"{'.'.join(str(p) for p in d.get('loc', []) if p != 'body') or 'body'}: "
            f"{d.get('msg', '')}"
            for d in detail
        )
    if detail is not None:
        return orjson.dumps(detail).decode()
    return " ".join(text.split())[:200] or "no detail"
