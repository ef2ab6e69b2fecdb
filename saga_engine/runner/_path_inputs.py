"""What the engine's path takes (the inputs), gives back (their outcomes), and keeps for
each saga of a batch while it goes through (``Work``)."""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from saga_engine.core.history._decision import Decision, DropReason, Inbound, OutboundCommand
from saga_engine.core.history._events import Event, InvalidReplyReceived
from saga_engine.core.runtime._start import PreparedStart
from saga_engine.runner._cache import LiveSaga

#: A start decided under the saga's lock: None when there is nothing to start after all
#: (a child's start checks its parent's history first).
StartGuard = Callable[[], Awaitable[PreparedStart | None]]


@dataclass(frozen=True, slots=True)
class Start:
    """Starts a saga (a repeat of the same start is deduplicated)."""

    saga_id: str
    start: PreparedStart | StartGuard


@dataclass(frozen=True, slots=True)
class Deliver:
    """Anything a saga handles: a reply, a signal, a cancel, an operator's action, an
    undo from its parent."""

    saga_id: str
    inbound: Inbound


@dataclass(frozen=True, slots=True)
class FireTimers:
    """The saga's due timers, from the copy held in memory (none: nothing fires)."""

    saga_id: str


class LoadMode(enum.Enum):
    #: Recovery: unless held already.
    RECOVER = "recover"
    #: A wake-up due from the store: unless held already, or not this engine's.
    WAKE_UP_DUE = "wake_up_due"
    #: Rebuilt from history in place of the copy held (another engine changed it).
    RELOAD = "reload"


@dataclass(frozen=True, slots=True)
class Load:
    """No input: the saga loaded from history, and what it owes sent again."""

    saga_id: str
    mode: LoadMode


Input = Start | Deliver | FireTimers | Load


@dataclass(slots=True)
class InputOutcome:
    """What an input came to: the decision it led to, or the error that stopped it."""

    decision: Decision | None = None
    error: Exception | None = None

    def result(self) -> Decision | None:
        if self.error is not None:
            raise self.error
        return self.decision


@dataclass(slots=True, eq=False)
class Work:
    """One saga of a batch: its inputs, and what a pass of the path made of them."""

    saga_id: str
    items: list[tuple[Input, InputOutcome]] = field(default_factory=list)
    #: The first input a pass decides (those before it are settled already).
    first: int = 0
    #: Decide again next pass: rebuilt from history (``rebuild``), or after a start
    #: that found its saga stored already.
    again: bool = False
    rebuild: bool = False
    #: Its writes that conflicted with another engine's, so far; the passes it went through.
    conflicts: int = 0
    passes: int = 0
    #: Wrote events in some pass: if it is let go, its owner is told to reload it.
    changed: bool = False
    #: Let go once done if it ended, or is not this engine's (a reload, a wake-up).
    release_ended: bool = False
    # ---- one pass
    live: LiveSaga | None = None
    #: The start that created it in this pass (its input's index).
    created: tuple[int, PreparedStart] | None = None
    #: Loaded from history in this pass; its replay's decision.
    fresh_copy: bool = False
    replayed: Decision | None = None
    #: Rebuilt over a stale copy: the commands in flight then (their spans go on).
    rebuilt: frozenset[str] | None = None
    #: What it owed when loaded to be driven (or resumed from a park): sent again.
    to_resend: Sequence[OutboundCommand] = ()
    #: Its timers were looked at: armed again for the next one.
    rearm: bool = False
    #: The events decided; for each ``invalid_reply_received`` among them, in order, the
    #: steps holding an invalid reply once its decision was taken (the observer counts
    #: a park once).
    events: list[Event] = field(default_factory=list)
    held: list[int] = field(default_factory=list)
    commands: list[OutboundCommand] = field(default_factory=list)
    last: Decision | None = None
    dropped: Sequence[DropReason] = ()
    deduplicated: int = 0
    conflict: Exception | None = None
    failure: Exception | None = None
    #: What of ``to_resend`` was sent again (the decided ``commands`` are sent too).
    resent: Sequence[OutboundCommand] = ()
    send_error: Exception | None = None

    def begin(self, held: LiveSaga | None) -> bool:
        """Starts a pass from the copy ``held``; True when it must be rebuilt first."""
        self.live = held
        if not self.passes:  # the first: nothing to forget (the common case, kept cheap)
            self.passes = 1
            return False
        self.passes += 1
        rebuild = self.rebuild
        self.again = self.rebuild = False
        self.conflict = self.failure = self.send_error = None
        self.restart()
        return rebuild

    def restart(self) -> None:
        """Forgets what this pass decided (its inputs are decided again)."""
        self.created = self.replayed = self.last = None
        self.fresh_copy = self.rearm = False
        self.rebuilt = None
        self.events, self.held, self.commands = [], [], []
        self.dropped = self.to_resend = self.resent = ()
        self.deduplicated = 0
        for _, outcome in self.items[self.first :]:
            outcome.decision = outcome.error = None

    def loaded(self, live: LiveSaga, replayed: Decision) -> None:
        self.live = live
        self.fresh_copy = True
        self.replayed = replayed
        if replayed.events:
            self.take(replayed)
        if live.driven:
            self.resend_owed(live)

    def resend_owed(self, live: LiveSaga) -> None:
        """What ``live`` owes now (its commands in flight, its answers to its parent) is
        sent again under the same ids: whoever had sent it may have died since."""
        if not live.runtime.dead:
            self.to_resend = live.runtime.messages_to_resend()

    def take(self, decision: Decision) -> None:
        if decision.dropped is not None:
            self.dropped = [*self.dropped, decision.dropped]
            return
        assert self.live is not None
        # As each decision was taken: a second reply held while one already is adds no
        # park (the observer counts a park once). Asked only of a decision that holds a
        # reply: ``held_steps`` sorts a set of the steps in flight; asked of every
        # decision it was 35 k instructions per saga (bench.instructions' engine_path).
        events = decision.events
        if events:
            self.events += events
            for event in events:
                if type(event) is InvalidReplyReceived:  # (isinstance: a slow path)
                    self.held.append(len(self.live.runtime.held_steps()))
        self.commands += decision.commands
        self.last = decision

    def written(self, committed_seq: int) -> None:
        assert self.live is not None
        self.live.committed_seq = committed_seq
        self.changed = True

    def decide_after(self, index: int) -> None:
        """The inputs up to ``index`` are settled; any after it go through again."""
        self.live = None
        self.created = None
        self.first = index + 1
        self.again = self.first < len(self.items)

    @property
    def settles(self) -> bool:
        """Its pass went through: sends, bookkeeping."""
        return (
            self.live is not None
            and self.conflict is None
            and self.failure is None
            and not self.again
        )

    def to_resend_now(self) -> list[OutboundCommand]:
        """What it owed from history and is sent again (not decided anew in this pass)."""
        if not self.to_resend:
            return []
        new = {(c.command_id, c.attempt) for c in self.commands}
        return [c for c in self.to_resend if (c.command_id, c.attempt) not in new]

    def fail_inputs(self, error: Exception) -> None:
        """Its inputs not answered otherwise answer with ``error``."""
        self.failure = error
        for _, outcome in self.items[self.first :]:
            if outcome.error is None:
                outcome.decision = None
                outcome.error = error
