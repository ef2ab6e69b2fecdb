"""A process's static name in a consumer group (Kafka's ``group.instance.id``).

With static membership a process that restarts under the name it had gets its
partitions back at once, without a rebalance of the group; and the group does not
rebalance while it is away for less than the session timeout. That needs a name that is
the same across restarts of one instance and different between instances.

Configured (``SAGA_KAFKA__GROUP_INSTANCE_ID``), the name is used as given. Unset, it is
``<host name>-<n>``: n is the lowest number whose lock file (one per group and number,
in ``instance_lock_dir``) no other process of this host holds. The lock is an ``flock``,
which the kernel drops when its process ends however it ends, so a process restarted
after a SIGKILL finds its predecessor's number free and takes the same name back, while
two live processes on one host never get the same one (two live members with one name
would fence each other out of the group).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import socket
import tempfile
from pathlib import Path

from saga_engine.kernel._settings import KafkaSettings

#: More processes than this of one group on one host is a configuration mistake.
_MAX_SLOTS = 1024


class InstanceName:
    """The name claimed for one consumer group; ``release`` gives its number back."""

    def __init__(self, name: str | None, fd: int | None = None) -> None:
        #: None: dynamic membership (``static_membership`` is off).
        self.name = name
        self._fd = fd

    @classmethod
    def claim(cls, kafka: KafkaSettings, group_id: str) -> InstanceName:
        if not kafka.static_membership:
            return cls(None)
        if kafka.group_instance_id:
            return cls(kafka.group_instance_id)
        host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())[:150] or "host"
        lock_dir = Path(kafka.instance_lock_dir or tempfile.gettempdir())
        lock_dir.mkdir(parents=True, exist_ok=True)
        group = hashlib.sha256(group_id.encode()).hexdigest()[:16]
        for slot in range(_MAX_SLOTS):
            path = lock_dir / f"saga-engine-member-{group}-{slot}.lock"
            fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
            try:
                # Non-blocking: a number held by a live process is skipped, not awaited.
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            except BaseException:
                os.close(fd)
                raise
            return cls(f"{host}-{slot}", fd)
        raise RuntimeError(
            f"{_MAX_SLOTS} processes of group {group_id!r} already hold a member name on this "
            "host; set SAGA_KAFKA__GROUP_INSTANCE_ID per process"
        )

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)  # closing the descriptor drops its flock
            self._fd = None
