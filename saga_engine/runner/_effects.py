"""What follows a write, once for every input: the crash points, the sends, and each
saga's bookkeeping (the observer told what happened, flow control's permits, waiters,
the saga armed for its next wake-up or let go).

A command leaves only after the events that decided it are durable (the history is the
outbox). A send that fails does not fail the inputs (they are recorded): the saga is let
go and rebuilt soon, on its own (``reload_soon``, backing off while the broker does not
take it), which sends what it owes again under the same ids; the other sagas of the batch,
and of the inbox, are not held. A send the broker refuses for good (a record too large for
it) is answered as its participant would answer a command it refuses: a ``failure``
reply, applied to the saga after the batch (``take_refused``), so its step fails.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from saga_engine.core.history._decision import OutboundCommand
from saga_engine.core.runtime._runtime import SagaRuntime
from saga_engine.kernel._errors import PermanentError
from saga_engine.runner._cache import LiveSaga
from saga_engine.runner._parts import EngineParts
from saga_engine.runner._path_inputs import Work
from saga_engine.telemetry._spans import SendTime
from saga_engine.transport._bus import PipelinedSender, await_acks

_Sending = tuple[Work, OutboundCommand, bool]

log = logging.getLogger("saga_engine.engine")


class Effects:
    def __init__(self, parts: EngineParts, reload_soon: Callable[[str, float], None]) -> None:
        self._sender = parts.sender
        # Checked once: a runtime protocol check costs microseconds on every command.
        self._pipelined = parts.sender if isinstance(parts.sender, PipelinedSender) else None
        self._live = parts.live
        self._flow = parts.flow
        self._observer = parts.observer
        self._waiters = parts.waiters
        self._crash_hook = parts.crash_hook
        self._reload_soon = reload_soon
        self._matcher = parts.matcher
        #: Commands the broker refused for good, and why, to be answered as refused.
        self._refused: list[tuple[OutboundCommand, Exception]] = []

    async def apply(self, works: list[Work]) -> None:
        """Sends what ``works`` decided and owe, then settles each of them."""
        if self._crash_hook is not None:
            self._before_send(works)
        sending: list[_Sending] = []
        for work in works:
            if work.to_resend:
                work.resent = work.to_resend_now()
                sending += [(work, command, True) for command in work.resent]
            for command in work.commands:
                sending.append((work, command, False))
        # Asked once per batch, not per saga of it: with nothing recording (no SDK) no
        # span opens, so the observer is told no send time (bench.instructions).
        at = SendTime.now() if sending and self._observer.telemetry.records else None
        if self._pipelined is not None:
            await self._send_pipelined(sending)
        else:
            await self._send_one_by_one(sending)
        self._observer.applied(works, at)
        for work in works:
            self._settle(work)

    async def drive(self, work: Work, live: LiveSaga) -> None:
        """Sends what ``live`` owes (this engine drives it from now on); a failed send
        is re-sent by a reload, as ``work``'s own would be."""
        resending = Work(work.saga_id, live=live)
        resending.resend_owed(live)
        await self.apply([resending])

    def take_refused(self) -> list[tuple[OutboundCommand, Exception]]:
        """The commands refused for good since the last call (see the module's doc)."""
        refused, self._refused = self._refused, []
        return refused

    def fail(self, work: Work, error: Exception) -> None:
        """The saga is let go, its inputs answered with ``error``."""
        self.forget(work)
        work.fail_inputs(error)

    def forget(self, work: Work) -> None:
        """Lets go of the saga's copy: it may be ahead of the store."""
        created = work.created is not None and work.live is not None
        if created and self._live.get(work.saga_id) is not work.live:
            assert work.live is not None
            work.live.runtime.close()  # never held: nothing else refers to it
            return
        self._live.evict(work.saga_id)

    # ------------------------------------------------------------------ sends

    async def _send_pipelined(self, sending: list[_Sending]) -> None:
        assert self._pipelined is not None
        handed: list[tuple[_Sending, Awaitable[None]]] = []
        for one in sending:
            if one[0].send_error is None:
                try:
                    handed.append((one, await self._pipelined.start_command(one[1])))
                except Exception as exc:
                    self._not_sent(one, exc)
        errors = await await_acks([ack for _, ack in handed])
        for (one, _), error in zip(handed, errors, strict=True):
            if error is not None:
                # await_acks() gives a TransientError for every acknowledgement not given.
                assert isinstance(error, Exception)
                self._not_sent(one, error)
            elif not one[2] and self._crash_hook is not None:
                self._crash("after_send")  # a crash point of the commands decided now

    async def _send_one_by_one(self, sending: list[_Sending]) -> None:
        for one in sending:
            if one[0].send_error is None:
                try:
                    await self._sender.send_command(one[1])
                except Exception as exc:
                    self._not_sent(one, exc)
                else:
                    if not one[2] and self._crash_hook is not None:
                        self._crash("after_send")  # of the commands decided now

    def _not_sent(self, one: _Sending, error: Exception) -> None:
        work, command, _ = one
        if isinstance(error, PermanentError):
            self._refused.append((command, error))  # answered as refused, after the batch
            return
        # The command is recorded: the saga is rebuilt soon and sends it again.
        if work.send_error is None:
            work.send_error = error

    # ------------------------------------------------------------------ bookkeeping

    def _settle(self, work: Work) -> None:
        live, last = work.live, work.last
        assert live is not None
        if work.send_error is not None:
            # Its inputs are recorded: they are not failed (the inbox would apply them
            # again, holding every other saga's records meanwhile). The copy is let go
            # and rebuilt from history soon, which re-sends what it owes, backing off
            # while the broker does not take it.
            log.warning("saga %s: %s; sending it again shortly", work.saga_id, work.send_error)
            self.forget(work)
            self._reload_soon(work.saga_id, 0.5)
            return
        _warn_long_run(work.saga_id, live.runtime, len(work.events))
        if self._flow is not None:
            # Permits of attempts now over (an adaptive limit learns how they ended).
            self._flow.settle(work.saga_id, live.runtime, work.events)
        if last is not None and (last.status.is_terminal or last.status.is_parked):
            self._waiters.notify(work.saga_id)
        if last is not None and last.status.is_terminal:
            self._live.evict(work.saga_id)
        elif last is not None or work.fresh_copy or work.rearm:
            self._live.arm(work.saga_id, live)
            # Committed: a saga that waits for a domain event is owed the facts kept.
            if self._matcher is not None and live.runtime.state.event_waits:
                self._matcher.wait_committed(work.saga_id)

    def _before_send(self, works: list[Work]) -> None:
        """Crash points for fault-injection tests: the events are durable, the commands
        not yet sent."""
        with_commands = 0
        for work in works:
            if work.events:
                self._crash("after_append")
                if work.commands:
                    with_commands += 1
                    self._crash("before_send")
                    if any(c.compensation for c in work.commands):
                        self._crash("before_send_compensation")
        if with_commands > 1:
            self._crash("after_batch_append")

    def _crash(self, point: str) -> None:
        if self._crash_hook is not None:
            self._crash_hook(point)


def _warn_long_run(saga_id: str, runtime: SagaRuntime, added: int) -> None:
    """Warns once, as a run's history passes the bound (``engine.continue_as_new_after``)
    without the saga continuing as new: its memory and replay time grow with it. The
    saga's admin view and page say so too (``history_warning``)."""
    bound = runtime.limit.run_events if runtime.limit is not None else None
    if bound is None or not added:
        return
    events = runtime.run_events
    if events - added < bound <= events and events > added:
        log.warning(
            "saga %s (%s): run %d has %d events, past engine.continue_as_new_after=%d: its "
            "memory and replay time grow with it; have its code call ctx.continue_as_new "
            "when ctx.should_continue_as_new() (docs/continue-as-new.md)",
            saga_id,
            runtime.saga_type,
            runtime.run,
            events,
            bound,
        )
