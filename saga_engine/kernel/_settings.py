"""The code behind :mod:`saga_engine.settings`, whose docstring says what it is for."""

from __future__ import annotations

import base64
import binascii
import logging
import math
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from saga_engine.kernel._errors import PayloadTooLarge, ShardMapError
from saga_engine.kernel._shards import SHARD_NAME, ShardMap

log = logging.getLogger("saga_engine.settings")


def check_message_size(size: int, limit: int, what: str) -> None:
    """The one size rule: ``what``, ``size`` bytes as it is (or would be) sent, must not
    exceed ``limit`` (``KafkaSettings.max_message_bytes``). Raises PayloadTooLarge,
    naming what, its size, the limit and the setting."""
    if size > limit:
        raise PayloadTooLarge(size, limit, what)


def payload_limit(settings: Settings) -> int:
    """The largest payload handed to the engine directly (a start's input, a signal, a
    reply taken in): the message size, or with payloads stored by reference
    (``codec.blobs``) the largest blob, since the store keeps a reference in its place."""
    blobs = settings.codec.blobs
    return blobs.max_bytes if blobs.enabled else settings.kafka.max_message_bytes


_RESOURCE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def resource_amounts(amounts: Mapping[str, Any], what: str, *, positive: bool) -> dict[str, float]:
    """The one rule of resource amounts (a step's ``Cost``, a ``FlowLimit``'s budget, a
    cost class): each resource is named like an identifier (letters, digits and ``_``,
    at most 64) and its amount is a finite number, at least 0 (``positive``: above 0, as
    a budget must be). Returns them as floats; raises ValueError naming ``what``, the
    resource and the value."""
    if not isinstance(amounts, Mapping):
        raise ValueError(f"{what} must map resource names to amounts, got {amounts!r}")
    out: dict[str, float] = {}
    for name, amount in amounts.items():
        if not isinstance(name, str) or not _RESOURCE.match(name):
            raise ValueError(
                f"{what}: resource name {name!r} must be letters, digits and _ (at most 64, "
                "not starting with a digit), e.g. cpu or memory_mb"
            )
        if isinstance(amount, bool) or not isinstance(amount, int | float):
            raise ValueError(f"{what}: {name} must be a number, got {amount!r}")
        value = float(amount)
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            bound = "above 0" if positive else "at least 0"
            raise ValueError(f"{what}: {name} must be a finite number {bound}, got {amount!r}")
        out[name] = value
    return out


class ShardSettings(BaseModel):
    """One shard of the event store: a Postgres cluster and the inbox partitions (as
    text: ``"0-31"``, ``"0-31,40"``, ``""`` for none yet) whose sagas it holds."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(pattern=SHARD_NAME.pattern)
    partitions: str = ""
    # A secret, as PostgresSettings.dsn is.
    dsn: SecretStr


class PostgresSettings(BaseModel):
    """Where the event store lives."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    # A secret: a DSN may carry a password, and settings are printed in logs and errors.
    dsn: SecretStr = SecretStr("postgresql://postgres@127.0.0.1:54329/saga")
    db_schema: str = Field(default="saga_engine", pattern=r"^[a-z_][a-z0-9_]{0,62}$")
    pool_min_size: int = Field(default=2, ge=1)
    pool_max_size: int = Field(default=10, ge=1)
    command_timeout_s: float = Field(default=30.0, gt=0)
    #: Past one database (docs/operations.md, "Past one database"): the shards, each a
    #: Postgres cluster holding the sagas of a range of inbox partitions. Empty (the
    #: default): one database, ``dsn``, holds everything and there is no shard map.
    #: ``SAGA_PG__SHARDS='[{"name":"a","partitions":"0-3","dsn":"postgresql://..."}, ...]'``
    shards: tuple[ShardSettings, ...] = ()
    #: With shards: the database of what is not per saga (schedules, rollouts, batch
    #: operations, flow policies, the shard map and its epoch). Required with shards.
    control_dsn: SecretStr | None = None

    def control(self) -> PostgresSettings:
        """Where what is not per saga lives (schedules, batch operations, rollouts, flow
        policies, the shard map): the control database with shards, this one without."""
        if not self.shards or self.control_dsn is None:
            return self
        return self.model_copy(update={"dsn": self.control_dsn, "shards": ()})

    def of_shard(self, name: str) -> PostgresSettings:
        """These settings pointed at the shard called ``name`` (its own pool, schema and
        timeouts as configured here)."""
        return self.model_copy(
            update={"dsn": SecretStr(self.shard_dsn(name)), "shards": (), "control_dsn": None}
        )

    def shard_dsn(self, name: str) -> str:
        """The address of the shard called ``name`` (``ShardMapError`` when none is)."""
        for shard in self.shards:
            if shard.name == name:
                return shard.dsn.get_secret_value()
        raise ShardMapError(f"no shard is named {name!r} in SAGA_PG__SHARDS")


class KafkaSettings(BaseModel):
    """Where commands, replies and start requests travel."""

    model_config = ConfigDict(frozen=True)

    bootstrap_servers: str = "127.0.0.1:19092"
    topic_prefix: str = Field(default="saga", pattern=r"^[A-Za-z0-9._-]{1,100}$")
    partitions: int = Field(default=8, ge=1)
    replication_factor: int = Field(default=1, ge=1)
    group_id: str = "saga-engine"
    # aiokafka's default fetch_max_wait_ms is 500 ms, which puts half a second on every
    # reply hop; a saga engine is latency-bound, so we wait far less.
    fetch_max_wait_ms: int = Field(default=20, ge=0)
    #: The shortest time between two offset commits of one consumer (engine inbox,
    #: participant): a commit carries every offset made durable since the one before, so
    #: a busy consumer sends a few a second instead of one per batch (bench/README.md,
    #: "Kafka requests per saga"). Commits still follow durability, and a rebalance or a
    #: stop commits at once; a crash re-reads at most this much more, deduplicated.
    commit_interval_ms: int = Field(default=500, ge=0)
    #: The one size limit (PROTOCOL.md section 12): every message the engine, a
    #: participant or a client sends or reads, its value and every header name and
    #: value in bytes; and every payload handed to the engine directly (a start's input,
    #: a reply, a signal...), as compact JSON. ``check_message_size`` applies it.
    max_message_bytes: int = Field(default=1_000_000, ge=1024)
    #: How long a silent group member keeps its partitions: a crashed engine's sagas move
    #: to a survivor after this long. 6 s is the broker's smallest allowed value by
    #: default (``group.min.session.timeout.ms``); a survivor learns of the rebalance at
    #: its next heartbeat.
    session_timeout_ms: int = Field(default=6_000, ge=1000)
    heartbeat_interval_ms: int = Field(default=1_000, ge=100)
    #: Static group membership (KIP-345): a process restarted under the same name gets
    #: its partitions back at once, without a rebalance, and its partitions stay put
    #: (no rebalance) while it is away for less than the session timeout. Off: every
    #: start and stop rebalances the group.
    static_membership: bool = True
    #: This process's name in its consumer groups, when ``static_membership`` is on.
    #: Unset: ``<host name>-<n>``, with n the lowest number no other process of this
    #: host holds for that group (a lock file in ``instance_lock_dir``), so that a
    #: process restarted on the same host takes its predecessor's name back and two on
    #: one host never share one. Set it to a name stable per instance (a StatefulSet
    #: pod's name) when the host name is not. Two live processes with one name fence
    #: each other: give every instance its own.
    group_instance_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._-]{1,200}$")
    #: Where the lock files behind the default ``group_instance_id`` live. Unset: the
    #: system's temporary directory.
    instance_lock_dir: str | None = None


class ParticipantSettings(BaseModel):
    """A participant service's own database (for its processed-commands table and outbox)."""

    model_config = ConfigDict(frozen=True)

    #: Unset in ``Settings``: the engine's database, ``SAGA_PG__DSN`` (see
    #: ``Settings._participant_dsn_follows_pg``).
    dsn: SecretStr = SecretStr(PostgresSettings().dsn.get_secret_value())
    db_schema: str = Field(default="saga_participant", pattern=r"^[a-z_][a-z0-9_]{0,62}$")
    #: Connections to that database: a batch holds one, the outbox relay another.
    pool_max_size: int = Field(default=5, ge=1)
    #: Attempts at a handler that raises an unexpected exception before replying
    #: "retryable" (the transaction is rolled back each time, so nothing is applied).
    handler_attempts: int = Field(default=5, ge=1)
    #: How long start-up waits for Kafka and this database to answer, retrying with
    #: back-off and logging one line per attempt. Unset: for ever, as an orchestrator
    #: expects from a service whose dependencies start alongside it.
    startup_timeout_s: float | None = Field(default=None, gt=0)
    #: Record each applied command in the ``drill_ledger`` table, in the transaction that
    #: applies it (``saga drill`` sets it on the participants it starts).
    drill_ledger: bool = False


class EngineSettings(BaseModel):
    """How the engine itself behaves."""

    model_config = ConfigDict(frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _no_payload_limit(cls, data: Any) -> Any:
        """``max_payload_bytes`` was a second limit, below the message size: one payload
        of 300 KB was refused while a command of as much was sent. It is gone; one
        limit, ``kafka.max_message_bytes``, applies to both."""
        if isinstance(data, dict) and "max_payload_bytes" in data:
            log.warning(
                "SAGA_ENGINE__MAX_PAYLOAD_BYTES is ignored: one limit, "
                "SAGA_KAFKA__MAX_MESSAGE_BYTES, applies to every message and payload"
            )
            data = {k: v for k, v in data.items() if k != "max_payload_bytes"}
        return data

    #: How long ``Engine.wait`` polls the store between checks when the saga is elsewhere.
    wait_poll_s: float = Field(default=0.2, gt=0)
    #: How often a saga held in memory that waits for a domain event looks for a stored
    #: match again (a look the store failed; arrivals and loads look at once).
    event_poll_s: float = Field(default=5.0, gt=0)
    #: Apply the shipped migrations when a worker starts (they run under an advisory lock).
    auto_migrate: bool = True
    #: How many sagas a recovering engine rebuilds at once.
    recovery_concurrency: int = Field(default=32, ge=1)
    #: Most sagas one engine holds in memory; past it the least recently changed are
    #: evicted (rebuilt from history by their next input). Memory is bounded by this.
    cache_size: int = Field(default=10_000, ge=1)
    #: A saga that waits only on a timer or a signal, unchanged for this long, is
    #: evicted; its timers are then due from Postgres.
    idle_evict_s: float = Field(default=60.0, ge=0)
    #: How often an engine evicts idle sagas and asks Postgres for the wake-ups due in
    #: its partitions (of sagas not in memory): a timer fires within about this late.
    timer_poll_s: float = Field(default=0.5, gt=0, le=60)
    #: The poll loads the sagas whose wake-up is due within this much ahead, so that
    #: their timers fire from memory at their time (not up to a poll late), and a burst
    #: of wake-ups due at once is loaded before it is due. They stay in memory until then.
    timer_lookahead_s: float = Field(default=5.0, ge=0, le=3600)
    #: How long start-up waits for Kafka and Postgres to answer, retrying with back-off
    #: and logging one line per attempt. Unset: for ever, as an orchestrator expects
    #: from a service whose dependencies start alongside it.
    startup_timeout_s: float | None = Field(default=None, gt=0)
    #: How often an engine with several versions of a saga type re-reads the rollouts
    #: (migration 0008): a change made elsewhere applies here within about this long.
    #: Past one database, also how often it reads the shard map's epoch, to route its
    #: reads by the map a move advanced (its writes follow at once: a shard refuses them).
    rollout_refresh_s: float = Field(default=2.0, gt=0, le=300)
    #: A saga queued for its concurrency key (``Saga.concurrency``) asks again this
    #: often, besides being woken when a holder releases the key: nothing depends on one
    #: wake-up message (docs/concurrency-keys.md).
    key_poll_s: float = Field(default=2.0, gt=0, le=300)
    #: How often housekeeping releases the key slots of sagas that ended without
    #: releasing them (an engine killed between a saga's end and its release).
    key_sweep_s: float = Field(default=10.0, gt=0, le=3600)
    #: How often housekeeping adds the runs that ended since to the insights' aggregates
    #: (migration 0015; a read of the insights adds them first anyway).
    insights_rollup_s: float = Field(default=2.0, gt=0, le=3600)
    #: The events in one run of a saga past which ``ctx.should_continue_as_new()`` says
    #: True, and past which the engine warns (a log line, and the saga's admin view and
    #: page) that the saga's history grows without continuing as new
    #: (docs/continue-as-new.md).
    continue_as_new_after: int = Field(default=10_000, ge=10)


class ScheduleSettings(BaseModel):
    """How a worker fires durable schedules (``saga_engine.schedules``, migration 0007).

    Every worker runs the scheduler; they share the due schedules through Postgres row
    locks. With no schedule, it costs one indexed query per ``poll_s``.
    """

    model_config = ConfigDict(frozen=True)

    #: Off: this worker fires nothing (the others still do); schedules declared in its
    #: code are still created at its start.
    enabled: bool = True
    #: Longest sleep between two looks for due schedules; the scheduler sleeps less when
    #: the earliest next tick is sooner, so a tick fires about this late at worst.
    poll_s: float = Field(default=1.0, gt=0, le=60)
    #: Shortest sleep between two rounds: ticks due within it are claimed together, in
    #: one transaction and one batch of sends (10,000 one-minute schedules spread over
    #: the minute are due every 6 ms). Each tick may fire up to this much later.
    coalesce_s: float = Field(default=0.1, ge=0, le=5)
    #: Schedules claimed (and their starts sent) per transaction.
    batch_size: int = Field(default=500, ge=1, le=10_000)
    #: Claims a worker runs at once while a burst lasts (a first batch came back full).
    claims_in_flight: int = Field(default=3, ge=1, le=8)
    #: A tick fired later than this after its time counts as missed: the schedule's
    #: catch-up policy decides whether it still fires.
    grace_s: float = Field(default=60.0, ge=0)


class BatchSettings(BaseModel):
    """How a worker runs batch operations (``POST /batch-operations``, migration 0013).

    Every worker looks for an operation to work on; one holds it at a time, by a lease it
    renews as it goes, and another takes it over once the lease has expired (a crash).
    """

    model_config = ConfigDict(frozen=True)

    #: Off: this worker runs no operation (the others still do).
    enabled: bool = True
    #: Sagas acted on per second, at most, by one operation: the actions take the same
    #: path as the inbox's inputs, so this keeps a large operation from starving it.
    rate_per_s: float = Field(default=50.0, gt=0, le=10_000)
    #: How long a claim on an operation lasts without progress; an engine that crashed
    #: holding one is replaced after this long.
    lease_s: float = Field(default=30.0, ge=1, le=3600)
    #: How often an idle worker looks for an operation to work on.
    poll_s: float = Field(default=2.0, gt=0, le=60)
    #: Sagas read per page of the filter.
    page_size: int = Field(default=100, ge=1, le=1000)


class RetentionSettings(BaseModel):
    """How long finished sagas stay in the live tables, and where they go after.

    A finished saga (completed, compensated, failed, cancelled) whose last change is
    older than its retention period is archived, then deleted from ``sagas`` and
    ``saga_events``, in bounded batches, by the engine that owns its partition.
    """

    model_config = ConfigDict(frozen=True)

    #: Days a finished saga is kept. Unset (the default): for ever, nothing is archived
    #: or deleted. Set, it also bounds how long an idempotency key de-duplicates: once
    #: its saga is deleted, a start with the same key starts a new saga, whose commands
    #: have the same ids as the old one's; participants that still remember those ids
    #: answer with the old replies. Keep participants' processed-command records at
    #: least as long, or never reuse keys.
    days: float | None = Field(default=None, gt=0)
    #: Saga type -> days, for the types kept longer or shorter than ``days``.
    per_type: dict[str, float] = Field(default_factory=dict)
    #: ``table``: the history goes to ``saga_archive`` (migration 0005), in the delete's
    #: transaction; ``directory``: to gzipped JSON-lines files in ``directory``;
    #: ``none``: deleted only.
    archive: Literal["table", "directory", "none"] = "table"
    directory: str | None = None
    #: Sagas per batch (one archive write and one delete each).
    batch_size: int = Field(default=500, ge=1, le=10_000)
    #: How often the owning engine looks for sagas past their retention.
    interval_s: float = Field(default=60.0, gt=0)

    @model_validator(mode="after")
    def _directory_given(self) -> RetentionSettings:
        if self.archive == "directory" and not self.directory:
            raise ValueError("retention.archive=directory needs retention.directory")
        if any(v <= 0 for v in self.per_type.values()):
            raise ValueError("retention.per_type: every period must be more than 0 days")
        return self


class HttpSettings(BaseModel):
    """HTTP steps: named endpoints, so histories record a name and a path, not a host."""

    model_config = ConfigDict(frozen=True)

    #: Endpoint name -> base URL, e.g. SAGA_HTTP__ENDPOINTS='{"fraud": "http://fraud:8000"}'.
    endpoints: dict[str, str] = Field(default_factory=dict)
    #: How long one attempt keeps retrying connection errors, 408, 429 and 5xx.
    retry_window_s: float = Field(default=10.0, gt=0)
    #: Per-request timeout of the HTTP client.
    request_timeout_s: float = Field(default=10.0, gt=0)


class AdminSettings(BaseModel):
    """The admin HTTP API, served inside the engine process (``saga_engine.admin``).

    Tokens map a principal's name (recorded in history with each operator action) to
    its bearer token: ``SAGA_ADMIN__OPERATORS='{"alice": "<32 random chars>"}'``.
    Readers may use every GET endpoint; operators may also act on sagas. With no token
    configured, the server starts only on a loopback address, where auth is off. The
    web page trades a token for a signed session cookie (``/ui/login``, ``/ui/logout``).
    """

    model_config = ConfigDict(frozen=True)

    #: Whether the worker serves the admin API at all.
    enabled: bool = True
    #: Where to listen. Anything but a loopback address requires tokens.
    host: str = "127.0.0.1"
    #: 0 picks a free port (handy in tests); the server reports the one it got.
    port: int = Field(default=8080, ge=0, le=65535)
    #: Principal name -> bearer token, read-only role (at least 16 characters each).
    readers: dict[str, SecretStr] = Field(default_factory=dict)
    #: Principal name -> bearer token, operator role: may also start and act on sagas.
    operators: dict[str, SecretStr] = Field(default_factory=dict)
    #: Largest request body accepted, in bytes; larger ones get 413 before being read.
    max_body_bytes: int = Field(default=65_536, ge=1024)
    #: Longest ``?wait=`` a start request may ask for, in seconds.
    max_wait_s: float = Field(default=60.0, gt=0, le=600)
    #: How long a start with a new Idempotency-Key waits to see its saga recorded, so
    #: that of two requests racing with one key the loser gets its 409 (after that, 202
    #: with status null; the loser's start is then dead-lettered as idempotency_conflict).
    idempotency_confirm_s: float = Field(default=2.0, ge=0, le=60)
    #: How long a web-page sign-in lasts unused, in whole seconds. Sliding: a request
    #: made with the session cookie extends it. A token's sessions also end when the
    #: token is rotated or removed.
    session_idle_s: int = Field(default=28_800, ge=1, le=30 * 86_400)
    #: Signs the web page's session cookies (at least 16 characters). Unset, the key is
    #: derived from all the configured tokens, so instances configured with the same
    #: tokens accept each other's sessions, and changing any token ends every session.
    session_secret: SecretStr | None = None
    #: At most this many progress streams (``GET /sagas/{id}/stream``) open at once in
    #: this process; one more is answered 503 with ``Retry-After`` (docs/progress.md).
    max_streams: int = Field(default=200, ge=1, le=100_000)
    #: Participants' step reports (``tx.progress``) kept in memory: the latest
    #: ``step_progress_items`` per running step, of at most ``step_progress_sagas``
    #: sagas, each gone after ``step_progress_ttl_s`` seconds without a report.
    step_progress_items: int = Field(default=10, ge=1, le=1000)
    step_progress_sagas: int = Field(default=10_000, ge=1, le=1_000_000)
    #: ... and at most this many bytes of them (about: each report's body as JSON, plus
    #: 256), the least recently reported saga's going first.
    step_progress_max_bytes: int = Field(default=64 * 1024 * 1024, ge=65_536)
    step_progress_ttl_s: float = Field(default=600.0, gt=0)


class BlobSettings(BaseModel):
    """Payloads stored by reference (docs/large-payloads.md): the ``ref`` codec at the
    end of the codec chain keeps any encoded payload of ``threshold_bytes`` or more in a
    blob store and puts a reference (content hash, size, store, MAC) in its place.

    Unset ``threshold_bytes``: off, every payload travels inline (the default). ``store``:
    ``postgres`` (the ``saga_blobs`` table, each blob written in the transaction of the
    event that references it) or ``directory`` (``directory``, a volume every process
    reading the payloads mounts). ``mac_keys``: key id -> base64 of at least 16 bytes,
    the keys of the references' MAC (every process of a deployment needs them); each
    reference names its key's id, so a rotation adds a key, makes it ``current_mac_key``
    and keeps the old ones for as long as references made under them are kept.
    ``mac_key``: one unnamed key, as before key ids (its references carry no id; given
    with ``mac_keys`` it still verifies them). ``grace_s``: how long
    an unreferenced blob is kept before the sweeper deletes it (it must outlast a write:
    a blob is written or touched before the reference to it commits), and
    ``sweep_interval_s`` how often an engine worker sweeps. ``max_bytes``: the largest
    payload taken by reference.
    """

    model_config = ConfigDict(frozen=True)

    threshold_bytes: int | None = Field(default=None, ge=1)
    store: Literal["postgres", "directory"] = "postgres"
    directory: str | None = None
    mac_key: SecretStr | None = None
    mac_keys: dict[str, SecretStr] = Field(default_factory=dict)
    current_mac_key: str | None = None
    grace_s: float = Field(default=3600.0, ge=0)
    #: How often each engine worker sweeps (every engine may: a sweep is idempotent).
    sweep_interval_s: float = Field(default=600.0, gt=0)
    max_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)

    @model_validator(mode="after")
    def _complete(self) -> BlobSettings:
        check_current_key(self.mac_keys, self.current_mac_key, "sign references")
        if self.threshold_bytes is None:
            return self
        if self.mac_key is None and not self.mac_keys:
            raise ValueError(
                "threshold_bytes is set: set mac_keys (or mac_key) too (base64, 16 bytes or more)"
            )
        for key_id, key in self.mac_key_texts().items():
            what = f"mac_keys[{key_id!r}]" if key_id else "mac_key"
            try:
                size = len(base64.b64decode(key, validate=True))
            except (binascii.Error, ValueError):
                raise ValueError(f"{what} is not base64") from None
            if size < 16:
                raise ValueError(f"{what} is {size} bytes; a MAC key needs 16 or more")
        if self.store == "directory" and not self.directory:
            raise ValueError("store is 'directory': name it in directory")
        return self

    @property
    def enabled(self) -> bool:
        return self.threshold_bytes is not None

    def mac_key_texts(self) -> dict[str, str]:
        """Every MAC key (base64) by id; "" is the unnamed ``mac_key``."""
        keys = {key_id: k.get_secret_value() for key_id, k in self.mac_keys.items()}
        if self.mac_key is not None:
            keys[""] = self.mac_key.get_secret_value()
        return keys

    @property
    def current_mac_key_id(self) -> str:
        """The id of the key new references are made under ("": the unnamed one)."""
        if self.current_mac_key is not None:
            return self.current_mac_key
        return next(iter(self.mac_keys)) if len(self.mac_keys) == 1 else ""


def check_current_key(keys: Mapping[str, object], current_key: str | None, use: str) -> None:
    """Keys that rotate (the codec's, the callbacks'): several may be configured, and all
    of them read; ``current_key`` names the one new values use, and must when there are
    several."""
    if current_key is not None and current_key not in keys:
        raise ValueError(f"current_key {current_key!r} is not among the keys")
    if current_key is None and len(keys) > 1:
        raise ValueError(f"several keys: name the one to {use} with in current_key")


class CodecSettings(BaseModel):
    """Payload encryption and compression (docs/operations.md, "Encrypting payloads").

    Nothing set: no codec, payloads are stored and sent as they are (the default, at no
    cost). ``keys``: key id -> base64 of a 16, 24 or 32-byte AES key, e.g.
    ``SAGA_CODEC__KEYS='{"key-2024": "..."}'``; ``current_key`` names the one new
    payloads are encrypted with (required when there are several); the others still
    decrypt. ``compression``: ``zstd`` or ``gzip`` for payloads of ``compress_threshold``
    bytes or more (before encryption). Every process of a deployment (engines,
    participants, clients, the CLI) needs the keys of the payloads it reads.
    """

    model_config = ConfigDict(frozen=True)

    # Secrets: settings are printed in logs and errors.
    keys: dict[str, SecretStr] = Field(default_factory=dict)
    current_key: str | None = None
    compression: Literal["none", "zstd", "gzip"] = "none"
    compress_threshold: int = Field(default=1024, ge=0)
    #: Payloads stored by reference (``SAGA_CODEC__BLOBS__THRESHOLD_BYTES``, ...).
    blobs: BlobSettings = BlobSettings()

    @model_validator(mode="after")
    def _current_key_given(self) -> CodecSettings:
        check_current_key(self.keys, self.current_key, "encrypt")
        for key_id, key in self.keys.items():
            try:
                size = len(base64.b64decode(key.get_secret_value(), validate=True))
            except (binascii.Error, ValueError):
                raise ValueError(f"key {key_id!r} is not base64") from None
            if size not in (16, 24, 32):
                raise ValueError(f"key {key_id!r} is {size} bytes; AES-GCM takes 16, 24 or 32")
        return self


class CallbackSettings(BaseModel):
    """Callback URLs (``ctx.callback``, docs/callbacks.md): signed with HMAC-SHA256, so a
    third party completes a saga's wait with no token of its own.

    ``keys``: key id -> a secret of at least 32 characters, e.g.
    ``SAGA_CALLBACKS__KEYS='{"cb-2026": "..."}'``; ``current_key`` names the one new URLs
    are signed with (required when there are several); every key still verifies the URLs
    it signed, so a key is rotated by adding the new one as ``current_key`` and removing
    the old one once its URLs have expired. ``base_url``: where the third party reaches
    the admin API (``https://saga.example.com``); the URL is ``{base_url}/callbacks/{token}``.
    """

    model_config = ConfigDict(frozen=True)

    # Secrets: settings are printed in logs and errors.
    keys: dict[str, SecretStr] = Field(default_factory=dict)
    current_key: str | None = None
    base_url: str = "http://127.0.0.1:8080"

    @model_validator(mode="after")
    def _current_key_given(self) -> CallbackSettings:
        check_current_key(self.keys, self.current_key, "sign")
        for key_id, key in self.keys.items():
            if not key_id or len(key_id) > 64 or not key_id.isprintable():
                raise ValueError(f"key id {key_id!r}: 1 to 64 printable characters")
            if len(key.get_secret_value()) < 32:
                raise ValueError(f"key {key_id!r} is shorter than 32 characters")
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url {self.base_url!r} must start with http:// or https://")
        return self

    @property
    def signing_key(self) -> str | None:
        """The id of the key new URLs are signed with (None: no keys configured)."""
        return self.current_key or next(iter(self.keys), None)


class FlowLimit(BaseModel):
    """One participant's or saga type's limits (``_flow.py``). Each is a whole-cluster
    figure: an engine enforces its partition share of it (docs/architecture.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Commands in flight at once (sent, not yet answered, timed out or ended); or
    #: ``"adaptive"``: found from the latency flow control observes, within
    #: ``min_concurrency`` and ``max_concurrency`` (``core/planning/_adaptive_limit``).
    concurrency: Annotated[int, Field(ge=1)] | Literal["adaptive"] | None = None
    #: An adaptive limit's bounds (cluster-wide, as the others): default 1 and 1000.
    min_concurrency: int | None = Field(default=None, ge=1)
    max_concurrency: int | None = Field(default=None, ge=1)
    #: How an adaptive limit moves (``core/planning/_adaptive_limit``): ``"gradient"``
    #: (the default: in proportion to the latency's rise) or ``"aimd"`` (one more per
    #: round trip while latency holds, a tenth less when it doubles or a reply times out).
    algorithm: Literal["gradient", "aimd"] | None = None
    #: Commands sent per second (a token bucket holding a tenth of a second's worth).
    rate: float | None = Field(default=None, gt=0)
    #: The resources its commands may hold at once, summed over the costs in flight
    #: (``ctx.step(cost=...)``): ``{"cpu": 32, "memory_mb": 8192}``. A command with no
    #: cost (or none of a resource) costs nothing of it.
    budget: dict[str, float] | None = None

    @model_validator(mode="after")
    def _adaptive_bounds(self) -> FlowLimit:
        if self.concurrency != "adaptive":
            if self.min_concurrency is not None or self.max_concurrency is not None:
                raise ValueError(
                    "min_concurrency and max_concurrency bound an adaptive limit: set "
                    'concurrency="adaptive" (or drop them)'
                )
            if self.algorithm is not None:
                raise ValueError(
                    'algorithm chooses how an adaptive limit moves: set concurrency="adaptive" '
                    "(or drop it)"
                )
            return self
        low, high = self.adaptive_bounds
        if low > high:
            raise ValueError(f"min_concurrency ({low}) is above max_concurrency ({high})")
        return self

    @property
    def adaptive_bounds(self) -> tuple[int, int]:
        """An adaptive limit's (min, max), defaults filled in."""
        return self.min_concurrency or 1, self.max_concurrency or 1000

    @field_validator("budget")
    @classmethod
    def _budget_amounts(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if not value:
            return None
        return resource_amounts(value, "budget", positive=True)

    @property
    def limits_anything(self) -> bool:
        return self.concurrency is not None or self.rate is not None or self.budget is not None


class FlowPolicy(BaseModel):
    """One version of flow control's heuristics: the limits per participant and saga
    type, the fairness keys' weights, and whether ``cost="learned"`` prices a step.

    ``LimitsSettings`` is version 1 (its own fields); ``LimitsSettings.policies`` holds
    the others, each rolled out to a share of new sagas like a saga version
    (docs/operations.md, "Trying a flow policy on a share of sagas")."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    participants: dict[str, FlowLimit] = Field(default_factory=dict)
    saga_types: dict[str, FlowLimit] = Field(default_factory=dict)
    #: Each fairness key's weight under contention (``"*"``: every other key, and starts
    #: without one; default 1): ``{"gold": 3, "*": 1}`` gives gold three times the share.
    fairness_weights: dict[str, float] = Field(default_factory=dict)
    #: Whether a step declared ``cost="learned"`` is priced by what it was measured to
    #: cost (False: it costs nothing, as if it declared no cost).
    learned_costs: bool = True

    @field_validator("fairness_weights")
    @classmethod
    def _weights(cls, value: dict[str, float]) -> dict[str, float]:
        for key, weight in value.items():
            if isinstance(weight, bool) or not math.isfinite(weight) or weight <= 0:
                raise ValueError(
                    f"fairness weight of {key!r} must be a finite number above 0, got {weight!r}"
                )
        return value

    def weight_of(self, fairness_key: str) -> float:
        """A fairness key's weight: its own, else ``"*"``'s, else 1."""
        weights = self.fairness_weights
        found = weights.get(fairness_key)
        return found if found is not None else weights.get("*", 1.0)

    @property
    def limits_anything(self) -> bool:
        return any(
            limit.limits_anything
            for limit in (*self.participants.values(), *self.saga_types.values())
        )


#: The versions a flow policy may have (1 is ``LimitsSettings``'s own fields).
POLICY_VERSIONS = range(1, 10_001)


class LimitsSettings(FlowPolicy):
    """Flow control: concurrency and rate limits on the commands the engine sends, per
    participant and per saga type, as flow policy version 1 (``FlowPolicy``'s fields)
    and, in ``policies``, the other versions a rollout may give new sagas. None
    configured (the default): commands go straight to the broker, as if this section did
    not exist."""

    #: A waiting command's priority rises by one for every this many seconds it waits,
    #: so a low priority is served under a constant stream of higher ones. None: no aging
    #: (strict priority; a low priority may then wait for as long as higher ones come).
    aging_s: float | None = Field(default=10.0, gt=0)
    #: Named costs a step may declare by name (``ctx.step(cost="heavy")``):
    #: ``{"heavy": {"cpu": 8, "memory_mb": 2048}}``.
    cost_classes: dict[str, dict[str, float]] = Field(default_factory=dict)
    #: Flow policies by version (2 and up), each a whole ``FlowPolicy`` (nothing is
    #: inherited from version 1): ``SAGA_LIMITS__POLICIES='{"2": {"participants":
    #: {"payments": {"concurrency": "adaptive"}}}}'``. A version takes no saga until a
    #: flow-policy rollout gives it a share (``saga flow-policy rollout``).
    policies: dict[int, FlowPolicy] = Field(default_factory=dict)

    @field_validator("cost_classes")
    @classmethod
    def _class_amounts(cls, value: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        return {
            name: resource_amounts(amounts, f"cost class {name!r}", positive=False)
            for name, amounts in value.items()
        }

    @field_validator("policies")
    @classmethod
    def _policy_versions(cls, value: dict[int, FlowPolicy]) -> dict[int, FlowPolicy]:
        for version in value:
            if version == 1:
                raise ValueError(
                    "flow policy 1 is SAGA_LIMITS__'s own fields (participants, saga_types, "
                    "fairness_weights, learned_costs): number the others from 2"
                )
            if version not in POLICY_VERSIONS:
                raise ValueError(f"a flow policy's version is 2 to 10000, got {version}")
        return dict(sorted(value.items()))

    @field_validator("aging_s", mode="before")
    @classmethod
    def _no_aging(cls, value: Any) -> Any:
        """``SAGA_LIMITS__AGING_S=null`` (or ``off``) turns aging off: the environment has
        no None of its own."""
        if isinstance(value, str) and value.strip().lower() in ("", "null", "none", "off"):
            return None
        return value

    @property
    def versions(self) -> list[int]:
        """The flow policies configured, by version (1 always)."""
        return [1, *self.policies]

    def policy(self, version: int | None) -> FlowPolicy:
        """The policy a saga recorded as on ``version`` (None: 1) runs under: that one, or
        the highest configured below it when it is not configured here (any more)."""
        resolved = self.resolve(version)
        return self if resolved == 1 else self.policies[resolved]

    def resolve(self, version: int | None) -> int:
        """The version ``policy(version)`` is."""
        if version is None or version <= 1:
            return 1
        if version in self.policies:
            return version
        below = [v for v in self.policies if v < version]
        return max(below) if below else 1

    @property
    def enabled(self) -> bool:
        return self.limits_anything or any(p.limits_anything for p in self.policies.values())


class Settings(BaseSettings):
    """Everything an engine needs. Build it once and pass it down."""

    model_config = SettingsConfigDict(
        env_prefix="SAGA_",
        env_nested_delimiter="__",
        frozen=True,
        extra="ignore",
        # Validation errors must not echo values: settings hold tokens and passwords.
        hide_input_in_errors=True,
    )

    pg: PostgresSettings = PostgresSettings()
    kafka: KafkaSettings = KafkaSettings()
    engine: EngineSettings = EngineSettings()
    participant: ParticipantSettings = ParticipantSettings()
    http: HttpSettings = HttpSettings()
    admin: AdminSettings = AdminSettings()
    retention: RetentionSettings = RetentionSettings()
    codec: CodecSettings = CodecSettings()
    callbacks: CallbackSettings = CallbackSettings()
    limits: LimitsSettings = LimitsSettings()
    schedules: ScheduleSettings = ScheduleSettings()
    batches: BatchSettings = BatchSettings()

    @model_validator(mode="after")
    def _shards_make_a_map(self) -> Settings:
        """Shards must name a control database and divide every inbox partition."""
        if self.pg.shards:
            if self.pg.control_dsn is None:
                raise ValueError(
                    "SAGA_PG__SHARDS needs SAGA_PG__CONTROL_DSN: the database of what is "
                    "not per saga (schedules, rollouts, batch operations, the shard map)"
                )
            names = [shard.name for shard in self.pg.shards]
            if len(set(names)) != len(names):
                raise ValueError(f"SAGA_PG__SHARDS names a shard twice: {', '.join(names)}")
            try:
                self.shard_map()
            except ShardMapError as exc:
                raise ValueError(f"SAGA_PG__SHARDS: {exc}") from None
        return self

    def shard_map(self) -> ShardMap | None:
        """The shard map the settings describe (epoch 1), or None for one database.

        The map in force is the control database's (a move bumps its epoch); these
        settings seed it and name the shards' addresses."""
        if not self.pg.shards:
            return None
        return ShardMap.build(
            {shard.name: shard.partitions for shard in self.pg.shards}, self.kafka.partitions
        )

    @model_validator(mode="before")
    @classmethod
    def _participant_dsn_follows_pg(cls, data: Any) -> Any:
        """``participant.dsn`` defaults to ``pg.dsn``: a participant configured with only
        ``SAGA_PG__DSN`` uses that database, not the development default."""
        if not isinstance(data, dict):
            return data
        participant = data.get("participant")
        if isinstance(participant, ParticipantSettings):
            if "dsn" in participant.model_fields_set:
                return data
        elif isinstance(participant, dict) and participant.get("dsn") is not None:
            return data
        pg = data.get("pg")
        dsn = pg.dsn if isinstance(pg, PostgresSettings) else (pg or {}).get("dsn")
        if dsn is None:
            return data  # neither is set: both have the same default
        if isinstance(participant, ParticipantSettings):
            return {
                **data,
                "participant": participant.model_copy(
                    update={
                        "dsn": SecretStr(
                            dsn.get_secret_value() if isinstance(dsn, SecretStr) else str(dsn)
                        )
                    }
                ),
            }
        return {**data, "participant": {**(participant or {}), "dsn": dsn}}
