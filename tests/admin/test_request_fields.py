"""Every text and instant a request carries is checked before it reaches Postgres: the
admin API's OpenAPI document, walked.

A worker on the real Postgres and Kafka serves its admin API. For every operation its
``/openapi.json`` lists, every string field (path and query parameters, and the body's
fields, nested ones and free-form objects' keys and values included) is sent a NUL
character, and every body string an unpaired surrogate (``"\\ud800"`` in the JSON; a URL
cannot carry one: percent-decoding replaces it), and every date-time field an instant
with no time in UTC (``0001-01-01T00:00:00+14:00``, ``9999-12-31T23:59:59-14:00``). The
rest of the request is valid (built from the schema, pointing at a real saga and type), so
that the bad value is what the route meets. Each answer must be a 4xx, and no table of the
engine's schema may gain or lose a row. A route added later is walked the same way: the
walk reads the document, not a list.

The second test pins how a 422 names a field: as the request spells it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import asyncpg
import httpx
import pytest
from pydantic import BaseModel, Field

from saga_engine import Saga, SagaContext, Signal, query, update
from tests.conftest import PgTarget
from tests.served_worker import OPERATOR_TOKEN, ServedWorker, real_settings, served_worker
from tests.waiting import eventually

pytestmark = pytest.mark.integration

OPERATOR = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}

NUL = "a\x00b"
SURROGATE = "a\ud800b"
#: Instants ISO-8601 can write that have no time in UTC Python and Postgres can hold.
OUT_OF_RANGE = ("0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00")


class HeldIn(BaseModel):
    name: str = Field(min_length=1, max_length=50)


class Go(BaseModel):
    by: str


class Note(BaseModel):
    text: str = ""


class Held(Saga[HeldIn, HeldIn]):
    """Waits for ``go`` without a deadline: a saga that writes nothing on its own."""

    name = "held"
    search_attributes = ("name",)
    go = Signal(Go)

    @update(Note)
    def annotate(self, note: Note) -> str:
        return note.text

    @query
    def kind(self) -> str:
        return self.name

    async def run(self, ctx: SagaContext, held: HeldIn) -> HeldIn:
        await ctx.wait_signal(self.go)
        return held


@dataclass
class World:
    served: ServedWorker
    pg: PgTarget
    saga_id: str

    @property
    def http(self) -> httpx.AsyncClient:
        return self.served.http


@pytest.fixture
async def world(pg: PgTarget, kafka_bootstrap: str, unique_id: str) -> AsyncIterator[World]:
    async with served_worker(real_settings(pg, kafka_bootstrap, unique_id), [Held]) as served:
        started = await served.http.post("/sagas/held", json={"name": "n"}, headers=OPERATOR)
        assert started.status_code == 202, started.text
        saga_id = started.json()["saga_id"]

        async def running() -> bool:
            got = await served.http.get(f"/sagas/{saga_id}", headers=OPERATOR)
            return got.status_code == 200 and got.json()["status"] == "running"

        await eventually(running, timeout=60, what=f"saga {saga_id} to be running")
        yield World(served, pg, saga_id)


async def _row_counts(pg: PgTarget) -> dict[str, int]:
    """Rows per table of the test's schema."""
    conn = await asyncpg.connect(pg.database_dsn)
    try:
        tables = await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = $1 ORDER BY tablename", pg.schema
        )
        counts = {}
        for row in tables:
            name = row["tablename"]
            counts[name] = await conn.fetchval(f'SELECT count(*) FROM "{pg.schema}"."{name}"')
        return counts
    finally:
        await conn.close()


# ------------------------------------------------------------------ the schema, read


class Spec:
    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document

    def resolve(self, schema: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in schema:
            name = schema["$ref"].rsplit("/", 1)[-1]
            schema = self.document["components"]["schemas"][name]
        return schema

    def branch(self, schema: dict[str, Any]) -> dict[str, Any]:
        """The schema itself, or for ``anyOf``/``oneOf`` its first branch that is not null."""
        schema = self.resolve(schema)
        for key in ("anyOf", "oneOf", "allOf"):
            if key in schema:
                options = [self.resolve(s) for s in schema[key]]
                return self.branch(next(s for s in options if s.get("type") != "null"))
        return schema

    def sample(self, schema: dict[str, Any]) -> Any:
        """A valid value of ``schema``, with only the required fields of an object."""
        schema = self.branch(schema)
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            return schema["enum"][0]
        kind = schema.get("type")
        if kind == "object":
            props = schema.get("properties", {})
            return {k: self.sample(props[k]) for k in schema.get("required", []) if k in props}
        if kind == "array":
            return []
        if kind == "string":
            return "2030-01-01T00:00:00Z" if schema.get("format") == "date-time" else "x"
        if kind in ("integer", "number"):
            return schema.get("minimum", 1)
        if kind == "boolean":
            return False
        return {}

    def strings(self, schema: dict[str, Any], at: tuple[Any, ...] = ()) -> Iterator[Target]:
        """Every place in a body of ``schema`` that holds text: (path, is it a date-time)."""
        if len(at) > 6:
            return
        schema = self.branch(schema)
        kind = schema.get("type")
        if kind == "string":
            yield Target(at, schema.get("format") == "date-time")
        elif kind == "array" and "items" in schema:
            yield from self.strings(schema["items"], (*at, 0))
        elif kind == "object" or "properties" in schema:
            for name, sub in schema.get("properties", {}).items():
                yield from self.strings(sub, (*at, name))
            extra = schema.get("additionalProperties", not schema.get("properties"))
            if extra is not False:
                sub = extra if isinstance(extra, dict) else {"type": "string"}
                yield Target((*at, KEY), False)  # a key of a free-form object
                yield from self.strings(sub, (*at, "k"))


#: Stands for "the bad text as a key" in a target's path.
KEY = object()


@dataclass(frozen=True)
class Target:
    path: tuple[Any, ...]
    instant: bool

    def bad_values(self, in_body: bool) -> list[str]:
        values = [NUL, SURROGATE] if in_body else [NUL]
        return values + list(OUT_OF_RANGE) if self.instant else values


def _put(body: Any, path: tuple[Any, ...], value: Any, spec: Spec) -> Any:
    """``body`` with ``value`` at ``path`` (intermediate objects and lists created)."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if head is KEY:
        return {**(body if isinstance(body, dict) else {}), value: "x"}
    if isinstance(head, int):
        return [_put(None, rest, value, spec)]
    base = dict(body) if isinstance(body, dict) else {}
    base[head] = _put(base.get(head), rest, value, spec)
    return base


# ------------------------------------------------------------------ one request each


def _path_value(world: World, method: str, path: str, name: str) -> str:
    """A value of a path parameter that names something real, so the route goes on."""
    if path.endswith("/updates/{name}"):
        return "annotate"
    if path.endswith("/queries/{name}"):
        return "kind"
    if name in ("saga_type", "name") or (method == "POST" and path == "/sagas/{saga}"):
        return "held"
    if name in ("saga_id", "saga"):
        return world.saga_id
    return "x"


def _param_value(spec: Spec, param: dict[str, Any]) -> Any:
    return spec.sample(param.get("schema", {}))


@dataclass
class Call:
    method: str
    url: str
    params: dict[str, Any]
    body: Any
    what: str


def _calls(world: World, spec: Spec, method: str, path: str, op: dict[str, Any]) -> list[Call]:
    params = op.get("parameters", [])
    path_values = {
        p["name"]: _path_value(world, method, path, p["name"]) for p in params if p["in"] == "path"
    }
    query = {
        p["name"]: _param_value(spec, p) for p in params if p["in"] == "query" and p.get("required")
    }
    body_schema = (
        op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
    )
    body = spec.sample(body_schema) if body_schema is not None else None

    def url(values: dict[str, str]) -> str:
        out = path
        for name, value in values.items():
            out = out.replace("{" + name + "}", quote(value, safe=""))
        return out

    calls = []
    for p in params:
        schema = spec.branch(p.get("schema", {}))
        if p["in"] not in ("path", "query") or schema.get("type") != "string":
            continue
        target = Target((), schema.get("format") == "date-time")
        for bad in target.bad_values(in_body=False):
            what = f"{method} {path} {p['in']} {p['name']}={bad!r}"
            if p["in"] == "path":
                calls.append(Call(method, url({**path_values, p["name"]: bad}), query, body, what))
            else:
                calls.append(Call(method, url(path_values), {**query, p["name"]: bad}, body, what))
    if body_schema is not None:
        variants = [body]
        resolved = spec.branch(body_schema)
        flags = {
            k: True
            for k, s in resolved.get("properties", {}).items()
            if spec.branch(s).get("type") == "boolean" and k not in resolved.get("required", [])
        }
        if flags and isinstance(body, dict):
            variants.append({**body, **flags})
        for target in spec.strings(body_schema):
            for bad in target.bad_values(in_body=True):
                for base in variants:
                    sent = _put(base, target.path, bad, spec)
                    where = ".".join("<key>" if p is KEY else str(p) for p in target.path)
                    what = f"{method} {path} body {where or '(body)'}={bad!r} from {base!r}"
                    calls.append(Call(method, url(path_values), query, sent, what))
    return calls


async def _send(http: httpx.AsyncClient, call: Call) -> httpx.Response:
    # json.dumps escapes what UTF-8 cannot carry ("\ud800"), as a careless client would.
    content = None if call.body is None else json.dumps(call.body).encode()
    headers = {**OPERATOR, "Content-Type": "application/json"}
    return await http.request(
        call.method, call.url, params=call.params, content=content, headers=headers
    )


async def test_no_text_or_instant_field_of_any_route_reaches_postgres_unchecked(
    world: World,
) -> None:
    document = (await world.http.get("/openapi.json")).json()
    spec = Spec(document)
    failures: list[str] = []
    walked = 0
    before = await _row_counts(world.pg)
    for path, item in sorted(document["paths"].items()):
        for method, op in sorted(item.items()):
            if method not in ("get", "post", "put", "delete", "patch"):
                continue
            for call in _calls(world, spec, method.upper(), path, op):
                walked += 1
                answer = await _send(world.http, call)
                if not 400 <= answer.status_code < 500:
                    failures.append(f"{call.what}: {answer.status_code} {answer.text[:200]}")
            after = await _row_counts(world.pg)
            if after != before:
                changed = {t: (before.get(t), n) for t, n in after.items() if before.get(t) != n}
                failures.append(f"{method.upper()} {path} stored rows: {changed}")
                before = after
    assert walked > 100, walked  # the walk found the fields
    assert not failures, "\n".join(failures)


async def test_a_422_names_the_field_as_the_request_spells_it(world: World) -> None:
    http, saga_id = world.http, world.saga_id

    async def loc(method: str, url: str, body: Any = None, **params: Any) -> list[Any]:
        answer = await http.request(method, url, json=body, params=params, headers=OPERATOR)
        assert answer.status_code == 422, answer.text
        return [e["loc"] for e in answer.json()["detail"]]

    rerun = f"/sagas/{saga_id}/rerun"
    assert await loc("POST", rerun, {"input": {"name": 5}, "reason": "r"}) == [
        ["body", "input", "name"]
    ]
    updated = f"/sagas/{saga_id}/updates/annotate"
    assert await loc("POST", updated, {"input": {"text": 5}}) == [["body", "input", "text"]]
    assert await loc("POST", f"/sagas/{saga_id}/updates/nope", {"input": {}}) == [["path", "name"]]
    assert await loc("POST", rerun, {"reason": NUL}) == [["body", "reason"]]
    assert await loc("GET", "/domain-events", source=NUL) == [["query", "source"]]
    inverted = {"created_after": "2030-01-02T00:00:00Z", "created_before": "2030-01-01T00:00:00Z"}
    batch = {"filter": inverted, "action": "cancel", "reason": "r", "dry_run": True}
    assert await loc("POST", "/batch-operations", batch) == [["body", "filter", "created_after"]]
    assert await loc("GET", "/sagas", **inverted) == [["query", "created_after"]]
    # The pages' paths too (they are not in the OpenAPI document).
    for page in ("/ui/sagas/a%00b", "/ui/batch-operations/a%00b"):
        answer = await http.get(page, headers=OPERATOR)
        assert answer.status_code == 422, (page, answer.status_code, answer.text)
    late = {**batch, "filter": {"updated_after": OUT_OF_RANGE[1]}}
    assert await loc("POST", "/batch-operations", late) == [["body", "filter", "updated_after"]]
