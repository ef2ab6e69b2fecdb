"""The drill's "every history replays" check passes the deployment's callback keys
(``Settings.callbacks``, as the engines under drill have them): a saga whose code reads a
callback's URL replays only with the keys that signed it (issue 41, section 2)."""

from __future__ import annotations

from pydantic import SecretStr

from saga_engine.cli._drill_checks import _replays
from saga_engine.kernel._settings import CallbackSettings
from saga_engine.store._store import LoadedSaga, SagaRecord, StoredEvent
from saga_engine.testing import SagaTestEnv
from tests.test_callbacks import Empty, Kyc


async def _kyc_history() -> tuple[SagaTestEnv, str, LoadedSaga]:
    env = SagaTestEnv([Kyc])
    run = await env.start(Kyc, Empty())
    await env.callback(env.commands("kyc")[0].payload["callback_url"], {"approved": True})
    record: SagaRecord = await env.engine.get(run.saga_id)
    history = await run.history()
    return (
        env,
        run.saga_id,
        LoadedSaga(record, [StoredEvent(i + 1, e) for i, e in enumerate(history)]),
    )


async def test_histories_with_callbacks_replay_with_the_deployments_keys() -> None:
    env, saga_id, loaded = await _kyc_history()
    check = _replays({saga_id: loaded}, [Kyc], env.settings.callbacks)
    assert check.ok, check
    assert check.detail == "1 histories replayed"


async def test_without_the_keys_or_with_others_the_check_fails_and_says_why() -> None:
    _, saga_id, loaded = await _kyc_history()
    unsigned = _replays({saga_id: loaded}, [Kyc], CallbackSettings())
    assert not unsigned.ok
    assert "callbacks.keys" in unsigned.detail
    other = CallbackSettings(keys={"test": SecretStr("another-secret-" + "2" * 32)})
    assert not _replays({saga_id: loaded}, [Kyc], other).ok
