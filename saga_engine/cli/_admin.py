"""The CLI's client of an engine's admin API: where the API is, calling it, and what its
refusals become (one line, and an exit code that says which kind).

Every operator command (``list``, ``show``, ``history``, ``signal``, ``cancel``,
``retry``, ``skip``, ``resume``, ``force-compensate``) goes through here, so the CLI
answers exactly what the API answers: a 409 names the state that refuses the action, a
422 the field that is wrong. The API's address is ``--admin-url`` (or
``SAGA_ADMIN_URL``); without it, the address the engine's own settings make it listen
on (``SAGA_ADMIN__HOST`` / ``SAGA_ADMIN__PORT``). The token is ``SAGA_ADMIN_TOKEN``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx
import orjson

from saga_engine.kernel._errors import AdminCallError, CliError
from saga_engine.kernel._settings import AdminSettings

__all__ = ["EXIT_CODES", "AdminApi", "AdminCallError", "admin_url"]

#: The exit code of each kind of refusal (1 is any other error, 2 a usage error).
EXIT_CODES = {
    404: 3,  # no such saga (or saga type)
    409: 4,  # the action does not apply to the saga's state now
    422: 5,  # the request is wrong: a field, a payload, a result
    401: 6,  # no token, or a token the API does not know
    403: 6,  # a reader's token for an operator's action
}
#: The API could not be reached at all.
UNREACHABLE = 7
#: Addresses a server listens on that a client cannot call.
_ANY_ADDRESS = {"", "0.0.0.0", "::", "[::]"}


def admin_url(option: str | None, admin: AdminSettings | None = None) -> str:
    """``--admin-url``/``SAGA_ADMIN_URL`` if given, else where the engine's settings
    (``SAGA_ADMIN__HOST``, ``SAGA_ADMIN__PORT``) make its admin API listen."""
    if option:
        return option.rstrip("/")
    settings = admin or _admin_settings()
    host = "127.0.0.1" if settings.host in _ANY_ADDRESS else settings.host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 literal
    return f"http://{host}:{settings.port}"


def _admin_settings() -> AdminSettings:
    from saga_engine.kernel._settings import Settings

    return Settings().admin


class AdminApi:
    """Synchronous calls to one admin API (the CLI does one request per command)."""

    def __init__(self, url: str, token: str | None, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout = timeout_s

    def saga_path(self, saga_id: str, *rest: str) -> str:
        return "/".join([f"/sagas/{quote(saga_id, safe='')}", *rest])

    def get(self, path: str, params: list[tuple[str, str]] | None = None) -> Any:
        return self._call("GET", path, params=params)

    def put(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.post(path, body, method="PUT")

    def post(self, path: str, body: dict[str, Any], method: str = "POST") -> dict[str, Any]:
        data = self._call(method, path, body=body)
        if not isinstance(data, dict):
            raise CliError(f"unexpected answer from the admin API: {str(data)[:200]}")
        return data

    def _call(
        self,
        method: str,
        path: str,
        *,
        params: list[tuple[str, str]] | None = None,
        body: dict[str, Any] | None = None,
    ) -> Any:
        try:
            response = httpx.request(
                method, self.url + path, params=httpx.QueryParams(tuple(params or ())), json=body,
                headers=self._headers,
                timeout=self._timeout,
            )  # fmt: skip
        except httpx.HTTPError as exc:
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
            raise AdminCallError(f"{response.status_code}: {_detail(data, response.text)}", code)
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
