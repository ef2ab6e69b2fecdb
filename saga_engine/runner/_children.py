"""Child sagas, the engine's side: starting a child, undoing one, and a child's end
travelling back to its parent.

A ``ctx.child`` step is a step whose participant is the engine (``saga.child``): its
command starts the child, its compensation undoes it, and the child's end is its reply.
The runtime records them like any step; here they are carried out. Through Kafka
(the worker routes ``saga.start`` with a parent and ``saga.undo`` from the inbox here, and
``_kafka.py`` sends them to the inbox keyed by the child's or the parent's id), so parent
and child may be owned by different engines; in one process (the testing kit), through
:meth:`ChildLinks.deliver_locally`. Each goes through the engine's one path: a child's
start is a start checked against its parent's history under the child's lock.

Every message here may come twice (a re-send after a timeout, a recovery, a poll) and is
idempotent: a child's id and its parent's command ids are deterministic, a repeated start
of an ended child is answered with its end again, and a parent drops a second reply to
the same command. Every one of them is owed from history until answered (see
``SagaRuntime.messages_to_resend``): the parent's start and undo are its commands, re-sent at each poll
and by whoever loads the parent; the child's end is re-sent by whoever loads the child,
and a repeated start or undo is answered again. Each is checked against the link the
child's first event records (``NotParent``).
"""

from __future__ import annotations

import logging

from saga_engine.core.history._decision import (
    CHILD_PARTICIPANT,
    PARENT_PARTICIPANT,
    ChildStart,
    ChildUndo,
    DropReason,
    OutboundCommand,
    Undo,
    parent_reply,
    undo_refused,
)
from saga_engine.core.history._events import CommandIssued, Event, ParentLink
from saga_engine.core.runtime._inputs import check_parent
from saga_engine.core.runtime._runtime import SagaRuntime
from saga_engine.core.runtime._start import PreparedStart, StartRequest
from saga_engine.core.views._view import saga_view_of
from saga_engine.kernel._errors import (
    InvalidPayload,
    NotParent,
    PayloadTooLarge,
    SagaNotFound,
    TransientError,
)
from saga_engine.runner._engine import Engine
from saga_engine.runner._parts import EngineParts
from saga_engine.runner._path_inputs import Start
from saga_engine.transport._child_wire import parent_of

log = logging.getLogger("saga_engine.children")


class ChildLinks:
    """What one engine does for child sagas: start, undo, and answer parents. Built by
    the composition root beside the engine, from the same collaborators."""

    def __init__(self, engine: Engine, parts: EngineParts) -> None:
        self._engine = engine
        self._store = parts.store
        self._registry = parts.registry
        self._sender = parts.sender
        self._clock = parts.clock
        self._stats = parts.stats

    async def start_child(self, request: StartRequest) -> None:
        """Starts the child ``request`` asks for (once: its id is deterministic; its
        ``parent`` is set). A repeated start of a child
        that exists is answered by the child itself (its end, or nothing while it runs),
        never checked again against what its type's rollout says today. A child input
        the engine can never start (one its model refuses, one over the size limit)
        fails its parent's step at once, like a refused command. Anything else that
        stops the start here (a type or version this engine does not run yet, during a
        rolling deploy; a history it cannot decode) raises to the caller, which
        dead-letters the request: the parent keeps waiting and asks again every poll,
        until an engine that can start it does."""
        parent, saga_id = request.parent, request.saga_id
        assert parent is not None
        assert saga_id is not None
        withdrawn = False

        async def prepare() -> PreparedStart | None:
            # Under the child's lock, as an undo of it is: an undo that overtook this
            # start is either applied to the child created here, or (the child not
            # created yet) answered "nothing to undo" after the parent recorded it,
            # which this start then reads in the parent's history and does not create
            # the child.
            nonlocal withdrawn
            if await self._exists(saga_id, parent.saga_id):
                self._stats.inc("child_start_repeated")
                return None
            if not await self._asked(saga_id, parent):
                self._stats.inc("child_start_withdrawn")
                log.info("start of child %s withdrawn by its parent %s", saga_id, parent.saga_id)
                withdrawn = True
                return None
            return self._engine.prepare(request)

        (outcome,) = await self._engine.apply([Start(saga_id, prepare)])
        if isinstance(outcome.error, InvalidPayload | PayloadTooLarge):
            # Nothing was started: the parent's step is refused, with the reason.
            log.warning(
                "child saga %s of %s cannot start: %s", saga_id, parent.saga_id, outcome.error
            )
            self._stats.inc("child_start_refused")
            await self._send(
                parent_reply(parent, saga_id, "failure", {"child_id": saga_id}, f"{outcome.error}")
            )
            return
        outcome.result()
        if not withdrawn:
            await self.answer_again(saga_id)

    async def _asked(self, saga_id: str, parent: ParentLink) -> bool:
        """Whether the parent's history still asks for this child (raises NotParent when
        it never did): a start that arrives after the parent withdrew it (its undo
        issued, the step skipped, or the parent ended) starts nothing, or the child would
        run on with nobody left to undo it. A late copy that arrives between two attempts
        starts nothing either; the next attempt's start does."""
        try:
            events = await self._history(parent.saga_id)
        except SagaNotFound:
            raise NotParent(
                saga_id,
                parent.saga_id,
                None,
                f"no saga {parent.saga_id!r} exists to start child {saga_id}",
            ) from None
        # The one fold of a history (the view's): the start is asked for while its command
        # is in flight, not once it was answered, skipped, compensated or the parent ended.
        asked = parent.command_id
        if any(f.command_id == asked for f in saga_view_of(events).in_flight if not f.compensation):
            return True
        if not any(isinstance(e, CommandIssued) and e.command_id == asked for e in events):
            raise NotParent(
                saga_id,
                parent.saga_id,
                None,
                f"saga {parent.saga_id} never asked for child "
                f"{saga_id} (no command {asked!r} in its history)",
            )
        return False

    async def _exists(self, saga_id: str, parent_id: str) -> bool:
        """Whether the child was started already, by this parent (raises NotParent when
        its recorded link names another saga)."""
        runtime = self._engine.runtime_of(saga_id)
        if runtime is not None:
            started: Event = runtime.started
        else:
            try:
                started = (await self._store.first_event(saga_id)).event
            except SagaNotFound:
                return False
        check_parent(saga_id, started, parent_id)
        return True

    async def _history(self, saga_id: str) -> list[Event]:
        loaded = await self._store.load_run(saga_id)
        return [stored.event for stored in loaded.events]

    async def undo_child(self, saga_id: str, command_id: str, parent_id: str, reason: str) -> None:
        """The parent compensates: the child undoes what it did (see ``UndoRequested``).
        A child that never started has nothing to undo, and says so at once; one that
        ended before the undo came answers it under the undo's id (``parent_notices``)."""
        try:
            decision = await self._engine.deliver(
                saga_id, Undo(command_id, parent_id, self._clock.now(), reason)
            )
        except SagaNotFound:
            parent = ParentLink(saga_id=parent_id, command_id=command_id)
            await self._send(parent_reply(parent, saga_id, "success", {"child_id": saga_id}, None))
            return
        if decision.dropped is DropReason.UNDO_ANSWERED:
            await self.answer_again(saga_id, undo=command_id)
        elif decision.dropped is DropReason.UNDO_PAST_PIVOT:
            await self._send(undo_refused(saga_id, parent_id, command_id))

    async def answer_again(self, saga_id: str, *, undo: str | None = None) -> None:
        """Sends an ended child's answers to its parent again (nothing while it runs),
        and the answer to ``undo`` when it asked after the child had ended."""
        record = await self._store.get(saga_id)
        if not record.status.is_terminal:
            return
        live = self._engine.runtime_of(saga_id)
        if live is not None:
            notices = live.parent_notices(undo)
        else:
            events = await self._history(saga_id)
            definition = self._registry.for_history(record.saga_type, events)
            runtime, _ = SagaRuntime.replay(definition, saga_id, events)
            try:
                notices = runtime.parent_notices(undo)
            finally:
                runtime.close()
        for notice in notices:
            await self._send(notice)

    async def deliver_locally(self, command: OutboundCommand) -> bool:
        """Carries out a child's command or a parent's answer in this process (the
        testing kit's bus). False for a participant's command."""
        if command.participant == PARENT_PARTICIPANT:
            body = command.payload
            await self._engine.reply(
                command.saga_id,
                command.command_id,
                body["outcome"],
                body.get("payload") or {},
                body.get("error"),
                sender=str(body.get("child", "")),
            )
            return True
        if command.participant != CHILD_PARTICIPANT:
            return False
        if command.compensation:
            undo = ChildUndo.model_validate(command.payload)
            await self.undo_child(undo.saga_id, command.command_id, command.saga_id, "")
        else:
            start = ChildStart.model_validate(command.payload)
            await self.start_child(
                StartRequest(
                    start.saga_type,
                    start.input,
                    start.saga_id,
                    parent=parent_of(command),
                    trace_context=command.trace_context,
                    priority=start.priority,
                    fairness_key=start.fairness_key,
                    flow_policy=start.flow_policy,
                )
            )
        return True

    async def _send(self, notice: OutboundCommand) -> None:
        try:
            await self._sender.send_command(notice)
        except TransientError:
            # The parent asks again (its poll, or its recovery): the answer is not lost.
            log.warning("could not answer parent saga %s yet", notice.saga_id)
            raise
