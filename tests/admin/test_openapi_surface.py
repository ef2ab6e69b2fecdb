"""The admin API's published surface, pinned: operations, status codes, auth.

The expected data was generated from the app before it was split into routers (issue
13), so a refactor that renames an endpoint function (its operationId), drops a route,
or loses the bearer scheme on one shows up here. Request and response *models* are
left to test_api.py and the schemathesis test: they may change on purpose.
"""

from __future__ import annotations

from typing import Any

from saga_engine.admin import create_admin_app
from saga_engine.settings import Settings
from saga_engine.testing import SagaTestEnv
from tests.admin.conftest import OPERATOR, READER, admin_settings, make_client
from tests.admin.sagas import Noop, Transfer

#: (method, path, operationId) of every operation, as generated before the split.
OPERATIONS = {
    ("GET", "/health", "health_health_get"),
    # Issue 41 §2: callback URLs, whose signed token is their credential.
    ("POST", "/callbacks/{token}", "complete_callback_callbacks__token__post"),
    ("POST", "/callbacks/{token}/fail", "fail_callback_callbacks__token__fail_post"),
    ("GET", "/saga-types", "saga_types_saga_types_get"),
    ("GET", "/sagas", "list_sagas_sagas_get"),
    ("GET", "/sagas/{saga}", "get_saga_sagas__saga__get"),
    ("POST", "/sagas/{saga}", "start_sagas__saga__post"),
    ("GET", "/sagas/{saga_id}/history", "history_sagas__saga_id__history_get"),
    ("GET", "/sagas/{saga_id}/lineage", "get_lineage_sagas__saga_id__lineage_get"),
    # Issue 41 §5: a saga's progress items as server-sent events.
    ("GET", "/sagas/{saga_id}/stream", "stream_progress_sagas__saga_id__stream_get"),
    ("GET", "/metrics", "metrics_metrics_get"),
    ("GET", "/flow", "flow_flow_get"),
    # Issue 26 §1: the domain events kept for sagas that wait for them.
    ("GET", "/domain-events", "domain_events_domain_events_get"),
    # Issue 26 §5: per-key concurrency's holders and queues.
    ("GET", "/concurrency-keys", "concurrency_keys_concurrency_keys_get"),
    ("GET", "/saga-types/{name}/insights", "insights_saga_types__name__insights_get"),
    # Issue 40 §2: insights by flow policy, side by side.
    (
        "GET",
        "/saga-types/{name}/insights/policies",
        "insights_by_policy_saga_types__name__insights_policies_get",
    ),
    # Issue 40 §1: a saga type with its declared graph; a graph saga's nodes' states.
    ("GET", "/saga-types/{name}", "saga_type_saga_types__name__get"),
    ("GET", "/sagas/{saga_id}/graph", "get_saga_graph_sagas__saga_id__graph_get"),
    ("POST", "/sagas/{saga_id}/signal", "signal_sagas__saga_id__signal_post"),
    ("POST", "/sagas/{saga_id}/cancel", "cancel_sagas__saga_id__cancel_post"),
    ("POST", "/sagas/{saga_id}/resume", "resume_sagas__saga_id__resume_post"),
    ("POST", "/sagas/{saga_id}/retry", "retry_sagas__saga_id__retry_post"),
    ("POST", "/sagas/{saga_id}/skip", "skip_sagas__saga_id__skip_post"),
    (
        "POST",
        "/sagas/{saga_id}/force-compensate",
        "force_compensate_sagas__saga_id__force_compensate_post",
    ),
    # Issue 26 §3: a rerun linked to its original.
    ("POST", "/sagas/{saga_id}/rerun", "rerun_sagas__saga_id__rerun_post"),
    # Issue 26 §2: updates and queries.
    ("POST", "/sagas/{saga_id}/updates/{name}", "update_sagas__saga_id__updates__name__post"),
    ("GET", "/sagas/{saga_id}/queries/{name}", "query_sagas__saga_id__queries__name__get"),
    # Issue 14 §5: saga versions' rollouts.
    ("GET", "/rollouts", "list_rollouts_rollouts_get"),
    ("GET", "/rollouts/{saga_type}", "get_rollout_rollouts__saga_type__get"),
    ("PUT", "/rollouts/{saga_type}", "set_rollout_rollouts__saga_type__put"),
    # Issue 40 §2: flow policies and their rollout.
    ("GET", "/flow/policies", "get_flow_policies_flow_policies_get"),
    ("PUT", "/flow/policies/rollout", "set_flow_rollout_flow_policies_rollout_put"),
    ("DELETE", "/flow/policies/rollout", "clear_flow_rollout_flow_policies_rollout_delete"),
    # Durable schedules (admin/_schedules.py).
    ("POST", "/schedules", "create_schedule_schedules_post"),
    ("GET", "/schedules", "list_schedules_schedules_get"),
    ("GET", "/schedules/{schedule_id}", "get_schedule_schedules__schedule_id__get"),
    ("DELETE", "/schedules/{schedule_id}", "delete_schedule_schedules__schedule_id__delete"),
    ("POST", "/schedules/{schedule_id}/pause", "pause_schedule_schedules__schedule_id__pause_post"),
    (
        "POST",
        "/schedules/{schedule_id}/resume",
        "resume_schedule_schedules__schedule_id__resume_post",
    ),
    (
        "POST",
        "/schedules/{schedule_id}/trigger",
        "trigger_schedule_schedules__schedule_id__trigger_post",
    ),
    # Batch operations (admin/_batch_operations.py, issue 26 §4).
    ("POST", "/batch-operations", "create_batch_batch_operations_post"),
    ("GET", "/batch-operations", "list_batches_batch_operations_get"),
    ("GET", "/batch-operations/{operation_id}", "get_batch_batch_operations__operation_id__get"),
    (
        "POST",
        "/batch-operations/{operation_id}/cancel",
        "cancel_batch_batch_operations__operation_id__cancel_post",
    ),
    # Issue 27 §1: the dead-letter topic (admin/_dead_letters.py).
    ("GET", "/dead-letters", "list_dead_letters_dead_letters_get"),
    (
        "GET",
        "/dead-letters/{partition}/{offset}",
        "get_dead_letter_dead_letters__partition___offset__get",
    ),
    (
        "POST",
        "/dead-letters/{partition}/{offset}/replay",
        "replay_dead_letter_dead_letters__partition___offset__replay_post",
    ),
}

_READ = ["200", "401", "404", "409", "422", "503"]
_ACTION = ["200", "400", "401", "403", "404", "409", "413", "422", "503"]
_SCHEDULE_STATE = ["200", "401", "403", "404", "409", "422", "503"]
#: operationId -> the documented status codes, as generated before the split.
_CALLBACK = ["200", "400", "403", "409", "410", "413", "415", "422", "503"]
STATUS_CODES = {
    "health_health_get": ["200", "503"],
    "complete_callback_callbacks__token__post": _CALLBACK,
    "fail_callback_callbacks__token__fail_post": _CALLBACK,
    "saga_types_saga_types_get": ["200", "401"],
    "list_sagas_sagas_get": ["200", "400", "401", "422", "503"],
    "get_saga_sagas__saga__get": _READ,
    "start_sagas__saga__post": [
        "200",
        "202",
        "400",
        "401",
        "403",
        "404",
        "409",
        "413",
        "415",
        "422",
        "503",
    ],
    "history_sagas__saga_id__history_get": _READ,
    "get_lineage_sagas__saga_id__lineage_get": _READ,
    "stream_progress_sagas__saga_id__stream_get": ["200", "401", "404", "422", "503"],
    "metrics_metrics_get": ["200", "401", "422", "503"],
    "flow_flow_get": ["200", "401", "422", "503"],
    "domain_events_domain_events_get": ["200", "401", "422", "503"],
    "concurrency_keys_concurrency_keys_get": ["200", "401", "422", "503"],
    "insights_saga_types__name__insights_get": ["200", "401", "404", "422", "503"],
    "insights_by_policy_saga_types__name__insights_policies_get": [
        "200",
        "401",
        "404",
        "422",
        "503",
    ],
    "saga_type_saga_types__name__get": ["200", "401", "404", "422"],
    "get_saga_graph_sagas__saga_id__graph_get": _READ,
    "signal_sagas__saga_id__signal_post": _ACTION,
    "update_sagas__saga_id__updates__name__post": _ACTION,
    "query_sagas__saga_id__queries__name__get": _READ,
    "cancel_sagas__saga_id__cancel_post": _ACTION,
    "resume_sagas__saga_id__resume_post": _ACTION,
    "retry_sagas__saga_id__retry_post": _ACTION,
    "skip_sagas__saga_id__skip_post": _ACTION,
    "force_compensate_sagas__saga_id__force_compensate_post": _ACTION,
    "rerun_sagas__saga_id__rerun_post": ["202", *_ACTION[1:]],
    "list_rollouts_rollouts_get": ["200", "401", "422", "503"],
    "get_rollout_rollouts__saga_type__get": ["200", "401", "404", "422", "503"],
    "set_rollout_rollouts__saga_type__put": _ACTION,
    "get_flow_policies_flow_policies_get": ["200", "401", "422", "503"],
    "set_flow_rollout_flow_policies_rollout_put": _ACTION,
    "clear_flow_rollout_flow_policies_rollout_delete": _ACTION,
    "create_schedule_schedules_post": [
        "200",
        "201",
        "400",
        "401",
        "403",
        "409",
        "413",
        "422",
        "503",
    ],
    "list_schedules_schedules_get": ["200", "401", "422", "503"],
    "get_schedule_schedules__schedule_id__get": ["200", "401", "404", "422", "503"],
    "delete_schedule_schedules__schedule_id__delete": ["204", "401", "403", "404", "422", "503"],
    "pause_schedule_schedules__schedule_id__pause_post": _SCHEDULE_STATE,
    "resume_schedule_schedules__schedule_id__resume_post": _SCHEDULE_STATE,
    "create_batch_batch_operations_post": [
        "200",
        "201",
        "400",
        "401",
        "403",
        "413",
        "422",
        "503",
    ],
    "list_batches_batch_operations_get": ["200", "401", "422", "503"],
    "get_batch_batch_operations__operation_id__get": ["200", "401", "404", "422", "503"],
    "cancel_batch_batch_operations__operation_id__cancel_post": _SCHEDULE_STATE,
    "list_dead_letters_dead_letters_get": ["200", "401", "422", "503"],
    "get_dead_letter_dead_letters__partition___offset__get": ["200", "401", "404", "422", "503"],
    "replay_dead_letter_dead_letters__partition___offset__replay_post": [
        "200",
        "400",
        "401",
        "403",
        "404",
        "409",
        "413",
        "422",
        "503",
    ],
    "trigger_schedule_schedules__schedule_id__trigger_post": [
        "200",
        "401",
        "403",
        "404",
        "422",
        "503",
    ],
}


def _operations(spec: dict[str, Any]) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {
        (method.upper(), path, operation["operationId"]): operation
        for path, methods in spec["paths"].items()
        for method, operation in methods.items()
    }


def _spec(types: list[type[Any]], settings: Settings) -> dict[str, Any]:
    env = SagaTestEnv(types)
    return create_admin_app(
        env.engine, settings, parts=env.parts, schedules=env.schedules, batches=env.batches
    ).openapi()


def test_the_operations_are_pinned() -> None:
    operations = _operations(_spec([Transfer, Noop], admin_settings()))
    assert set(operations) == OPERATIONS
    assert {op: sorted(o["responses"]) for (_, _, op), o in operations.items()} == STATUS_CODES
    # Every operation but /health and the callbacks' documents the bearer scheme.
    secured = {path for (_, path, _), o in operations.items() if "security" in o}
    public = {"/health", "/callbacks/{token}", "/callbacks/{token}/fail"}
    assert secured == {path for _, path, _ in OPERATIONS} - public
    assert "security" not in operations[("GET", "/health", "health_health_get")]


def test_the_start_parameters_follow_each_apps_engine_and_settings() -> None:
    """The saga-type enum and the ``wait`` bound are per app: two apps built in one
    process, with other engines and settings, each describe their own."""
    start = ("POST", "/sagas/{saga}", "start_sagas__saga__post")
    first = _operations(_spec([Transfer, Noop], admin_settings(max_wait_s=7.5)))[start]
    second = _operations(_spec([Noop], Settings()))[start]
    bare = _operations(_spec([], Settings()))[start]

    def params(operation: dict[str, Any]) -> dict[str, Any]:
        return {p["name"]: p["schema"] for p in operation["parameters"]}

    assert params(first)["saga"]["enum"] == ["noop", "transfer"]
    assert params(first)["wait"]["anyOf"][0]["maximum"] == 7.5
    assert params(second)["saga"]["enum"] == ["noop"]
    assert params(second)["wait"]["anyOf"][0]["maximum"] == Settings().admin.max_wait_s
    assert "enum" not in params(bare)["saga"]


async def test_each_app_serves_its_own_engine_and_settings() -> None:
    first, second = SagaTestEnv([Transfer, Noop]), SagaTestEnv([Noop])
    one = create_admin_app(first.engine, admin_settings(), parts=first.parts)
    two = create_admin_app(second.engine, admin_settings(max_wait_s=1), parts=second.parts)
    async with make_client(one) as http_one, make_client(two) as http_two:
        types_one = (await http_one.get("/saga-types", headers=READER)).json()
        types_two = (await http_two.get("/saga-types", headers=READER)).json()
        too_long = await http_two.post("/sagas/noop?wait=2", json={}, headers=OPERATOR)
        unknown = await http_two.post("/sagas/transfer", json={}, headers=OPERATOR)
    assert [t["name"] for t in types_one] == ["noop", "transfer"]
    assert [t["name"] for t in types_two] == ["noop"]
    assert too_long.status_code == 422
    assert too_long.json()["detail"][0]["loc"] == ["query", "wait"]
    assert unknown.status_code == 404
