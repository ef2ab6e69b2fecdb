"""The development stack's KRaft cluster id (``scripts/devstack_base.kraft_cluster_id``)
never starts with "-", which Kafka's storage tool would read as an option: one ``make up``
in 64 failed so ("--cluster-id/-t: expected one argument")."""

from __future__ import annotations

import base64
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from devstack_base import kraft_cluster_id


def test_bytes_that_would_start_with_a_dash_are_drawn_again() -> None:
    raw = b"\xf8" + bytes(15)  # 111110...: "-" first in URL-safe base64
    assert base64.urlsafe_b64encode(raw).decode().startswith("-")
    cluster_id = kraft_cluster_id(raw)
    assert not cluster_id.startswith("-")
    assert len(cluster_id) == 22
    assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16


def test_other_bytes_are_kept() -> None:
    raw = bytes(range(16))
    assert kraft_cluster_id(raw) == base64.urlsafe_b64encode(raw).decode().rstrip("=")
