"""Updates and queries in the testing kit: validated before anything is recorded,
recorded, run on the saga's state (which its run reads later), deduplicated by update
id, and replayed; queries write nothing."""

from __future__ import annotations

import pytest

from saga_engine import (
    InvalidPayload,
    InvalidTransition,
    QueryFailed,
    SagaStatus,
    UpdateFailed,
    UpdateRefused,
)
from saga_engine.testing import SagaTestEnv
from tests.internal.e2e.update_app import AddItem, Cart, CartIn, Checkout, PriceWith


async def _cart(env: SagaTestEnv, limit: int = 100) -> str:
    run = await env.start(Cart, CartIn(customer="ada", limit=limit))
    return run.saga_id


async def test_an_update_changes_what_the_run_does_and_is_recorded() -> None:
    env = SagaTestEnv([Cart])
    env.participant("alpha").on("Apply", reply={"receipt": "r-1"})
    saga_id = await _cart(env)
    assert await env.update(saga_id, Cart.add_item, AddItem(sku="tea", price=30)) == {
        "items": 1,
        "total": 30,
    }
    assert await env.update(saga_id, "add_item", {"sku": "jam", "price": 20}) == {
        "items": 2,
        "total": 50,
    }
    assert await env.query(saga_id, Cart.summary) == {
        "items": ["tea", "jam"],
        "total": 50,
        "checked_out": False,
    }
    assert await env.query(saga_id, "price_with", PriceWith(extra=5)) == 55
    await env.signal(saga_id, "checkout", Checkout())
    [charge] = env.commands("alpha")
    assert charge.payload["amount"] == 50
    kinds = [e.kind for e in await env.engine.history(saga_id)]
    assert kinds.count("update_received") == 2
    assert kinds.count("update_completed") == 2
    assert (await env.engine.get(saga_id)).status == SagaStatus.COMPLETED


async def test_refused_and_bad_updates_record_nothing() -> None:
    env = SagaTestEnv([Cart])
    saga_id = await _cart(env, limit=40)
    before = len(await env.engine.history(saga_id))
    with pytest.raises(UpdateRefused, match="limit is 40"):
        await env.update(saga_id, Cart.add_item, AddItem(sku="tv", price=900))
    with pytest.raises(InvalidPayload, match="declares no update 'nope'"):
        await env.update(saga_id, "nope", {})
    with pytest.raises(InvalidPayload, match="price"):
        await env.update(saga_id, Cart.add_item, {"sku": "x", "price": -1})
    with pytest.raises(InvalidPayload, match="declares no query"):
        await env.query(saga_id, "nope")
    assert len(await env.engine.history(saga_id)) == before
    # Checked out: the saga's state refuses any more items.
    await env.signal(saga_id, "checkout", Checkout())
    with pytest.raises(UpdateRefused, match="checked out"):
        await env.update(saga_id, Cart.add_item, AddItem(sku="tea", price=1))


async def test_the_same_update_id_is_applied_once_and_answered_the_same() -> None:
    env = SagaTestEnv([Cart])
    saga_id = await _cart(env)
    item = AddItem(sku="tea", price=30)
    first = await env.update(saga_id, Cart.add_item, item, update_id="u-1")
    again = await env.update(saga_id, Cart.add_item, item, update_id="u-1")
    assert first == again == {"items": 1, "total": 30}
    assert (await env.query(saga_id, Cart.summary))["total"] == 30
    # A handler that raises: the update is recorded as failed, and stays so.
    for _ in range(2):
        with pytest.raises(UpdateFailed, match="out of stock"):
            await env.update(saga_id, Cart.add_item, AddItem(sku="boom", price=1), update_id="u-2")
    kinds = [e.kind for e in await env.engine.history(saga_id)]
    assert kinds.count("update_received") == 2


async def test_an_ended_saga_refuses_updates_but_answers_queries_and_repeats() -> None:
    env = SagaTestEnv([Cart])
    env.participant("alpha").on("Apply", reply={"receipt": "r-1"})
    saga_id = await _cart(env)
    await env.update(saga_id, Cart.add_item, AddItem(sku="tea", price=30), update_id="u-1")
    await env.signal(saga_id, "checkout", Checkout())
    assert (await env.engine.get(saga_id)).status == SagaStatus.COMPLETED
    with pytest.raises(InvalidTransition, match="completed"):
        await env.update(saga_id, Cart.clear)
    again = await env.update(saga_id, Cart.add_item, AddItem(sku="tea", price=30), update_id="u-1")
    assert again == {"items": 1, "total": 30}
    assert (await env.query(saga_id, Cart.summary))["checked_out"] is True


async def test_state_replays_and_queries_write_nothing_when_not_loaded() -> None:
    env = SagaTestEnv([Cart])
    saga_id = await _cart(env)
    await env.update(saga_id, Cart.add_item, AddItem(sku="tea", price=30))
    assert await env.update(saga_id, Cart.clear) == 1
    await env.update(saga_id, Cart.add_item, AddItem(sku="jam", price=7))
    history = await env.engine.history(saga_id)
    env.engine.evict(saga_id)
    assert await env.query(saga_id, Cart.summary) == {
        "items": ["jam"],
        "total": 7,
        "checked_out": False,
    }
    assert env.engine.runtime_of(saga_id) is None  # not loaded by the query
    assert await env.engine.history(saga_id) == history
    # Rebuilt by its next input, with the updates' effect replayed.
    assert await env.update(saga_id, Cart.add_item, AddItem(sku="oil", price=3)) == {
        "items": 2,
        "total": 10,
    }


async def test_a_query_that_raises_is_a_query_failed() -> None:
    env = SagaTestEnv([Cart])
    saga_id = await _cart(env)
    with pytest.raises(InvalidPayload, match="extra"):
        await env.query(saga_id, Cart.price_with, {"extra": "lots"})
    with pytest.raises(QueryFailed, match="ZeroDivisionError"):
        await env.query(saga_id, Cart.average)
    await env.update(saga_id, Cart.add_item, AddItem(sku="tea", price=30))
    assert await env.query(saga_id, Cart.average) == 30.0
