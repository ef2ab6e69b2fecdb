"""The admin API's rollouts (GET/PUT /rollouts) and the web page that shows them, over
the testing kit's engine and in-memory store (the Postgres side: tests/internal/versions)."""

from __future__ import annotations

from tests.admin.conftest import OPERATOR, READER, Admin


async def test_a_type_without_a_rollout_runs_its_highest_version(admin: Admin) -> None:
    views = (await admin.http.get("/rollouts", headers=READER)).json()
    assert [v["saga_type"] for v in views] == ["noop", "transfer"]
    transfer = views[1]
    assert transfer["versions"] == [1]
    assert transfer["rollout"] is None
    assert transfer["audit"] == []
    assert "highest deployed" in transfer["summary"]


async def test_set_audit_and_show_a_rollout(admin: Admin) -> None:
    put = await admin.http.put(
        "/rollouts/transfer",
        json={"version": 2, "percent": 0, "reason": "deploy v2 dark"},
        headers=OPERATOR,
    )
    assert put.status_code == 200, put.text
    view = put.json()
    assert view["rollout"] == {"version": 2, "percent": 0, "predicate": None}
    assert view["updated_by"] == "olivia"
    # Set ahead of the deploy: this engine has no version 2 yet, and says what that means.
    assert (
        view["summary"]
        == "version 2 is not deployed on this engine: new starts run version 1 until it is"
    )
    await admin.http.put(
        "/rollouts/transfer",
        json={"version": 2, "percent": 10, "reason": "canary"},
        headers=OPERATOR,
    )
    shown = (await admin.http.get("/rollouts/transfer", headers=READER)).json()
    assert [
        (c["principal"], c["reason"], c["before"], c["after"]["percent"]) for c in shown["audit"]
    ] == [
        ("olivia", "canary", {"version": 2, "percent": 0, "predicate": None}, 10),
        ("olivia", "deploy v2 dark", None, 0),
    ]
    limited = (await admin.http.get("/rollouts/transfer?limit=1", headers=READER)).json()
    assert len(limited["audit"]) == 1
    # The engine serving the API applies it at once (the others at their next refresh).
    applied = admin.env.parts.rollouts.get("transfer")
    assert applied is not None
    assert (applied.version, applied.percent) == (2, 10)

    page = await admin.http.get("/ui/rollouts", headers=READER)
    assert page.status_code == 200
    assert 'id="rollout-transfer"' in page.text
    assert "canary" in page.text
    assert "deploy v2 dark" in page.text
    assert "v2 0%" in page.text  # the audit's before -> after


async def test_bad_rollouts_are_refused_with_the_reason(admin: Admin) -> None:
    too_much = await admin.http.put(
        "/rollouts/transfer", json={"version": 2, "percent": 101, "reason": "x"}, headers=OPERATOR
    )
    assert too_much.status_code == 422
    assert too_much.json()["detail"][0]["loc"] == ["body", "percent"]
    no_reason = await admin.http.put(
        "/rollouts/transfer", json={"version": 2, "percent": 1, "reason": " "}, headers=OPERATOR
    )
    assert no_reason.status_code == 422
    unknown_predicate = await admin.http.put(
        "/rollouts/transfer",
        json={"version": 1, "percent": 0, "predicate": "beta", "reason": "x"},
        headers=OPERATOR,
    )
    assert unknown_predicate.status_code == 422
    assert "declares a rollout predicate 'beta'" in unknown_predicate.text
    unknown_type = await admin.http.put(
        "/rollouts/nope", json={"version": 2, "percent": 1, "reason": "x"}, headers=OPERATOR
    )
    assert unknown_type.status_code == 404
    assert (await admin.http.get("/rollouts/nope", headers=READER)).status_code == 404
    reader = await admin.http.put(
        "/rollouts/transfer", json={"version": 2, "percent": 1, "reason": "x"}, headers=READER
    )
    assert reader.status_code == 403
    # Nothing was written by any of them.
    assert (await admin.http.get("/rollouts/transfer", headers=READER)).json()["audit"] == []


async def test_the_saga_shows_its_version(admin: Admin) -> None:
    saga_id = await admin.start()
    await admin.settle(saga_id)
    assert (await admin.http.get(f"/sagas/{saga_id}", headers=READER)).json()["saga_version"] == 1
    listed = (await admin.http.get("/sagas", headers=READER)).json()["items"]
    assert [i["saga_version"] for i in listed] == [1]
    page = await admin.http.get(f"/ui/sagas/{saga_id}", headers=READER)
    assert 'id="saga-version">1<' in page.text
