"""Callback tokens (``kernel/_callback_tokens``): whatever a caller changes in a signed
token, it is refused; a token round-trips its claims; one expired is gone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretStr

from saga_engine.kernel._callback_tokens import CallbackClaims, sign, token_of, verify
from saga_engine.kernel._errors import CallbackGone, CallbackTokenInvalid
from saga_engine.kernel._settings import CallbackSettings

KEYS = CallbackSettings(keys={"a": SecretStr("a" * 40), "b": SecretStr("b" * 40)}, current_key="b")
NOW = datetime(2030, 1, 1, tzinfo=UTC)

claims = st.builds(
    CallbackClaims,
    saga_id=st.text(min_size=1, max_size=200),
    wait_id=st.text(min_size=1, max_size=120),
    expires_at=st.integers(1, 10**6).map(lambda s: NOW + timedelta(seconds=s)),
    key_id=st.sampled_from(["a", "b"]),
)


@given(claims)
def test_a_token_round_trips_its_claims(c: CallbackClaims) -> None:
    assert verify(KEYS, sign(KEYS, c), NOW) == c


@given(claims, st.data())
def test_any_change_to_a_token_is_refused(c: CallbackClaims, data: st.DataObject) -> None:
    token = sign(KEYS, c)
    at = data.draw(st.integers(0, len(token) - 1))
    replacement = data.draw(st.characters(codec="ascii").filter(lambda ch: ch != token[at]))
    changed = token[:at] + replacement + token[at + 1 :]
    with pytest.raises(CallbackTokenInvalid):
        verify(KEYS, changed, NOW)


@given(claims)
def test_an_expired_token_is_gone(c: CallbackClaims) -> None:
    token = sign(KEYS, c)
    with pytest.raises(CallbackGone):
        verify(KEYS, token, c.expires_at + timedelta(seconds=1))


def test_a_token_from_another_deployments_keys_is_refused() -> None:
    c = CallbackClaims("s", "callback:x:1", NOW + timedelta(hours=1), "a")
    theirs = CallbackSettings(keys={"a": SecretStr("z" * 40)})
    with pytest.raises(CallbackTokenInvalid, match="signature"):
        verify(KEYS, sign(theirs, c), NOW)
    with pytest.raises(CallbackTokenInvalid, match="not configured"):
        verify(CallbackSettings(), sign(KEYS, c), NOW)


def test_token_of_reads_a_url_and_its_fail_url() -> None:
    assert token_of("https://x/callbacks/abc.def") == ("abc.def", False)
    assert token_of("https://x/callbacks/abc.def/fail") == ("abc.def", True)
    for bad in ("https://x/sagas/abc", "https://x/callbacks/", "https://x/callbacks/a/other"):
        with pytest.raises(CallbackTokenInvalid):
            token_of(bad)
