"""Lineage in the admin API and the web page: parent, children, the tree, the trigger."""

from __future__ import annotations

from saga_engine.admin import create_admin_app
from saga_engine.testing import SagaTestEnv
from tests.admin.conftest import OPERATOR, READER, admin_settings, make_client
from tests.admin.sagas import Empty, Leaf, Middle, Root


async def test_detail_tree_and_page_show_the_lineage() -> None:
    env = SagaTestEnv([Root, Middle, Leaf], settings=admin_settings())
    app = create_admin_app(env.engine, env.settings, parts=env.parts, schedules=env.schedules)
    async with make_client(app) as http:
        run = await env.start(Root, Empty())
        root = (await http.get(f"/sagas/{run.saga_id}", headers=READER)).json()
        assert root["status"] == "completed"
        assert root["parent"] is None
        assert [(c["saga_type"], c["step"], c["status"]) for c in root["children"]] == [
            ("middle", "child:middle", "completed")
        ]
        middle_id = root["children"][0]["saga_id"]
        middle = (await http.get(f"/sagas/{middle_id}", headers=READER)).json()
        assert middle["parent"]["saga_id"] == run.saga_id
        assert middle["parent"]["saga_type"] == "root"
        assert [c["step"] for c in middle["children"]] == ["child:a", "child:b"]
        leaf_id = middle["children"][1]["saga_id"]

        # The tree from any member is the whole tree, from its root.
        tree = (await http.get(f"/sagas/{leaf_id}/lineage", headers=READER)).json()
        assert tree["saga_id"] == run.saga_id
        assert [n["saga_id"] for n in tree["children"]] == [middle_id]
        assert [n["step"] for n in tree["children"][0]["children"]] == ["child:a", "child:b"]
        assert all(n["status"] == "completed" for n in tree["children"][0]["children"])

        page = await http.get(f"/ui/sagas/{leaf_id}", headers=OPERATOR)
        assert page.status_code == 200
        assert 'id="parent"' in page.text
        assert f'/ui/sagas/{middle_id}"' in page.text  # the parent is linked
        assert 'id="lineage"' in page.text
        assert f'data-saga="{run.saga_id}"' in page.text
        assert "(this saga)" in page.text

        missing = await http.get("/sagas/no-such-saga/lineage", headers=READER)
        assert missing.status_code == 404
