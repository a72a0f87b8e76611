"""Every limit and timeout of the engine, in one struct.

Units are in the names: ``_s`` seconds, ``_ms`` milliseconds, ``_bytes`` bytes;
a bare ``max_*`` is a count. The server reads these from its config file;
clients cannot change them. Defaults are the documented ones (``docs/protocol.md``).
"""

from __future__ import annotations

import msgspec

__all__ = ["EngineConfig"]


class EngineConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Engine-wide limits. All per-session budgets apply to each session separately.

    Admission and leases
        ``max_sessions``: open sessions (closing ones included) before ``resource_exhausted``;
        the plugin's ``capabilities.max_sessions`` caps it further.
        ``idle_ttl_s``: a session with no activity for this long is expired (``None``: never).
        ``disconnect_grace_s``: how long a detached session waits for a resume.
        ``reaper_interval_s``: how often the reaper looks for expired leases.
        ``close_timeout_s``: how long a close waits for the runner to finish its cleanup.

    Waiting room (``duplex.engine.admission``; only for opens whose caller asked to wait)
        ``max_queue_length``: opens that may wait for a slot at once, in FIFO order; past it a new
        one is refused with ``resource_exhausted``. ``0``: no waiting room (every open past
        ``max_sessions`` is refused at once).
        ``max_queue_wait_s``: how long one open may wait before it is refused (``resource_exhausted``).
        ``queue_assumed_session_s``: the session duration the wait estimate assumes until a session
        has ended; afterwards the mean of the last ``queue_duration_samples`` sessions.
        ``queue_duration_samples``: how many of the last sessions' durations that mean takes.

    Input budgets (checked in ``Attachment.submit``, before the mailbox)
        ``max_pending_input_bytes``: encoded audio bytes accepted but not yet processed.
        ``max_pending_turns``: commits / response requests accepted but not yet processed.
        ``mailbox_max``: client commands queued for the runner.
        ``max_command_audio_bytes``: one append's decoded size limit.

    Output
        ``outbox_max_events`` / ``outbox_max_bytes``: events (and their bytes, as the journal
        sizes them) queued for one attachment; past either the attachment is detached (slow
        reader) and the client resumes from the journal.
        ``journal_max_age_s`` / ``journal_max_bytes``: replay journal bounds (oldest dropped first).

    Conversation
        ``max_conversation_items`` / ``max_conversation_bytes``: items (and their bytes) kept per
        session (oldest dropped first, counted; one item over the byte bound is refused with
        ``item_too_large``); a session's memory grows with its history until these bounds, then
        stays flat.

    Responses
        ``output_lead_ms``: audio a model produces faster than real time (``turn`` and ``batch``
        kinds) goes to the client at playback speed, at most this far ahead of the listener, so
        a barge-in cancels what has not been sent and the history holds what was heard without
        the client's help (``duplex.engine.output_stream``); ``None`` sends it as it is made.
        ``max_output_backlog_ms``: how much paced audio may wait to be sent before the engine
        pauses pulling the model's next chunk (a long reply is made about as it is played).
        ``response_wait_s``: how long a ``response.create`` on a model that decides itself when to
        speak waits for its speech before the response ends empty (``model_silent``).

    The model's slot
        ``slot_prefill_delay_ms``: a session's model slot is its own from its first input on (the
        settings given until then are what the model reads when its slot opens); so that the model
        reads its prompt (PersonaPlex's voice and persona, Nemotron's system prompt and tools,
        MiniCPM-o's reference voice) before that input rather than in its way, the slot is opened
        ahead once the session's settings have stayed as they are for this long after the session
        was created or last updated, and opened again if they change before the first input.
        Stock clients send their whole setup within a round trip of ``session.created``, so a
        short delay rarely reads a prompt twice. ``None``: the slot opens at the first input, the
        prompt read in the first audio's way.

    Memory
        ``memory_budget_bytes``: the server process's resident memory above which new work is
        refused: a new session with ``resource_exhausted``, a new conversation item or response
        with ``input_backpressure`` (running sessions go on). ``None`` (the default) is 80 % of
        the machine's memory (or of the cgroup's limit, where one is set); ``0`` disables it.

    Frame scheduler
        ``tick_ms``: ``0`` (the default) steps as soon as a frame is ready, batching the frames
        that complete while a step runs (continuous batching: no tick wait, and the step's own
        duration sets the batch size). A positive value ticks on that fixed clock, ``None``
        once per plugin frame period; a session is stepped once per frame it received either
        way. Measured on one H200 with PersonaPlex: the same ticks and 0 missed deadlines at 64
        sessions, and first audio at 1 session 198 ms against 271 ms with a 10 ms tick.
        ``batch_window_ms``: with ``tick_ms=0``, how long a ready frame may wait for others to
        join its batch, when fewer frames are ready than the joined sessions are expected to
        complete in that time (their count times the window over the frame period); otherwise
        the step starts at once. A light load (fewer sessions than one frame per window) and a
        slow step (whose own duration gathers the batch) never wait. A batch costs a fixed
        amount of loop and scheduler work whatever its size; at hundreds of sessions on a
        microsecond-step plugin, eager steps carry 1-2 frames and that work dominates. ``0``
        turns the wait off. The default, 1 ms, measured against 2 ms with 500-1000 echo sessions
        over WebSocket: the same server CPU, p50 about 1 ms lower, and a lower p99 at 900.
        ``unit_gather_ms``: ``unit`` plugins (one-second units, stepped eagerly): a ready unit
        waits at most this long for the units of other sessions that their clients are due to
        close with it (each on time, one period after its previous close), so that sessions
        whose units close a few milliseconds apart are stepped together and none waits a whole
        step for the next one. A unit whose session is alone in closing then never waits; ``0``
        turns the gather off. ``frame`` plugins do not gather (``batch_window_ms`` applies).
        ``late_tolerance_ms``: how long past its due time a frame may stay incomplete before
        the scheduler pads it with silence.
        ``max_padding_frames``: consecutive padded frames before a silent session is frozen
        (no more steps until input arrives again).
        ``max_pending_outputs``: model outputs waiting in one session's mailbox; a slot above
        it is not stepped (frozen) until its runner catches up.
        ``max_pending_interactions``: interactions (a video generator's new prompt, camera move)
        queued for one running request and not yet handed to the model (``BatchStream.interact``);
        more are refused with ``input_backpressure``.

    Off-loop work
        ``offload_min_bytes``: appends larger than this are decoded on the worker pool
        instead of the event loop (small ones cost less inline than a thread hop).
        ``worker_threads``: size of that pool (decode, resample, VAD).
        ``gc_thresholds``: Python's garbage collector thresholds while the engine runs
        (``duplex.engine.gc_settings`` says why); ``None`` leaves the collector alone.
    """

    max_sessions: int = 64
    idle_ttl_s: float | None = 300.0
    disconnect_grace_s: float = 30.0
    reaper_interval_s: float = 5.0
    close_timeout_s: float = 5.0
    max_queue_length: int = 32
    max_queue_wait_s: float = 300.0
    queue_assumed_session_s: float = 120.0
    queue_duration_samples: int = 32

    max_pending_input_bytes: int = 16 * 1024 * 1024
    max_pending_turns: int = 4
    mailbox_max: int = 256
    max_command_audio_bytes: int = 15 * 1024 * 1024

    outbox_max_events: int = 4096
    outbox_max_bytes: int = 16 * 1024 * 1024
    journal_max_age_s: float = 60.0
    journal_max_bytes: int = 8 * 1024 * 1024
    max_conversation_items: int = 1024
    max_conversation_bytes: int = 16 * 1024 * 1024

    output_lead_ms: float | None = 300.0
    max_output_backlog_ms: float = 5000.0
    response_wait_s: float = 5.0

    slot_prefill_delay_ms: float | None = 100.0

    memory_budget_bytes: int | None = None

    tick_ms: float | None = 0.0
    batch_window_ms: float = 1.0
    unit_gather_ms: float = 20.0
    late_tolerance_ms: float = 40.0
    max_padding_frames: int = 25
    max_pending_outputs: int = 8
    max_pending_interactions: int = 64

    offload_min_bytes: int = 64 * 1024
    worker_threads: int = 2
    gc_thresholds: tuple[int, int, int] | None = (10_000, 3, 50)

    def __post_init__(self) -> None:
        if self.max_sessions < 1:
            raise ValueError("max_sessions must be >= 1")
        if self.idle_ttl_s is not None and self.idle_ttl_s <= 0:
            raise ValueError("idle_ttl_s must be positive or None")
        if self.max_queue_length < 0:
            raise ValueError("max_queue_length must be >= 0 (0: no waiting room)")
        if self.queue_duration_samples < 1:
            raise ValueError("queue_duration_samples must be >= 1")
        for name in (
            "disconnect_grace_s",
            "reaper_interval_s",
            "journal_max_age_s",
            "close_timeout_s",
            "max_queue_wait_s",
            "queue_assumed_session_s",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        for name in (
            "max_pending_turns",
            "mailbox_max",
            "outbox_max_events",
            "max_pending_outputs",
            "max_pending_interactions",
            "max_conversation_items",
            "outbox_max_bytes",
            "max_conversation_bytes",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.gc_thresholds is not None and (len(self.gc_thresholds) != 3 or min(self.gc_thresholds) < 1):
            raise ValueError("gc_thresholds must be three positive counts or None")
        if self.memory_budget_bytes is not None and self.memory_budget_bytes < 0:
            raise ValueError("memory_budget_bytes must be >= 0 (0: no budget) or None (80 % of memory)")
        if self.output_lead_ms is not None and self.output_lead_ms < 0:
            raise ValueError("output_lead_ms must be >= 0, or None (no pacing)")
        for name in ("max_output_backlog_ms", "response_wait_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.slot_prefill_delay_ms is not None and self.slot_prefill_delay_ms < 0:
            raise ValueError("slot_prefill_delay_ms must be >= 0, or None (opened at the first input)")
        if self.batch_window_ms < 0:
            raise ValueError("batch_window_ms must be >= 0 (0: no wait)")
        if self.unit_gather_ms < 0:
            raise ValueError("unit_gather_ms must be >= 0 (0: no gather)")
        if self.tick_ms is not None and self.tick_ms < 0:
            raise ValueError("tick_ms must be >= 0 (0: step when ready) or None")
