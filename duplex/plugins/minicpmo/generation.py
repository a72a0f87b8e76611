"""One batched unit step for every slot: hear a second, see its frame, decide, say it.

Theory of operation
-------------------
All per-slot model state is preallocated at a fixed batch of ``slots`` rows: the
language model's, the audio encoder's and the speech head's KV caches (``SlotCache``), and per-row
tensors (lengths, turn state, seeds, the repetition history). ``step`` runs every row at once; a row
without a unit this step is frozen: it writes into scratch, its lengths do not move, and what it
samples is discarded (``exec`` mask). A slot's outputs therefore do not depend on the other rows.

A step, for the rows that have a unit:

1. host, then device: the slots' lengths are read (the device is idle between steps): they give each
   unit's start and the key span the step's attention reads (``attention``). The unit's audio goes
   through the streaming encoder (``prefill.UnitPrefill.run_audio``, a CUDA graph with
   ``cuda_graphs``), queued first so that the host's work below runs while it does.
2. host: the unit's input layout per row (``layout``): the previous unit's terminator and
   ``</unit>``, ``<unit>``, ``<image>`` + vision embeddings + ``</image>`` per frame, ten audio
   embeddings; padded to the narrowest prefill width that holds every row (``UnitPrefill.widths``: a
   width per number of frames a unit may have, up to ``unit_width``). Frames are decoded and patched
   here, on the ``frame_threads`` threads. Then, on the device: the frames through the vision tower,
   and ``UnitPrefill.run``: the input embeddings assembled by ``torch.where`` over gathers, one prefill
   of the whole block (a CUDA graph per width and key span with ``cuda_graphs``).
3. device: up to ``max_new_tokens`` decode steps in lockstep for the step's slots (``decode``: the
   batch compacted to a bucket, MiniCPM-o's stage-0 policy, a CUDA graph per bucket and span with
   ``cuda_graphs``), rows leaving as they sample a unit terminator; the loop ends early once every row
   has (one host read of a flag per decode step, for the whole batch).
4. host: one copy of the sampled tokens; per row the decision (``listen`` when the unit ends with
   ``<|listen|>``, else ``speak``), the text, the end of the turn.
5. device: the speech head turns each speaking row's unit (the tokens it fed after the first, special
   ones included, and their hidden states) into one second of speech codes (a graph per code step),
   fewer where it draws its end code in a turn's first or last unit (``tts_early_end``, upstream's rule,
   ``speech``); one host read of the codes; the code-to-wave stage (``token2wav``; a graph per bucket
   of speaking rows) turns them into 24 kHz audio through each slot's code buffer, streaming per turn
   (a turn of N full units is N seconds of audio after its three silence codes' 120 ms; its first
   unit is 160 ms shorter and its last 280 ms longer, see ``token2wav``).

Typed text (``read_text``, before a step's units): MiniCPM-o reads a user's text as a user turn of
its chat template, ``<|im_start|>user\n{text}<|im_end|>\n`` (``tokens.user_turn``), the way its
streaming mode places a user message in the prompt. Its duplex loop has no place for text inside a
unit, so the text goes between two units: the previous unit is closed (its terminator, ``</unit>``)
and the turn follows, and the slot's next unit opens with ``<unit>``. It is prefilled eagerly in the
slot's own row (every text has its own length), like the system context.

The context window: when a row's language-model cache passes ``window_high_tokens``, its oldest whole
units after the system context are dropped until it holds at most ``window_low_tokens``; the kept
entries move down with their keys re-rotated (``Thinker.shift_keys``), so no recomputation is needed.
Typed text that would take the row past ``window_high_tokens`` makes room the same way first (a text
read between two units goes with the unit before it); of a text longer than the whole window less the
system context, only its end is read, and the tokens left out are counted (``text_tokens_dropped``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch
from tokenizers import Tokenizer

from duplex.plugins.base import PluginError
from duplex.plugins.minicpmo.attention import SlotCache, eager_attention
from duplex.plugins.minicpmo.audio import ENCODER_FRAMES_PER_UNIT, AudioEncoder
from duplex.plugins.minicpmo.config import AUDIO_TOKENS_PER_UNIT, UNIT_SAMPLES, MiniCPMOConfig
from duplex.plugins.minicpmo.decode import DecodeOptions, LMDecoder, SlotSampling
from duplex.plugins.minicpmo.graphs import graph_pool
from duplex.plugins.minicpmo.modules import MiniCPMOModel
from duplex.plugins.minicpmo.prefill import KIND_AUDIO, KIND_TOKEN, KIND_VISION, UnitPrefill
from duplex.plugins.minicpmo.speech import SpeechGenerator
from duplex.plugins.minicpmo.text_length import CharTable
from duplex.plugins.minicpmo.thinker import Thinker
from duplex.plugins.minicpmo.token2wav import CodeToWave
from duplex.plugins.minicpmo.tokens import SpecialTokens, session_texts, user_turn
from duplex.plugins.minicpmo.vision import PreparedFrame, VisionEncoder
from duplex.plugins.stage_clock import stage

__all__ = ["GenerationOptions", "UnitGenerator", "UnitResult"]


@dataclass(frozen=True)
class GenerationOptions:
    """Stage-0 sampling and the context window (plugin options; see the plugin docstring)."""

    max_new_tokens: int = 20
    top_p: float = 0.8
    top_k: int = 20
    repetition_penalty: float = 1.05
    repetition_history: int = 512
    length_penalty: float = 1.1  # on ``<|turn_eos|>``: MiniCPM-o's duplex default
    char_limit: int = 28  # a unit's text ends before it reaches this many characters (0: never)
    force_listen_units: int = 0  # a session's first units that listen whatever the model says
    tts_temperature: float = 0.8
    tts_top_k: int = 0  # 0 and 1.0: the speech codes are drawn from the whole distribution, as upstream
    tts_top_p: float = 1.0
    tts_early_end: bool = True  # the speech head may end a turn's first and last unit early (upstream's rule)
    voice_markers: str = "always"  # "always" or "with_voice": ``<|audio_start|><|audio_end|>`` in the prompt
    context_tokens: int = 8192
    window_high_tokens: int = 8000
    window_low_tokens: int = 6000
    max_frames_per_unit: int = 2
    frame_threads: int = 16
    early_exit: bool = True
    cuda_graphs: bool = False


@dataclass
class UnitResult:
    """What one slot's unit produced (host side). ``input_tokens``: the unit's input positions by
    kind (text, audio, vision), as its layout laid them out."""

    tokens: list[int]
    decision: str
    text: str
    end_of_turn: bool
    codes: np.ndarray | None = None
    pcm: np.ndarray | None = None
    input_tokens: tuple[int, int, int] = (0, 0, 0)
    speech_tokens: list[int] = field(default_factory=list)
    text_ids: list[int] = field(default_factory=list)  # the typed text read before the unit (``read_text``)


@dataclass
class _SlotHost:
    """Host bookkeeping of one open slot."""

    prefix_len: int
    units: int = 0
    unit_open: bool = False  # a unit was stepped and its ``</unit>`` is not fed yet
    pending_terminator: int | None = None
    unit_starts: list[int] = field(default_factory=list)
    turn_ids: list[int] = field(default_factory=list)
    turn_text: str = ""
    speaking: bool = False


class UnitGenerator:
    """The model, its per-slot state, and ``step`` (see the module docstring)."""

    def __init__(
        self,
        model: MiniCPMOModel,
        cfg: MiniCPMOConfig,
        tokenizer: Tokenizer,
        special: SpecialTokens,
        slots: int,
        options: GenerationOptions,
        code_to_wave: CodeToWave,
    ) -> None:
        self.model = model
        self.cfg = cfg
        self.tok = tokenizer
        self.sp = special
        self.slots = slots
        self.opts = options
        self.code_to_wave = code_to_wave
        weight = model.llm.model.embed_tokens.weight
        self.device, self.dtype = weight.device, weight.dtype
        dev, dt = self.device, self.dtype
        q = cfg.query_num
        # A unit's width by its frames (none, one, ...): markers, each frame's embeddings in <image>
        # ... </image>, the audio; the widest is the cache's scratch and the host layout's width.
        widths = [3 + f * (q + 2) + AUDIO_TOKENS_PER_UNIT for f in range(options.max_frames_per_unit + 1)]
        self.unit_width = widths[-1]
        if options.window_high_tokens + self.unit_width + options.max_new_tokens > options.context_tokens:
            raise PluginError(
                "invalid_plugin_config",
                f"window_high_tokens ({options.window_high_tokens}) + a unit ({self.unit_width}) + "
                f"max_new_tokens ({options.max_new_tokens}) exceed context_tokens ({options.context_tokens})",
            )
        if options.voice_markers not in ("always", "with_voice"):
            raise PluginError("invalid_plugin_config", "voice_markers must be 'always' or 'with_voice'")
        if options.tts_temperature <= 0 or options.length_penalty <= 0:
            raise PluginError("invalid_plugin_config", "tts_temperature and length_penalty must be positive")
        if options.force_listen_units < 0 or options.char_limit < 0:
            raise PluginError("invalid_plugin_config", "force_listen_units and char_limit must be >= 0")
        if not 0 < options.window_low_tokens < options.window_high_tokens:
            raise PluginError("invalid_plugin_config", "window_low_tokens must be in (0, window_high_tokens)")
        if options.cuda_graphs and dev.type != "cuda":
            raise PluginError("invalid_plugin_config", f"cuda_graphs needs a CUDA device, not {dev.type!r}")
        llm = cfg.llm
        lm_cache = SlotCache(
            llm.num_hidden_layers,
            slots,
            llm.num_key_value_heads,
            options.context_tokens,
            llm.head_dim,
            self.unit_width,
            dev,
            dt,
        )
        self.thinker = Thinker(model.llm, lm_cache, cfg.rope_theta)
        a = cfg.audio
        audio_cache = SlotCache(
            a.encoder_layers,
            slots,
            a.encoder_attention_heads,
            a.max_source_positions,
            a.d_model // a.encoder_attention_heads,
            ENCODER_FRAMES_PER_UNIT,
            dev,
            dt,
        )
        self.audio = AudioEncoder(model.apm, model.audio_projection_layer, cfg.audio_pool_step, audio_cache)
        self.vision = VisionEncoder(model.vpm, model.resampler, cfg.image_size, cfg.patch_size)
        if dev.type == "cuda":
            self.vision.warm()
        t = cfg.tts
        max_condition = options.max_new_tokens + 1
        tts_cache = SlotCache(
            t.num_hidden_layers,
            slots,
            t.num_key_value_heads,
            t.max_position_embeddings,
            t.hidden_size // t.num_attention_heads,
            max_condition,
            dev,
            dt,
        )
        # Every captured step of the generator replays from one memory pool: they never run at once.
        pool = graph_pool() if options.cuda_graphs else None
        capture = options.cuda_graphs
        self.speech = SpeechGenerator(
            model.tts,
            t,
            tts_cache,
            max_condition,
            capture=capture,
            pool=pool,
            sampling=(options.tts_temperature, options.tts_top_k, options.tts_top_p),
        )
        zeros = torch.zeros(slots, dtype=torch.long, device=dev)
        self.lm_len = zeros.clone()
        self.audio_len = zeros.clone()
        self.tts_len = zeros.clone()
        self.seed = zeros.clone()
        self.counter = zeros.clone()
        self.turn_open = torch.zeros(slots, dtype=torch.bool, device=dev)
        self.force_listen = torch.zeros(slots, dtype=torch.bool, device=dev)
        self.temperature = torch.zeros(slots, dtype=torch.float32, device=dev)
        self.history = torch.full((slots, options.repetition_history), -1, dtype=torch.long, device=dev)
        self.hosts: dict[int, _SlotHost] = {}
        self._special_ids = set(special.all_ids())
        self.frames_dropped = 0
        self.text_tokens_dropped = 0
        if options.frame_threads < 1:
            raise PluginError("invalid_plugin_config", "frame_threads must be at least 1")
        self._frames = ThreadPoolExecutor(options.frame_threads, thread_name_prefix="minicpmo-frames")
        decode = DecodeOptions(
            options.max_new_tokens,
            options.top_k,
            options.top_p,
            options.repetition_penalty,
            options.early_exit,
            options.length_penalty,
            options.char_limit,
        )
        self.prefill = UnitPrefill(
            self.thinker,
            self.audio,
            self.lm_len,
            self.audio_len,
            widths,
            slots * options.max_frames_per_unit * q,
            capture=capture,
            pool=pool,
        )
        vocab = int(model.llm.lm_head.weight.shape[0])
        chars = CharTable(tokenizer, set(special.all_ids()), vocab, dev) if options.char_limit else None
        self.decoder = LMDecoder(
            self.thinker,
            special,
            decode,
            slots,
            options.repetition_history,
            capture=capture,
            pool=pool,
            chars=chars,
        )

    # -- slots ------------------------------------------------------------

    def _embed_ids(self, ids: list[int]) -> torch.Tensor:
        return self.thinker.embed_tokens(torch.tensor(ids, dtype=torch.long, device=self.device))

    @torch.no_grad()
    def open_slot(
        self, slot: int, instructions: str, ref_audio: np.ndarray | None, seed: int, temperature: float
    ) -> None:
        """Reset ``slot`` and prefill its system context (instructions, reference voice) into its row.

        The slot is ready when this returns; no other row is touched.
        """
        rows = torch.tensor([[slot]], device=self.device)
        self.audio_len[slot] = 0
        parts: list[torch.Tensor] = []
        markers = ref_audio is not None or self.opts.voice_markers == "always"
        prefix, suffix = session_texts(instructions, markers)
        parts.append(self._embed_ids(self.tok.encode(prefix, add_special_tokens=False).ids))
        if ref_audio is not None:
            with eager_attention():  # upstream's offline path for a reference clip (``audio``)
                parts.append(self.audio.encode_clip(torch.from_numpy(ref_audio).to(self.device)))
        parts.append(self._embed_ids(self.tok.encode(suffix, add_special_tokens=False).ids))
        embeds = torch.cat(parts, dim=0)[None].to(self.dtype)
        n = embeds.shape[1]
        limit = self.opts.window_low_tokens
        if n > limit:
            raise PluginError(
                "invalid_session_config",
                f"the instructions and reference voice take {n} tokens; the context window fits {limit}",
            )
        pos = torch.arange(n, device=self.device)[None]
        with eager_attention():  # every prompt length is a new shape
            self.thinker.forward(embeds, pos, pos, pos + 1, rows=rows)
        self.lm_len[slot] = n
        self.audio_len[slot] = 0
        self.tts_len[slot] = 0
        self.turn_open[slot] = False
        self.seed[slot] = seed
        self.counter[slot] = 0
        self.temperature[slot] = temperature
        self.history[slot] = -1
        self.code_to_wave.reset(slot)
        self.hosts[slot] = _SlotHost(prefix_len=n)

    def cancel_slot(self, slot: int) -> None:
        """Barge-in: the current reply is void; the conversation (and what the model heard) stays."""
        host = self.hosts[slot]
        host.turn_ids.clear()
        host.turn_text = ""
        host.speaking = False
        self.turn_open[slot] = False
        self.tts_len[slot] = 0
        self.code_to_wave.reset(slot)

    def close_slot(self, slot: int) -> None:
        self.hosts.pop(slot, None)

    def close(self) -> None:
        """Stop the frame threads (the generator is not used after this)."""
        self._frames.shutdown(wait=True)

    # -- the step ---------------------------------------------------------

    def layout(
        self, batch: dict[int, tuple[np.ndarray, list[bytes]]]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[PreparedFrame]]:
        """Step 1 on the host: ``ids, kind, src [slots, unit_width]`` (kind: 0 token, 1 audio, 2 vision;
        src: the embedding a position takes), ``valid [slots]`` and the decoded frames."""
        w, sp, q = self.unit_width, self.sp, self.cfg.query_num
        ids = np.zeros((self.slots, w), dtype=np.int64)
        kind = np.zeros((self.slots, w), dtype=np.int64)
        src = np.zeros((self.slots, w), dtype=np.int64)
        valid = np.zeros(self.slots, dtype=np.int64)
        frames: list[PreparedFrame] = []
        kept = {slot: raw[: self.opts.max_frames_per_unit] for slot, (_pcm, raw) in batch.items()}
        # Decoding and resizing release the GIL: the step's frames are prepared on the frame threads.
        prepared = {slot: [self._frames.submit(self.vision.prepare, d) for d in kept[slot]] for slot in kept}
        for slot, (_pcm, raw_frames) in batch.items():
            host = self.hosts[slot]
            seq: list[tuple[int, int, int]] = []
            if host.unit_open:
                if host.pending_terminator is not None:
                    seq.append((KIND_TOKEN, host.pending_terminator, 0))
                seq.append((KIND_TOKEN, sp.unit_end, 0))
            seq.append((KIND_TOKEN, sp.unit, 0))
            self.frames_dropped += len(raw_frames) - len(kept[slot])
            for pending in prepared[slot]:
                try:
                    frame = pending.result()
                except PluginError:
                    self.frames_dropped += 1
                    continue
                base = len(frames) * q
                frames.append(frame)
                seq.append((KIND_TOKEN, sp.image, 0))
                seq.extend((KIND_VISION, 0, base + j) for j in range(q))
                seq.append((KIND_TOKEN, sp.image_end, 0))
            seq.extend(
                (KIND_AUDIO, 0, slot * AUDIO_TOKENS_PER_UNIT + j) for j in range(AUDIO_TOKENS_PER_UNIT)
            )
            n = len(seq)
            arr = np.asarray(seq, dtype=np.int64)
            kind[slot, :n], ids[slot, :n], src[slot, :n] = arr[:, 0], arr[:, 1], arr[:, 2]
            valid[slot] = n
        return ids, kind, src, valid, frames

    @torch.no_grad()
    def read_text(self, slot: int, texts: Sequence[str]) -> list[int]:
        """Prefill the user's typed ``texts`` into ``slot``'s row before its next unit, each as a user
        turn of the chat template (see the module docstring); returns the ids prefilled."""
        host, sp = self.hosts[slot], self.sp
        ids: list[int] = []
        if host.unit_open:  # close the previous unit: the next one opens with ``<unit>`` alone
            if host.pending_terminator is not None:
                ids.append(host.pending_terminator)
            ids.append(sp.unit_end)
            host.unit_open, host.pending_terminator = False, None
        for text in texts:
            ids += self.tok.encode(user_turn(text), add_special_tokens=False).ids
        room = self.opts.window_low_tokens - host.prefix_len
        if len(ids) > room:  # only the text's end fits the window
            self.text_tokens_dropped += len(ids) - room
            ids = ids[len(ids) - room :]
        length = int(self.lm_len[slot])
        if length + len(ids) > self.opts.window_high_tokens:
            length = self._cut(slot, length, len(ids))
        n = len(ids)
        rows = torch.tensor([[slot]], device=self.device)
        pos = length + torch.arange(n, device=self.device)[None]
        embeds = self._embed_ids(ids)[None].to(self.dtype)
        with eager_attention():  # every text has its own length
            self.thinker.forward(embeds, pos, pos, pos + 1, rows=rows)
        self.lm_len[slot] = length + n
        return ids

    @torch.no_grad()
    def step(
        self,
        batch: dict[int, tuple[np.ndarray, list[bytes]]],
        texts: Mapping[int, Sequence[str]] | None = None,
    ) -> dict[int, UnitResult]:
        """Advance every slot in ``batch`` (slot -> (16000 float32 samples, encoded frames)) by one unit,
        each having read first the typed text ``texts`` gives it (``read_text``)."""
        read = {slot: self.read_text(slot, t) for slot, t in (texts or {}).items() if t}
        opts = self.opts
        samples = np.zeros((self.slots, UNIT_SAMPLES), dtype=np.float32)
        executes = np.zeros(self.slots, dtype=bool)
        for slot, (pcm, _frames) in batch.items():
            executes[slot] = True
            samples[slot] = pcm
        # The device is idle between steps: reading the lengths costs no wait. They give each unit's start
        # and the key span that covers every row of the step (prefill, then max_new_tokens decoded).
        # A copy: on a CPU ``cpu()`` is the tensor itself, which the prefill moves on in place.
        starts_h = self.lm_len.cpu().numpy().copy()
        # The audio encoder first: the frames are decoded on the host while it runs (``prefill``).
        with stage("audio"):
            self.prefill.run_audio(samples, executes)
        with stage("layout.host"):
            ids_h, kind_h, src_h, valid_h, frames = self.layout(batch)
        w = self.prefill.width_for(int(valid_h.max()))
        layout = np.zeros((4, self.slots, w), dtype=np.int64)
        layout[0], layout[1], layout[2] = ids_h[:, :w], kind_h[:, :w], src_h[:, :w]
        layout[3] = valid_h[:, None]
        span = self.thinker.cache.span_for(max(int(starts_h[s]) for s in batch) + w + opts.max_new_tokens)
        vision = None
        if frames:
            with stage("vision.encode"):
                vision = self.vision.encode(frames)
                vision = vision.reshape(-1, vision.shape[-1])
        with stage("prefill"):
            logits = self.prefill.run(layout, vision, span)
        force = np.zeros(self.slots, dtype=bool)
        for slot in batch:
            force[slot] = self.hosts[slot].units < opts.force_listen_units
        self.force_listen.copy_(torch.from_numpy(force))
        state = SlotSampling(
            self.lm_len,
            self.seed,
            self.counter,
            self.temperature,
            self.history,
            self.turn_open,
            self.force_listen,
        )
        with stage("decode"):
            generated, fed_hidden = self.decoder.run(sorted(batch), logits, state, span)
        with stage("tokens.read"):
            gen_h = generated.cpu().numpy()
        with stage("parse.host"):
            results = self._parse(batch, gen_h, starts_h)
        for slot, res in results.items():
            row = kind_h[slot, : valid_h[slot]]
            audio, vision = int((row == KIND_AUDIO).sum()), int((row == KIND_VISION).sum())
            res.text_ids = read.get(slot, [])
            res.input_tokens = (len(row) - audio - vision + len(res.text_ids), audio, vision)
        self._speak(results, gen_h, fed_hidden)
        with stage("window"):
            self._apply_window(batch)
        return results

    def _parse(self, batch: dict, gen_h: np.ndarray, starts_h: np.ndarray) -> dict[int, UnitResult]:
        sp = self.sp
        results: dict[int, UnitResult] = {}
        for slot in batch:
            host = self.hosts[slot]
            host.units += 1
            host.unit_open = True
            host.unit_starts.append(int(starts_h[slot]))
            tokens = [int(x) for x in gen_h[slot] if x >= 0]
            host.pending_terminator = tokens[-1] if tokens and tokens[-1] in sp.terminators else None
            # Upstream's loop reports the unit its terminator names: ``<|listen|>`` as the unit's first
            # token, or after ``<|turn_eos|>`` closed the turn within the unit (nothing of it is then
            # said or spoken, and the turn's end is not reported).
            decision = "listen" if not tokens or tokens[-1] == sp.listen else "speak"
            # The turn ends where ``<|turn_eos|>`` is the last token the unit fed (upstream's
            # ``end_of_turn``, set by every token fed): a token fed after it in the unit opens it again.
            fed = tokens[:-1] if host.pending_terminator is not None else tokens
            end_of_turn = decision == "speak" and bool(fed) and fed[-1] == sp.turn_eos
            text = ""
            if decision == "speak":
                if not host.speaking:
                    host.turn_ids.clear()
                    host.turn_text = ""
                host.turn_ids.extend(x for x in tokens if x not in self._special_ids)
                # A byte-level token can end inside a character: hold the partial character back.
                full = self.tok.decode(host.turn_ids, skip_special_tokens=True).rstrip("\ufffd")
                text = full[len(host.turn_text) :] if full.startswith(host.turn_text) else full
                host.turn_text = full
            results[slot] = UnitResult(tokens=tokens, decision=decision, text=text, end_of_turn=end_of_turn)
        return results

    def _speak(self, results: dict[int, UnitResult], gen_h: np.ndarray, fed_hidden: torch.Tensor) -> None:
        """Steps 5: speech codes and audio for every speaking row, in one batched pass."""
        speaking_h = np.zeros(self.slots, dtype=bool)
        max_new = self.opts.max_new_tokens
        text_h = np.zeros((self.slots, max_new), dtype=np.int64)
        where_h = np.zeros((self.slots, max_new), dtype=np.int64)
        count_h = np.zeros(self.slots, dtype=np.int64)
        starts: list[int] = []
        terminators = set(self.sp.terminators)
        for slot, res in results.items():
            if res.decision != "speak":
                if self.sp.turn_eos not in res.tokens:  # after ``<|turn_eos|>``: the head's state stays
                    self.hosts[slot].speaking = False
                continue
            host = self.hosts[slot]
            if not host.speaking:
                starts.append(slot)
            host.speaking = not res.end_of_turn
            speaking_h[slot] = True
            # MiniCPM-o's rule: the speech head hears every token the unit feeds after its first one,
            # special tokens included (``<|tts_bos|>``, ``<|turn_eos|>``); the first never, even text.
            spoken = [(t, x) for t, x in enumerate(res.tokens) if t >= 1 and x not in terminators]
            res.speech_tokens = [x for _t, x in spoken]
            count_h[slot] = len(spoken)
            for j, (t, x) in enumerate(spoken):
                text_h[slot, j] = x
                where_h[slot, j] = t
        if not speaking_h.any():
            return
        dev = self.device
        for slot in starts:
            self.tts_len[slot] = 0
            self.code_to_wave.reset(slot)
        text = torch.from_numpy(text_h[:, : max_new - 1]).to(dev)
        idx = torch.from_numpy(where_h[:, : max_new - 1]).to(dev)
        hidden = fed_hidden.gather(1, idx[..., None].expand(-1, -1, fed_hidden.shape[-1]))
        count = torch.from_numpy(count_h).to(dev)
        speaking = torch.from_numpy(speaking_h).to(dev)
        with stage("speech.condition"):
            cond = self.speech.condition(text, hidden, count)
        tts_len_h = self.tts_len.cpu().numpy()
        span = self.speech.span_for([int(tts_len_h[s]) for s in np.flatnonzero(speaking_h)])
        last_h = np.zeros(self.slots, dtype=bool)
        for slot, res in results.items():
            last_h[slot] = res.decision == "speak" and res.end_of_turn
        # Upstream's rule: the end of speech may come in a turn's first unit and in the one that ends it.
        allow_h = np.zeros(self.slots, dtype=bool)
        if self.opts.tts_early_end:
            allow_h[starts] = True
            allow_h |= last_h
        allow = torch.from_numpy(allow_h).to(dev)
        with stage("speech.codes"):
            codes, n_codes, tts_len = self.speech.generate(
                cond,
                count + 1,
                self.tts_len,
                speaking,
                self.seed,
                self.counter,
                self.temperature > 0,
                span,
                allow,
            )
            self.tts_len.copy_(tts_len)
        with stage("speech.read"):
            codes_h, n_codes_h = codes.cpu().numpy(), n_codes.cpu().numpy()
        with stage("c2w"):
            pcm = self.code_to_wave.decode(codes_h, n_codes_h, speaking_h, last_h)
        for slot, res in results.items():
            if speaking_h[slot]:
                res.codes = codes_h[slot, : n_codes_h[slot]].copy()
                res.pcm = pcm[slot]

    def _apply_window(self, batch: dict) -> None:
        """Cut rows past ``window_high_tokens`` down to ``window_low_tokens`` (module docstring)."""
        lengths = None
        for slot in batch:
            if not self.hosts[slot].unit_starts:
                continue
            if lengths is None:
                lengths = self.lm_len.cpu().numpy()
            length = int(lengths[slot])
            if length > self.opts.window_high_tokens:
                self._cut(slot, length, 0)

    def _cut(self, slot: int, length: int, extra: int) -> int:
        """Drop ``slot``'s oldest whole units until its ``length`` entries and ``extra`` more fit in
        ``window_low_tokens``: the last unit is kept when nothing is to follow (``extra`` 0), every unit
        may go to make room for ``extra`` (typed text). Returns the row's new length."""
        host = self.hosts[slot]
        starts = host.unit_starts
        keep_from = len(starts) - 1 if extra == 0 else len(starts)
        for i, start in enumerate(starts):
            if host.prefix_len + length - start + extra <= self.opts.window_low_tokens:
                keep_from = i
                break
        cut = starts[keep_from] if keep_from < len(starts) else length
        self.thinker.shift_keys(slot, cut, length, host.prefix_len)
        shift = cut - host.prefix_len
        host.unit_starts = [s - shift for s in starts[keep_from:]]
        self.lm_len[slot] = length - shift
        return length - shift
