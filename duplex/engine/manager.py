"""``SessionManager``: admission, budgets, leases, the reaper, resume and the close pipeline.

Theory of operation
-------------------
The manager holds one ``SessionRecord`` per session that still holds an admission
slot (open, attached, detached or closing). It

* **admits** (``reserve``, then ``open``): past ``min(max_sessions, capabilities.max_sessions)``
  refuses with ``resource_exhausted`` (retryable), or, for a caller that asked to wait, queues
  the open in the waiting room (``duplex.engine.admission``) until a slot frees; a closing
  session keeps its slot until its cleanup finished (``release_slot`` then
  ``SessionRecord.finish``), and a freed slot goes to the head of the queue at once;
* **opens the plugin's slot** when the session asks (``open_slot``, ``restart_slot``: the session's
  ``OpenSlot`` / ``RestartSlot``, ahead of its first input once its settings are quiet, and at that
  input at the latest), not at ``open``: a session holds its admission slot from ``open`` on;
* **checks budgets before the mailbox** (``SessionRecord.submit``): encoded input
  bytes and pending turns not yet processed; over budget the command is refused
  with ``input_backpressure`` and nothing is applied;
* **reaps** (``reap(now)``, every ``reaper_interval_s``): expired leases are closed
  with ``session.expired`` (``idle_ttl_expired``, ``disconnect_grace_expired``);
* **resumes** (``resume``): token, journal continuity, then compare-and-swap on the
  lease generation; the old attachment gets ``session.replaced``. The token rotates, and the
  one presented stays valid until the client speaks on the new attachment (any command or
  ack) or the next resume, so a ``session.resumed`` lost with its socket does not lock the
  client out (``ResumeCredential``);
* **closes** (``close``): the lease enters CLOSING at once (commands are refused from
  then on), the runner processes everything queued before the close item, emits the
  last event and cleans up; ``shutdown`` does this for every session.

All of it runs on the engine's event loop; the clock is injected (``clock``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import operator
from collections.abc import Callable, Sequence
from typing import Any

from duplex.engine.admission import Admission, QueueListener, WaitingRoom
from duplex.engine.attachment import Attachment
from duplex.engine.batch_driver import BatchDriver
from duplex.engine.batch_stream import BatchStream
from duplex.engine.config import EngineConfig
from duplex.engine.credentials import ResumeCredential
from duplex.engine.drivers import Driver
from duplex.engine.errors import Detached, SessionError
from duplex.engine.feed import SlotFeed
from duplex.engine.ids import SessionIds
from duplex.engine.input import InputPipeline
from duplex.engine.journal import JournalCursorError, JournalGap
from duplex.engine.lease import Lease
from duplex.engine.mailbox import Mailbox, MailboxFull
from duplex.engine.memory import MemoryBudget, default_limit_bytes
from duplex.engine.metrics import EngineMetrics
from duplex.engine.model_thread import ModelThread
from duplex.engine.runner import AckItem, CloseItem, CommandItem, FailItem, SessionRunner
from duplex.engine.scheduler import SlotBinding
from duplex.engine.session import Session
from duplex.engine.settings import SessionSettings
from duplex.engine.transitions import LIVE_STATES
from duplex.engine.vad import VadUnavailableError
from duplex.plugins.base import Capabilities, Plugin, PluginError, SlotOptions
from duplex.protocol.errors import ProtocolError
from duplex.protocol.ext.commands import SessionEventAck, SessionResume
from duplex.protocol.ext.dialect import Dialect
from duplex.protocol.ext.events import SessionReplaced, SessionResumed, SessionResyncRequired
from duplex.protocol.ids import new_event_id
from duplex.protocol.realtime.commands import (
    ConversationItemCreate,
    InputAudioBufferAppend,
    InputAudioBufferCommit,
    ResponseCreate,
    SessionUpdate,
)
from duplex.protocol.wire import Event

__all__ = ["SessionManager", "SessionRecord"]

log = logging.getLogger(__name__)

_EPOCH = operator.attrgetter("epoch")


class SessionRecord:
    """Everything the manager keeps for one session; the session itself is the runner's."""

    def __init__(
        self,
        manager: SessionManager,
        session: Session,
        lease: Lease,
        credential: ResumeCredential | None,
        slot: int,
    ) -> None:
        self.manager = manager
        self.session_id = session.session_id
        self.session = session
        self.lease = lease
        self.credential = credential
        self.slot = slot
        self.mailbox = Mailbox(manager.config.mailbox_max)
        caps = manager.capabilities
        self.pipeline = InputPipeline(caps.input_sample_rate, int16=caps.input_dtype == "int16")
        self.feed: SlotFeed | None = None  # set while the plugin's slot is open, for a model that hears
        self.binding: SlotBinding | None = None  # how the driver reaches the session (``_binding``)
        self.slot_open = False  # the plugin's slot is open (``SessionManager.open_slot``)
        self.attachment: Attachment | None = None
        self.runner = SessionRunner(self, manager)
        self.task: asyncio.Task[None] | None = None
        self.opened_at = manager.now()  # for the waiting room's estimate (``forget``)
        self.pending_bytes = 0
        self.pending_turns = 0
        self._ack_seq: int | None = None
        self.finished = asyncio.Event()

    # ------------------------------------------------------------------ transport side

    def submit(self, att: Attachment, command: Any) -> None:
        """Budgets before the mailbox; raises ``SessionError`` with nothing applied.

        ``att`` checked that it has not ended (``Attachment.submit``)."""
        # ``lease.live`` without the property call: this runs once per frame.
        if att is not self.attachment or self.lease.state not in LIVE_STATES:
            raise SessionError(
                "session_closed", f"session {self.session_id} is not attached to this transport"
            )
        credential = self.credential
        if credential is not None and credential.unconfirmed:
            credential.confirm()  # the client read session.resumed: the old token retires
        if isinstance(command, InputAudioBufferAppend):  # the per-frame command first
            n_bytes, turns = len(command.audio), 0
        elif isinstance(command, SessionResume):
            raise SessionError(
                "unsupported_session_resume", "session.resume must be the first message of a new connection"
            )
        elif isinstance(command, SessionEventAck):
            self.ack(att, command.server_event_seq)
            return
        else:
            n_bytes = 0
            turns = 1 if isinstance(command, InputAudioBufferCommit | ResponseCreate) else 0
            memory = self.manager.memory
            if isinstance(command, ConversationItemCreate | ResponseCreate) and memory.exceeded():
                raise SessionError("input_backpressure", memory.describe())
        config = self.manager.config
        if n_bytes > config.max_command_audio_bytes:
            raise SessionError(
                "input_backpressure", f"one append may carry at most {config.max_command_audio_bytes} bytes"
            )
        if self.pending_bytes + n_bytes > config.max_pending_input_bytes or (
            turns and self.pending_turns + turns > config.max_pending_turns
        ):
            self.manager.metrics.backpressure_refused.inc()
            raise SessionError(
                "input_backpressure",
                f"session {self.session_id} has {self.pending_bytes} input bytes and "
                f"{self.pending_turns} turns pending (limits {config.max_pending_input_bytes}, "
                f"{config.max_pending_turns})",
            )
        now = self.manager.now()
        lease = self.lease
        if now > lease.last_activity and lease.state in LIVE_STATES:  # ``lease.touch(now)``, no call
            lease.last_activity = now
        try:
            if self.runner.offer(CommandItem(command, now, n_bytes, turns)):
                return  # handled at once: it never waited, so it took no budget
        except MailboxFull as exc:
            self.manager.metrics.backpressure_refused.inc()
            raise SessionError("input_backpressure", str(exc)) from None
        self.pending_bytes += n_bytes
        self.pending_turns += turns

    def release(self, n_bytes: int, turns: int) -> None:
        """The runner processed a command: give its budget back."""
        self.pending_bytes -= n_bytes
        self.pending_turns -= turns

    def ack(self, att: Attachment, seq: int) -> None:
        """Coalesced: at most one ack item waits in the mailbox, carrying the highest seq."""
        if att is not self.attachment or not self.lease.live:
            return
        if self.credential is not None:
            self.credential.confirm()
        queued = self._ack_seq is not None
        self._ack_seq = seq if self._ack_seq is None else max(self._ack_seq, seq)
        if not queued:
            self.runner.offer(AckItem())

    def take_ack(self) -> SessionEventAck:
        seq, self._ack_seq = self._ack_seq, None
        return SessionEventAck(server_event_seq=seq if seq is not None else 0)

    def detach(self, att: Attachment) -> None:
        self.manager.detach(self, att)

    # ------------------------------------------------------------------ runner side

    def emit(self, events: list[Any]) -> None:
        att = self.attachment
        if att is not None:
            att.push(events)

    def begin_close(self, reason: str, *, expired: bool) -> None:
        if self.lease.live:
            self.lease.begin_close(reason, expired=expired)

    def finish(self) -> None:
        """Cleanup done: end the attachment, free the admission slot and the session's memory.

        The attachment keeps the events still queued for its reader (``session.closed`` last);
        everything else the session held is released here, not at the collector's next full
        pass: the session's journal, conversation and buffers, the mailbox, and the references
        that tie the record, its runner and its mailbox into a cycle.
        """
        state = self.lease.finish()
        att, self.attachment = self.attachment, None
        if att is not None:
            att.end(state.value)
        self.manager.forget(self)
        self.session.discard()
        self.mailbox.close()
        self.feed = None
        self.binding = None
        self.finished.set()


class SessionManager:
    """See the module docstring."""

    def __init__(
        self,
        plugin: Plugin,
        capabilities: Capabilities,
        config: EngineConfig,
        metrics: EngineMetrics,
        *,
        model_name: str,
        clock: Callable[[], float],
        model_thread: ModelThread,
        workers: concurrent.futures.Executor,
        driver: Driver,
        ids: SessionIds | None = None,
    ) -> None:
        self.plugin = plugin
        self.ids = ids or SessionIds()  # session ids and resume tokens (``duplex.engine.ids``)
        self.capabilities = capabilities
        self.config = config
        self.metrics = metrics
        self.model_name = model_name
        self.now = clock
        self.model_thread = model_thread
        self.workers = workers
        self.driver = driver
        self.limit = min(config.max_sessions, capabilities.max_sessions)
        budget = config.memory_budget_bytes
        self.memory = MemoryBudget(default_limit_bytes() if budget is None else budget)
        self.records: dict[str, SessionRecord] = {}
        self.streams: dict[int, BatchStream] = {}  # slot -> a stream holding it (``open_stream``)
        self._free_slots = list(range(capabilities.max_sessions - 1, -1, -1))
        self._reserved = 0  # slots taken by admissions that hold no session yet
        self.room = WaitingRoom(
            max_length=config.max_queue_length,
            max_wait_s=config.max_queue_wait_s,
            assumed_session_s=config.queue_assumed_session_s,
            duration_samples=config.queue_duration_samples,
            limit=self.limit,
            metrics=metrics,
            clock=clock,
            give_back=self._return_slot,
        )
        self._spawn: Callable[[SessionRecord], asyncio.Task[None]] | None = None
        #: Set while the model is unavailable (``model_lost``): opens are refused meanwhile.
        self.model_error: PluginError | None = None

    def bind_spawner(self, spawn: Callable[[SessionRecord], asyncio.Task[None]]) -> None:
        """How runner tasks are started (the engine's task group owns them)."""
        self._spawn = spawn

    async def on_model_thread(self, fn: Any, *args: Any) -> Any:
        return await self.model_thread.call(fn, *args)

    async def offload(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.workers, fn, *args)

    @property
    def open_count(self) -> int:
        return len(self.records) + len(self.streams) + self._reserved

    # ------------------------------------------------------------------ admission

    def _has_room(self) -> bool:
        return self.open_count < self.limit and bool(self._free_slots)

    def _check_admissible(self) -> None:
        if self.model_error is not None:
            self._refuse_unavailable()
        if self.memory.exceeded():
            self.metrics.admission_refused.inc()
            raise SessionError("resource_exhausted", self.memory.describe())

    async def reserve(self, listener: QueueListener | None = None) -> Admission:
        """A slot for a session about to open (``open(admission=...)``; ``release`` if it never does).

        With every slot taken: ``listener`` None (or no waiting room) refuses at once; otherwise the
        open waits in the queue, ``listener`` hearing its ``QueueStatus``, until a slot is handed to
        it. Raises ``SessionError("resource_exhausted")``: no slot, the queue full or waited out, the
        model unavailable, the memory budget exceeded. Cancel-safe: a cancelled wait leaves the queue.
        """
        self._check_admissible()
        if self._has_room() and not self.room.waiting:
            return Admission(self._take_slot())
        if listener is None or not self.room.enabled:
            self.metrics.admission_refused.inc()
            raise SessionError("resource_exhausted", f"duplex_session_capacity_exhausted: limit={self.limit}")
        try:
            admission = await self.room.wait(listener)  # its slot was taken for it (``_offer_slots``)
        except SessionError:
            self.metrics.admission_refused.inc()
            raise
        try:
            self._check_admissible()
        except SessionError:
            self.release(admission)
            raise
        return admission

    def release(self, admission: Admission) -> None:
        """Give back an admission's slot unless a session holds it. Idempotent."""
        if not admission.used:
            admission.used = True
            self._return_slot(admission.slot)

    def _take_slot(self) -> int:
        self._reserved += 1
        return self._free_slots.pop()

    def _return_slot(self, slot: int) -> None:
        """A reserved slot that no session took: free again, and offered to the queue."""
        self._reserved -= 1
        self._free_slots.append(slot)
        self._offer_slots()

    def _offer_slots(self) -> None:
        """Hand free slots to the waiters, head first, while there is room."""
        room = self.room
        while room.waiting and self._has_room():
            slot = self._take_slot()
            if not room.hand(slot):
                self._reserved -= 1
                self._free_slots.append(slot)
                return

    # ------------------------------------------------------------------ open

    async def open(
        self,
        update: SessionUpdate | None,
        *,
        api_key_id: bytes | None = None,
        paced: bool = True,
        admission: Admission | None = None,
        resumable: bool = True,
        dialect: Dialect = Dialect.GA,
        notices: Sequence[Event] = (),
    ) -> Attachment:
        """Admit (or use ``admission``), open the plugin slot, start the runner; returns the first
        attachment. ``api_key_id``: the opening key's digest; a resume must present the same
        (``resume``). ``paced`` / ``resumable`` / ``dialect`` / ``notices``: see ``Engine.open``. On
        failure the admission is released."""
        if admission is None:
            admission = await self.reserve(None)
        elif admission.used:
            raise SessionError("engine_error", "this admission was already used or released")
        try:
            return await self._open(
                admission,
                update,
                api_key_id,
                paced=paced,
                resumable=resumable,
                dialect=dialect,
                notices=notices,
            )
        except BaseException:
            self.release(admission)
            raise

    async def _open(
        self,
        admission: Admission,
        update: SessionUpdate | None,
        api_key_id: bytes | None,
        *,
        paced: bool,
        resumable: bool,
        dialect: Dialect,
        notices: Sequence[Event],
    ) -> Attachment:
        slot = admission.slot
        caps, config = self.capabilities, self.config
        settings = SessionSettings.defaults(self.model_name, caps, dialect)
        delay_ms = config.slot_prefill_delay_ms
        if update is not None:
            try:
                settings = settings.apply(update.session, caps, audio_started=False)
            except ProtocolError as exc:
                raise SessionError(exc.code, exc.message, param=exc.param) from None
        session_id = self.ids.new_session_id()
        session = Session(
            session_id,
            slot,
            caps,
            settings,
            journal_max_age_s=config.journal_max_age_s,
            journal_max_bytes=config.journal_max_bytes,
            max_pending_turns=config.max_pending_turns,
            max_conversation_items=config.max_conversation_items,
            max_conversation_bytes=config.max_conversation_bytes,
            output_lead_ms=config.output_lead_ms if paced else None,
            response_wait_s=config.response_wait_s,
            prefill_delay_s=None if delay_ms is None else delay_ms / 1000,
        )
        now = self.now()
        session.begin(now)  # its actions are the runner's first (``SessionRunner.run``)
        lease = Lease(
            session_id, now, idle_ttl_s=config.idle_ttl_s, disconnect_grace_s=config.disconnect_grace_s
        )
        credential = (
            ResumeCredential(api_key_id, session_id=session_id, ids=self.ids)
            if caps.supports_resume and resumable
            else None
        )
        record = SessionRecord(self, session, lease, credential, slot)
        if settings.vad is not None:
            try:
                await self.offload(record.pipeline.configure_vad, settings.vad)
            except VadUnavailableError as exc:
                raise SessionError(exc.code, str(exc), param="turn_detection") from None
        if self.model_error is not None:  # the model was lost while the VAD loaded
            self._refuse_unavailable()
        generation = lease.attach(now)
        token = credential.issue() if credential is not None else None
        att = self._attachment(record, generation, token)
        att.push([session.created_event(token, generation)], preload=True)
        opening = session.opening_events(notices, update.session if update is not None else None, now)
        if opening:
            att.push(opening, preload=True)
        record.attachment = att
        record.binding = self._binding(record)
        self.records[session_id] = record
        admission.used = True  # the session holds the slot now
        self._reserved -= 1
        self.metrics.sessions_opened.inc()
        self.metrics.sessions_open.set(len(self.records) + len(self.streams))
        assert self._spawn is not None, "the engine is not running (use `async with engine`)"
        record.task = self._spawn(record)
        return att

    async def open_stream(self, options: SlotOptions) -> BatchStream:
        """Admit a ``BatchStream`` (under the same limits as ``open``) and open its plugin slot.
        Raises ``SessionError`` (``resource_exhausted``; the plugin's code when it refuses the
        slot). Not cancel-safe while the plugin opens the slot (the slot is released if it fails)."""
        if not isinstance(self.driver, BatchDriver):
            raise SessionError("not_supported", f"{self.plugin.name} is not a batch model")
        admission = await self.reserve(None)
        slot = admission.slot
        try:
            await self.on_model_thread(self.plugin.open_slot, slot, options)
        except PluginError as exc:
            self.release(admission)
            raise SessionError(exc.code, exc.message) from None
        except BaseException:
            self.release(admission)
            raise
        admission.used = True  # the stream holds the slot now
        self._reserved -= 1
        stream = BatchStream(
            self,
            self.driver,
            slot,
            max_pending_outputs=self.config.max_pending_outputs,
            max_pending_interactions=self.config.max_pending_interactions,
        )
        if self.model_error is not None:  # the model was lost while the slot opened
            stream.fail(self.model_error, final=True)
        self.streams[slot] = stream
        self.metrics.sessions_opened.inc()
        self.metrics.sessions_open.set(len(self.records) + len(self.streams))
        return stream

    async def close_stream(self, stream: BatchStream) -> None:
        """``stream`` is done (``BatchStream.aclose``): its request stopped, its plugin slot closed,
        its admission slot given back."""
        if self.streams.get(stream.slot) is not stream:
            return
        try:
            await self.driver.stop(stream.slot)
            await self.on_model_thread(self.plugin.close_slot, stream.slot)
        except Exception:
            log.exception("stream on slot %d: close_slot failed", stream.slot)
        finally:
            del self.streams[stream.slot]
            self._free_slots.append(stream.slot)
            self.metrics.sessions_closed.inc()
            self.metrics.sessions_open.set(len(self.records) + len(self.streams))
            self._offer_slots()

    def _attachment(self, record: SessionRecord, generation: int, token: str | None) -> Attachment:
        return Attachment(
            record,
            generation,
            token,
            outbox_max_events=self.config.outbox_max_events,
            outbox_max_bytes=self.config.outbox_max_bytes,
            on_slow_reader=lambda att: self._slow_reader(record, att),
        )

    def _binding(self, record: SessionRecord) -> SlotBinding:
        mailbox = record.mailbox
        limit = self.config.max_pending_outputs
        session = record.session

        def fail(exc: BaseException) -> None:
            try:
                mailbox.put_internal(FailItem(exc))
            except MailboxFull:
                log.error("session %s: mailbox full, step failure not delivered", record.session_id)

        if self.capabilities.hears_stream:  # read per slot and tick: as little as it takes

            def paused() -> bool:
                return mailbox.pending_outputs >= limit

        else:  # a model faster than real time also waits for its paced audio to go out
            backlog_ms = self.config.max_output_backlog_ms
            output = session.output

            def paused() -> bool:
                return mailbox.pending_outputs >= limit or output.backlog_ms() > backlog_ms

        return SlotBinding(
            epoch=functools.partial(_EPOCH, session),  # read per slot and tick: no Python frame
            deliver=record.runner.deliver,  # handed to the runner at once when it is parked
            fail=fail,
            paused=paused,
            drained=record.runner.drained,
        )

    async def open_slot(self, record: SessionRecord, options: SlotOptions) -> None:
        """The session's ``OpenSlot``: ``plugin.open_slot`` on the model thread (the model reads its
        prompt), then the slot joins the driver. Raises ``PluginError`` (the plugin's refusal;
        the slot is not open then)."""
        assert record.binding is not None and not record.slot_open
        await self.on_model_thread(self.plugin.open_slot, record.slot, options)
        record.slot_open = True
        record.feed = self.driver.join(record.slot, record.binding)

    async def restart_slot(self, record: SessionRecord, options: SlotOptions) -> None:
        """The session's ``RestartSlot``: the slot's request stops and it leaves the driver (its
        buffered input is dropped), ``plugin.close_slot``, then ``open_slot`` with ``options``.
        Raises ``PluginError`` as ``open_slot`` (the slot is closed then)."""
        await self._leave(record)
        await self.open_slot(record, options)

    async def _leave(self, record: SessionRecord) -> None:
        """Stop the slot's request; if the plugin's slot is open, leave the driver and close it.
        Raises what ``plugin.close_slot`` raises (the slot counts as closed whatever it does)."""
        await self.driver.stop(record.slot)
        if not record.slot_open:
            return
        record.slot_open = False
        record.feed = None
        self.driver.leave(record.slot)
        await self.on_model_thread(self.plugin.close_slot, record.slot)

    async def release_slot(self, record: SessionRecord) -> None:
        """Cleanup of a closing session: its request stopped, its slot left, the plugin slot closed
        (a slot the session never opened is not)."""
        try:
            await self._leave(record)
        except Exception:
            log.exception("session %s: close_slot(%d) failed", record.session_id, record.slot)

    def forget(self, record: SessionRecord) -> None:
        """The session finished its cleanup: free its admission slot and plugin slot."""
        if self.records.pop(record.session_id, None) is not None:
            self._free_slots.append(record.slot)
            if record.lease.state.value == "expired":
                self.metrics.sessions_expired.inc()
            self.metrics.sessions_closed.inc()
            self.metrics.sessions_open.set(len(self.records) + len(self.streams))
            self.room.session_ended(self.now() - record.opened_at)
            self._offer_slots()

    # ------------------------------------------------------------------ the model's availability

    def model_lost(self, error: PluginError) -> int:
        """The model behind the plugin is gone (its worker process died): every live session gets
        ``error`` as a step failure (being ``fatal``, it ends the session with its code as the
        reason), and opens are refused with ``resource_exhausted`` until ``model_ready``.
        Returns how many sessions were failed."""
        self.model_error = error
        failed = 0
        for stream in self.streams.values():
            stream.fail(error, final=True)
            failed += 1
        for record in list(self.records.values()):
            if record.lease.live:
                try:
                    record.mailbox.put_internal(FailItem(error))
                    failed += 1
                except MailboxFull:
                    log.error("session %s: mailbox full, model loss not delivered", record.session_id)
        return failed

    def model_ready(self) -> None:
        """The model is back (a new worker is ready): opens are accepted again."""
        self.model_error = None

    def _refuse_unavailable(self) -> None:
        assert self.model_error is not None
        self.metrics.admission_refused.inc()
        raise SessionError(
            "resource_exhausted", f"the model is unavailable ({self.model_error.message}); retry later"
        )

    # ------------------------------------------------------------------ detach and resume

    def detach(self, record: SessionRecord, att: Attachment) -> None:
        if record.attachment is not att:
            return  # a replaced or already detached transport: nothing to do (CAS below agrees)
        record.attachment = None
        att.end("detached")
        if record.lease.detach(self.now(), att.generation) and record.credential is None:
            self.close(record, "disconnect")

    def _slow_reader(self, record: SessionRecord, att: Attachment) -> None:
        self.metrics.slow_reader_detaches.inc()
        if record.attachment is att:
            record.attachment = None
            if record.lease.detach(self.now(), att.generation) and record.credential is None:
                self.close(record, "slow_reader")

    async def resume(
        self, session_id: str, resume_token: str, last_event_seq: int, *, api_key_id: bytes | None = None
    ) -> Attachment:
        """Attach a new transport to a live session (see the module docstring). ``api_key_id`` must
        be the one the session was opened with; another fails like a wrong token."""
        record = self.records.get(session_id)
        if record is None or not record.lease.live:
            raise SessionError("session_resume_expired", f"Unknown or expired duplex session: {session_id}")
        if record.credential is None:
            raise SessionError("unsupported_session_resume", "this model does not support session resume")
        if not record.credential.verify(resume_token, api_key_id):
            raise SessionError("invalid_resume_token", "the resume token is not valid for this session")
        session = record.session
        try:
            replay = session.journal.replay_after(last_event_seq)
        except JournalGap as gap:
            self.metrics.resync_required.inc()
            att = self._attachment(record, record.lease.generation, None)
            att.push(
                [SessionResyncRequired(event_id=new_event_id(), session_id=session_id, reason=gap.reason)],
                preload=True,
            )
            att.end("resync_required")
            return att
        except JournalCursorError as exc:
            raise SessionError(exc.code, str(exc)) from None
        now = self.now()
        generation = record.lease.resume(now, record.lease.generation)
        old = record.attachment
        if old is not None:
            old.push(
                [
                    SessionReplaced(
                        event_id=new_event_id(), session_id=session_id, attachment_generation=old.generation
                    )
                ],
                preload=True,
            )
            old.end("replaced")
        token = record.credential.rotate(resume_token)
        att = self._attachment(record, generation, token)
        resumed = SessionResumed(
            event_id=new_event_id(),
            session_id=session_id,
            session=session.settings.render(session_id, self.capabilities, epoch=session.epoch),
            resume_token=token,
            attachment_generation=generation,
        )
        att.push([resumed, *replay], preload=True)
        record.attachment = att
        self.metrics.resumes.inc()
        return att

    # ------------------------------------------------------------------ close, reap, shutdown

    def close(self, record: SessionRecord, reason: str, *, expired: bool = False) -> None:
        """Start the close pipeline (ordered after queued commands). Idempotent."""
        if not record.lease.live:
            return
        record.begin_close(reason, expired=expired)
        record.mailbox.put_internal(CloseItem(reason, expired))

    def reap(self, now: float) -> list[str]:
        """Close every expired lease; returns the session ids it expired."""
        expired = []
        for record in list(self.records.values()):
            reason = record.lease.expiry(now)
            if reason is not None:
                self.close(record, reason, expired=True)
                expired.append(record.session_id)
        return expired

    async def shutdown(self) -> None:
        """Refuse every queued open, close every session with ``shutdown`` and wait for their
        cleanup (bounded)."""
        self.room.close(SessionError("resource_exhausted", "the server is shutting down; retry later"))
        records = list(self.records.values())
        for stream in self.streams.values():
            stream.fail(Detached("shutdown"), final=True)
        for record in records:
            self.close(record, "shutdown")
        for record in records:
            try:
                async with asyncio.timeout(self.config.close_timeout_s):
                    await record.finished.wait()
            except TimeoutError:
                log.error("session %s: cleanup did not finish in time", record.session_id)
                if record.task is not None:
                    record.task.cancel()

    def stats(self) -> dict[str, Any]:
        live = sum(1 for r in self.records.values() if r.lease.live)
        return {
            "sessions_open": len(self.records) + len(self.streams),
            "streams_open": len(self.streams),
            "sessions_live": live,
            "sessions_closing": len(self.records) - live,
            "max_sessions": self.limit,
            "queue_length": self.room.waiting,
            "kind": str(self.capabilities.kind),
        }
