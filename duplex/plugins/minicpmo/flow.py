"""Speech codes -> mel, streamed one unit at a time for every speaking slot at once (the flow stage).

Theory of operation
-------------------
Per slot the stream is a turn: it starts from the voice prompt's state (``reset``) and takes chunks
of codes. Which chunks run follows upstream's duplex loop, a code buffer (``CodeBuffer``): a turn's
buffer starts with three silence codes (``SILENCE_CODE``); a unit's codes (25, fewer where the speech
head ended early) are appended, and while at least ``lookahead + 5`` (8) codes wait, a chunk of up to
``lookahead + 25`` (28) of them runs and all but its last ``lookahead`` codes leave the buffer (the
encoder looks ``lookahead`` codes ahead, so those wait for the next codes); at the end of the turn
what is left (3 to 7 codes) is flushed as a last chunk, padded with zeros. So a turn's units normally
run

    first / middle unit     28 in, 25 out            last unit     28 in, 25 out; then 3 in, 3 out

and a unit that leaves fewer than 8 codes waiting runs none (its codes go out with the next unit's;
the buffer then keeps up to 7 codes, and each later unit's chunk is 28 in, 25 out, keeping 3 to 7).
``chunk`` runs one chunk of ``count`` codes in a fixed width of ``lookahead + 25``; a chunk yields
``n_out`` codes' worth of mel (twice as many frames): ``count - lookahead``, or ``count`` as the last.

Attention is streaming attention over a bounded context: the voice prompt (shared by every slot,
computed once), the slot's most recent ``history_tokens`` codes (twice as many mel frames), and the
chunk itself (all positions see each other, as upstream's chunked inference does). Every per-slot
tensor is preallocated at ``[.., slots, ..]``; a call gathers the speaking rows, runs them in one batch
at fixed widths with masks for what is not there (history not yet filled, padding past ``n_out``),
and writes the rows back. Convolution caches take the last *valid* frames of each row, so a row's
result does not depend on the other rows or on the padding.

The DiT integrates ``flow_steps`` Euler steps of classifier-free-guided flow matching (cosine time
schedule) from a fixed noise table, read at each row's context length as upstream reads its
per-process random buffer. Its time embeddings and adaLN modulations depend only on the step, so
they are computed once.

Differences from upstream (``stepaudio2``): the history kept after the prompt is the most recent
``history_tokens`` codes for the encoder and ``2 * history_tokens`` frames for the DiT (upstream's
trim keeps the estimator cache's newest ``prompt`` and oldest 100 entries, as its cache is stored
newest-first); the noise tables are drawn from a fixed seed instead of per process.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from duplex.plugins.minicpmo.attention import fuse_biased_linears
from duplex.plugins.minicpmo.config import CODES_PER_UNIT, Token2WavConfig
from duplex.plugins.minicpmo.sampling import portable_normal
from duplex.plugins.minicpmo.token2wav_modules import TIME_EMBED_DIM, ConformerLayer, DiTBlock, FlowModel

__all__ = ["SILENCE_CODE", "CodeBuffer", "FlowStream", "Voice"]

NOISE_FRAMES = 30000  # the DiT's noise table: upstream's 600 s at 50 frames a second
NOISE_SEED = 0
SILENCE_CODE = 4218  # the S3 tokenizer's code for silence: three start every turn (upstream's duplex loop)
MIN_CHUNK_NEW = 5  # a chunk runs once at least this many codes wait beyond the look-ahead (upstream's rule)


class CodeBuffer:
    """The codes of one slot's turn that wait for the flow, and which chunks a unit's codes run.

    Upstream's duplex loop (``DuplexCapability._generate_waveform_from_tokens``, always flushing): the
    unit's codes join the buffer; while at least ``lookahead + MIN_CHUNK_NEW`` codes wait, the first
    ``min(lookahead + unit, waiting)`` run as a chunk and all but its last ``lookahead`` codes leave;
    when the turn ends here, what is left runs as the last chunk. Host-side lists: the code-to-wave
    stage reads a unit's codes to the host anyway (their number decides the audio's length).
    """

    def __init__(self, lookahead: int, unit: int = CODES_PER_UNIT) -> None:
        self.lookahead = lookahead
        self.unit = unit
        self.codes: list[int] = [SILENCE_CODE] * lookahead

    def reset(self) -> None:
        """A new turn: the three silence codes wait."""
        self.codes = [SILENCE_CODE] * self.lookahead

    def push(self, codes: list[int], last: bool) -> list[tuple[list[int], bool]]:
        """Append a unit's ``codes``; returns the chunks to run, in order, as ``(codes, last)``. After a
        last chunk the buffer is empty (``reset`` starts the next turn)."""
        buf = self.codes + list(codes)
        chunks: list[tuple[list[int], bool]] = []
        while len(buf) >= self.lookahead + MIN_CHUNK_NEW:
            n = min(self.lookahead + self.unit, len(buf))
            chunks.append((buf[:n], False))
            buf = buf[n - self.lookahead :]
        if last and buf:
            chunks.append((buf, True))
            buf = []
        self.codes = buf
        return chunks


@dataclass(frozen=True)
class Voice:
    """The voice prompt: its speech codes ``[n]``, its 24 kHz log-mel ``[2n, mel_bins]`` and its
    speaker embedding ``[speaker_dim]``. ``n == 0`` is the unprompted voice (zero embedding)."""

    tokens: torch.Tensor
    mel: torch.Tensor
    speaker: torch.Tensor


def _rel_table(size: int, lo: int, hi: int, device: torch.device) -> torch.Tensor:
    """Relative position encodings ``[hi - lo + 1, size]`` for distances ``lo..hi`` (query - key):
    ``sin`` in the even channels, ``cos`` in the odd ones (ESPnet's relative encoding)."""
    r = torch.arange(lo, hi + 1, dtype=torch.float32, device=device)[:, None]
    div = torch.exp(
        torch.arange(0, size, 2, dtype=torch.float32, device=device) * -(math.log(10000.0) / size)
    )
    table = torch.zeros(hi - lo + 1, size, device=device)
    table[:, 0::2] = torch.sin(r * div)
    table[:, 1::2] = torch.cos(r * div)
    return table


def _last_valid(seq: torch.Tensor, end: torch.Tensor, width: int, dim: int = 2) -> torch.Tensor:
    """Each row's ``width`` entries before ``end[b]`` along the time dimension ``dim`` of ``seq``: 2 for a
    channel-major ``[B, C, T]`` (``seq[b, :, end[b] - width : end[b]]``), 1 for a time-major ``[B, T, C]``."""
    idx = end[:, None] - width + torch.arange(width, device=seq.device)  # [B, width]
    idx = idx[:, None, :] if dim == 2 else idx[:, :, None]
    shape = list(seq.shape)
    shape[dim] = width
    return seq.gather(dim, idx.expand(shape))


def _causal_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """A valid 1-D convolution over time-major ``x [B, T + K - 1, C_in]`` -> ``[B, T, C_out]``, with
    ``weight [C_out, C_in * K]`` (a ``Conv1d`` weight flattened) as one matrix product over the
    ``K``-frame windows: two kernels, where cuDNN's convolution of the channel-major layout took three
    (two of them layout transposes) and the block two transposes more around it."""
    k = weight.shape[1] // x.shape[2]
    windows = x.unfold(1, k, 1)  # [B, T, C_in, K], a view
    return F.linear(windows.reshape(*windows.shape[:2], -1), weight, bias)


def _keep_index(hist_len: torch.Tensor, n: torch.Tensor, cap: int, width: int) -> torch.Tensor:
    """``[B, cap]``: where each entry of the new history comes from in ``history (cap) ++ chunk (width)``:
    the most recent ``cap`` of each row's ``hist_len`` history entries and ``n`` chunk entries, oldest
    first (the same for every layer, so computed once per chunk)."""
    total = hist_len + n
    start = total - total.clamp(max=cap)
    src = start[:, None] + torch.arange(cap, device=hist_len.device)
    idx = torch.where(src < hist_len[:, None], src, cap + src - hist_len[:, None])
    return idx.clamp(max=cap + width - 1)


def _compact(hist: torch.Tensor, chunk: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The new history ``[B, ..., cap, D]`` from ``hist [B, ..., cap, D]`` and ``chunk [B, ..., T, D]``."""
    both = torch.cat([hist, chunk], dim=-2)
    shape = [keep.shape[0]] + [1] * (both.dim() - 3) + [keep.shape[1], 1]
    return both.gather(-2, keep.view(shape).expand(*both.shape[:-2], keep.shape[1], both.shape[-1]))


def _norm_modulate(h: torch.Tensor, shift: torch.Tensor, scale1: torch.Tensor) -> torch.Tensor:
    """adaLN: ``layer_norm(h) * (1 + scale) + shift``, as the layer norm's own affine (one kernel, not
    four); ``scale1`` is ``1 + scale`` (precomputed: the modulations depend on the step only)."""
    return F.layer_norm(h, (h.shape[-1],), scale1, shift, eps=1e-6)


class _Context:
    """One batch's attention context for a stack of layers: prompt length, history and chunk validity."""

    def __init__(self, prompt: int, cap: int, hist_len: torch.Tensor, width: int, n: torch.Tensor) -> None:
        device = hist_len.device
        j = torch.arange(prompt + cap + width, device=device)
        in_hist = (j >= prompt) & (j < prompt + cap)
        in_chunk = j >= prompt + cap
        self.valid = (
            (j < prompt)[None]
            | (in_hist[None] & ((j - prompt)[None] < hist_len[:, None]))
            | (in_chunk[None] & ((j - prompt - cap)[None] < n[:, None]))
        )  # [B, S]
        key_pos = torch.where(in_chunk[None], prompt + hist_len[:, None] + (j - prompt - cap)[None], j[None])
        query_pos = prompt + hist_len[:, None] + torch.arange(width, device=device)[None]
        self.lo = -(width - 1)
        self.hi = prompt + cap + width - 1
        rel = query_pos[:, :, None] - key_pos[:, None, :]
        self.rel_index = (rel - self.lo).clamp(0, self.hi - self.lo)  # [B, T, S]


class FlowStream:
    """The flow stage with per-slot streaming state (see the module docstring)."""

    def __init__(
        self, model: FlowModel, cfg: Token2WavConfig, slots: int, voice: Voice, device: torch.device
    ) -> None:
        self.model = model
        self.cfg = cfg
        self.slots = slots
        self.device = device
        self.dtype = dtype = model.input_embedding.weight.dtype
        self.la = cfg.lookahead_tokens
        self.width = self.la + CODES_PER_UNIT  # the widest chunk (``CodeBuffer``)
        self.hist = cfg.history_tokens
        heads, size = cfg.encoder_heads, cfg.encoder_size
        dk = size // heads
        enc = model.encoder
        n_enc, n_up = len(enc.encoders), len(enc.up_encoders)

        def zeros(*shape: int) -> torch.Tensor:
            return torch.zeros(shape, device=device, dtype=dtype)

        steps, depth = cfg.flow_steps, cfg.dit_depth
        dh, hd, dsz = cfg.dit_heads, cfg.dit_head_dim, cfg.dit_size
        self.enc_k, self.enc_v = (
            zeros(n_enc, slots, heads, self.hist, dk),
            zeros(n_enc, slots, heads, self.hist, dk),
        )
        hm = 2 * self.hist
        self.up_k, self.up_v = zeros(n_up, slots, heads, hm, dk), zeros(n_up, slots, heads, hm, dk)
        self.est_k = zeros(steps, depth, slots, 2, dh, hm, hd)
        self.est_v = zeros(steps, depth, slots, 2, dh, hm, hd)
        self.est_conv = zeros(steps, depth, slots, 2, 2, 2, dsz)  # [.., cfg half, conv1/conv2 input, 2, C]
        self.pre_cache = zeros(slots, size, 2)
        self.up_cache = zeros(slots, size, 2 * cfg.up_rate)
        self.hist_len = torch.zeros(slots, dtype=torch.long, device=device)
        gen = np.random.default_rng(NOISE_SEED)  # the same table on every CPU (``portable_normal``)
        self.noise = portable_normal(gen, (cfg.mel_bins, NOISE_FRAMES), 1.0).to(device, dtype)
        # The Euler schedule, its time embeddings and every block's modulation depend on the step only.
        est = model.decoder.estimator
        span = 1 - torch.cos(torch.linspace(0, 1, steps + 1, dtype=torch.float32) * 0.5 * torch.pi)
        t, dt = span[0], span[1] - span[0]
        self.dts: list[float] = []
        temb = []
        for k in range(1, steps + 1):
            temb.append(self._time_embedding(t))
            self.dts.append(float(dt))
            t = t + dt
            if k < steps:
                dt = span[k + 1] - t
        with torch.no_grad():
            temb_t = torch.stack(temb).to(device, dtype)  # [steps, D]
            self.mods = torch.stack(
                [blk.adaLN_modulation[1](F.silu(temb_t)) for blk in est.blocks], dim=1
            ).view(steps, depth, 9, dsz)
            self.mods[:, :, [1, 4, 7]] += 1  # the scales as 1 + scale (``_norm_modulate``)
            self.final_mods = est.final_layer.adaLN_modulation[1](F.silu(temb_t)).view(steps, 2, dsz)
            self.final_mods[:, 1] += 1
        # Each block's q, k and v projections as one matrix product (the modules keep views).
        self._qkv = [fuse_biased_linears(b.attn.to_q, b.attn.to_k, b.attn.to_v) for b in est.blocks]
        # Each block's two causal convolutions as matrix products (``_causal_conv``; views of the weights).
        self._convs = [
            tuple((c.weight.detach().flatten(1), c.bias.detach()) for c in (b.conv.block[1], b.conv.block[6]))
            for b in est.blocks
        ]
        self._setup(voice)

    def _time_embedding(self, t: torch.Tensor) -> torch.Tensor:
        est = self.model.decoder.estimator
        half = TIME_EMBED_DIM // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
        args = (t * 1000)[None] * freqs
        emb = torch.cat([torch.cos(args), torch.sin(args)])[None].to(self.device, self.dtype)
        with torch.no_grad():
            return est.t_embedder.mlp(emb)[0]

    # -- the voice prompt -------------------------------------------------

    @torch.no_grad()
    def _setup(self, voice: Voice) -> None:
        """Run the prompt through the encoder and the DiT once: its keys, values and convolution caches
        become the start of every slot's stream (upstream's ``setup_cache``, with the prompt's first
        codes as the look-ahead of its last ones)."""
        cfg, dev, dt = self.cfg, self.device, self.dtype
        n = int(voice.tokens.shape[0])
        self.prompt_tokens = n
        heads, size = cfg.encoder_heads, cfg.encoder_size
        dk = size // heads
        steps, depth, dh, hd = cfg.flow_steps, cfg.dit_depth, cfg.dit_heads, cfg.dit_head_dim
        enc = self.model.encoder
        n_enc, n_up = len(enc.encoders), len(enc.up_encoders)
        self.speaker = self.model.spk_embed_affine_layer(F.normalize(voice.speaker.to(dev, dt)[None], dim=1))
        zeros = torch.zeros
        self.p_enc = (zeros(n_enc, 1, heads, 0, dk, device=dev, dtype=dt),) * 2
        self.p_up = (zeros(n_up, 1, heads, 0, dk, device=dev, dtype=dt),) * 2
        self.p_est = (zeros(steps, depth, 2, dh, 0, hd, device=dev, dtype=dt),) * 2
        self.p_pre_cache = zeros(size, 2, device=dev, dtype=dt)
        self.p_up_cache = zeros(size, 2 * cfg.up_rate, device=dev, dtype=dt)
        self.p_conv = zeros(steps, depth, 2, 2, 2, cfg.dit_size, device=dev, dtype=dt)
        if n == 0:
            return
        tokens = torch.cat([voice.tokens, voice.tokens[: self.la]])[None].to(dev)
        out = torch.tensor([n], device=dev)
        none = torch.zeros(1, dtype=torch.long, device=dev)
        empty = [zeros(1, heads, 0, dk, device=dev, dtype=dt)] * 2
        mu, (pre, up, enc_kv, up_kv) = self._encode(
            tokens,
            torch.tensor([n + self.la], device=dev),
            out,
            pre_cache=self.p_pre_cache[None],
            up_cache=self.p_up_cache[None],
            enc_ctx=([empty] * n_enc, none, 0, self.p_enc),
            up_ctx=([empty] * n_up, none, 0, self.p_up),
        )
        self.p_pre_cache, self.p_up_cache = pre[0], up[0]
        self.p_enc = tuple(torch.stack([kv[j][:, :, :n] for kv in enc_kv]) for j in (0, 1))
        self.p_up = tuple(torch.stack([kv[j][:, :, : 2 * n] for kv in up_kv]) for j in (0, 1))
        cond = F.pad(voice.mel.to(dev, dt).T[None], (0, mu.shape[2] - 2 * n))
        _, est_kv, conv = self._estimate(
            mu,
            out * 2,
            cond,
            noise_start=none,
            rows=None,
            hist_len=none,
            conv=self.p_conv[:, :, None],
        )
        assert est_kv is not None
        self.p_est = tuple(
            torch.stack([torch.stack([kv[j][:, :, : 2 * n] for kv in row]) for row in est_kv]) for j in (0, 1)
        )  # [steps, depth, cfg half, heads, 2n, head_dim]
        self.p_conv = conv[:, :, 0]

    def reset(self, slot: int) -> None:
        """Start ``slot``'s stream at the end of the voice prompt (a new turn; its codes, the three
        silence codes first, are the caller's ``CodeBuffer``)."""
        self.hist_len[slot] = 0
        self.pre_cache[slot] = self.p_pre_cache
        self.up_cache[slot] = self.p_up_cache
        self.est_conv[:, :, slot] = self.p_conv

    # -- one chunk --------------------------------------------------------

    @torch.no_grad()
    def chunk(
        self, rows: torch.Tensor, tokens: torch.Tensor, count: torch.Tensor, last: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One chunk of ``count [B]`` codes (``tokens [B, width]``, zero past ``count``) for the rows
        ``rows [B]``: mel ``[B, mel_bins, 2 * width]`` and each row's number of valid frames ``[B]``.
        ``last [B]`` (bool): the turn ends with this chunk (no look-ahead: every code yields mel);
        otherwise the chunk's last ``lookahead`` codes only look ahead. ``CodeBuffer`` says which
        chunks run; a non-last chunk needs ``count > lookahead``.

        Fixed shapes, no host reads: capturable (``token2wav`` replays it from a CUDA graph)."""
        w = self.width
        if tokens.shape[1] != w:
            raise ValueError(f"expected chunks of width {w}, got {tuple(tokens.shape)}")
        n_out = count - torch.where(last, 0, self.la)
        hist_len = self.hist_len[rows]
        mu, (pre, up, enc_kv, up_kv) = self._encode(
            tokens,
            count,
            n_out,
            pre_cache=self.pre_cache[rows],
            up_cache=self.up_cache[rows],
            enc_ctx=(self._rows(self.enc_k, self.enc_v, rows), hist_len, self.hist, self.p_enc),
            up_ctx=(self._rows(self.up_k, self.up_v, rows), hist_len * 2, 2 * self.hist, self.p_up),
        )
        self.pre_cache[rows], self.up_cache[rows] = pre, up
        keep = _keep_index(hist_len, n_out, self.hist, w)
        for i, (k, v) in enumerate(enc_kv):
            self.enc_k[i, rows] = _compact(self.enc_k[i, rows], k, keep)
            self.enc_v[i, rows] = _compact(self.enc_v[i, rows], v, keep)
        keep = _keep_index(hist_len * 2, n_out * 2, 2 * self.hist, 2 * w)
        for i, (k, v) in enumerate(up_kv):
            self.up_k[i, rows] = _compact(self.up_k[i, rows], k, keep)
            self.up_v[i, rows] = _compact(self.up_v[i, rows], v, keep)
        mel, _, conv = self._estimate(
            mu,
            n_out * 2,
            torch.zeros_like(mu),
            noise_start=(self.prompt_tokens + hist_len) * 2,
            rows=rows,
            hist_len=hist_len * 2,
            conv=self.est_conv[:, :, rows],
        )
        self.est_conv[:, :, rows] = conv
        self.hist_len[rows] = (hist_len + n_out).clamp(max=self.hist)
        return mel, 2 * n_out

    @staticmethod
    def _rows(k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor) -> list[list[torch.Tensor]]:
        return [[k[i, rows], v[i, rows]] for i in range(k.shape[0])]

    # -- the encoder ------------------------------------------------------

    def _embed(self, embed: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        return embed.out(x) * math.sqrt(self.cfg.encoder_size)

    def _encode(
        self,
        tokens: torch.Tensor,
        count: torch.Tensor,
        n_out: torch.Tensor,
        *,
        pre_cache: torch.Tensor,
        up_cache: torch.Tensor,
        enc_ctx: tuple[list[list[torch.Tensor]], torch.Tensor, int, tuple[torch.Tensor, torch.Tensor]],
        up_ctx: tuple[list[list[torch.Tensor]], torch.Tensor, int, tuple[torch.Tensor, torch.Tensor]],
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, list, list]]:
        """Codes ``tokens [B, W]`` (``count`` valid) -> ``mu [B, mel, up_rate * W]`` (``up_rate * n_out``
        frames valid, the rest zero) and the new caches: the tails of the look-ahead and upsampling
        convolutions, each layer's chunk keys/values. A context is ``(per-layer history [k, v],
        history length, history capacity, prompt (k, v) [layers, 1, H, P, dk])``."""
        enc, la = self.model.encoder, self.la
        width = tokens.shape[1]
        x = self._embed(enc.embed, self.model.input_embedding(tokens))
        x = x * (torch.arange(width, device=x.device)[None] < count[:, None])[..., None]
        look = enc.pre_lookahead_layer
        h1 = F.leaky_relu(look.conv1(F.pad(x, (0, 0, 0, la)).transpose(1, 2)))
        both = torch.cat([pre_cache, h1], dim=2)
        new_pre = _last_valid(both, n_out + 2, 2)
        x = look.conv2(both).transpose(1, 2) + x
        x, enc_kv = self._conformer(enc.encoders, x, *enc_ctx, n_out)
        rate = self.cfg.up_rate
        xs = F.interpolate(x.transpose(1, 2), scale_factor=float(rate), mode="nearest")
        both = torch.cat([up_cache, xs], dim=2)
        new_up = _last_valid(both, n_out * rate + up_cache.shape[2], up_cache.shape[2])
        x = self._embed(enc.up_embed, enc.up_layer.conv(both).transpose(1, 2))
        x, up_kv = self._conformer(enc.up_encoders, x, *up_ctx, n_out * rate)
        mu = self.model.encoder_proj(enc.after_norm(x)).transpose(1, 2)
        valid = torch.arange(mu.shape[2], device=mu.device)[None] < (n_out * rate)[:, None]
        return mu * valid[:, None], (new_pre, new_up, enc_kv, up_kv)

    def _conformer(
        self,
        layers: torch.nn.ModuleList,
        x: torch.Tensor,
        hist_kv: list[list[torch.Tensor]],
        hist_len: torch.Tensor,
        cap: int,
        prompt: tuple[torch.Tensor, torch.Tensor],
        n: torch.Tensor,
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Conformer layers over ``x [B, T, C]`` attending to prompt + history + the chunk (``n`` valid),
        with relative positions counted in that sequence (the chunk's queries at its end)."""
        b, t, size = x.shape
        heads = self.cfg.encoder_heads
        dk = size // heads
        ctx = _Context(prompt[0].shape[3], cap, hist_len, t, n)
        table = _rel_table(size, ctx.lo, ctx.hi, x.device).to(x.dtype)
        mask = ctx.valid[:, None, None, :]
        index = ctx.rel_index[:, None].expand(b, heads, t, -1)
        chunk_kv = []
        for i, layer in enumerate(layers):
            assert isinstance(layer, ConformerLayer)
            att = layer.self_attn
            h = layer.norm_mha(x)
            q = att.linear_q(h).view(b, t, heads, dk).transpose(1, 2)
            k = att.linear_k(h).view(b, t, heads, dk).transpose(1, 2)
            v = att.linear_v(h).view(b, t, heads, dk).transpose(1, 2)
            chunk_kv.append((k, v))
            keys = torch.cat([prompt[0][i].expand(b, -1, -1, -1), hist_kv[i][0], k], dim=2)
            values = torch.cat([prompt[1][i].expand(b, -1, -1, -1), hist_kv[i][1], v], dim=2)
            ac = (q + att.pos_bias_u[None, :, None]) @ keys.transpose(-2, -1)
            pos = att.linear_pos(table).view(-1, heads, dk).permute(1, 2, 0)  # [H, dk, distances]
            bd = ((q + att.pos_bias_v[None, :, None]) @ pos).gather(-1, index)
            scores = ((ac + bd) / math.sqrt(dk)).masked_fill(~mask, float("-inf"))
            o = torch.softmax(scores, dim=-1) @ values
            x = x + att.linear_out(o.transpose(1, 2).reshape(b, t, size))
            ff = layer.feed_forward
            x = x + ff.w_2(F.silu(ff.w_1(layer.norm_ff(x))))
        return x, chunk_kv

    # -- the DiT ----------------------------------------------------------

    def _estimate(
        self,
        mu: torch.Tensor,
        frames: torch.Tensor,
        cond: torch.Tensor,
        *,
        noise_start: torch.Tensor,
        rows: torch.Tensor | None,
        hist_len: torch.Tensor,
        conv: torch.Tensor,
    ) -> tuple[torch.Tensor, list[list[tuple[torch.Tensor, torch.Tensor]]] | None, torch.Tensor]:
        """Integrate the flow from noise to mel for ``mu [B, mel, T]`` (``frames`` valid per row).

        ``rows``: the slots whose history the DiT attends to and updates in place (``None``: no
        history, the prompt's own pass, whose chunk keys/values are returned per step and block);
        ``conv [steps, depth, B, 2, 2, 2, C]``: the convolution caches. Returns the mel (zero past
        ``frames``), the keys/values (prompt pass only) and the new convolution caches.
        """
        cfg = self.cfg
        b, _, t = mu.shape
        est = self.model.decoder.estimator
        idx = noise_start[:, None] + torch.arange(t, device=mu.device)
        x = self.noise[:, idx].permute(1, 0, 2)  # [B, mel, T]
        spk = self.speaker.expand(b, -1)[:, :, None].expand(-1, -1, t)
        zero = torch.zeros_like(mu)
        static = torch.cat(
            [torch.cat([mu, spk, cond], dim=1), torch.cat([zero, torch.zeros_like(spk), zero], dim=1)], dim=0
        )
        prompt_len = self.p_est[0].shape[4]
        cap = 2 * self.hist if rows is not None else 0
        j = torch.arange(prompt_len + cap + t, device=mu.device)
        in_hist = (j >= prompt_len) & (j < prompt_len + cap)
        in_chunk = j >= prompt_len + cap
        keys_ok = (
            (j < prompt_len)[None]
            | (in_hist[None] & ((j - prompt_len)[None] < hist_len[:, None]))
            | (in_chunk[None] & ((j - prompt_len - cap)[None] < frames[:, None]))
        )
        mask = keys_ok.repeat(2, 1)[:, None, None, :]
        frames2 = frames.repeat(2)
        keep = _keep_index(hist_len, frames, cap, t) if rows is not None else None
        new_conv = conv.clone()
        collected: list[list[tuple[torch.Tensor, torch.Tensor]]] | None = [] if rows is None else None
        for step in range(cfg.flow_steps):
            h = est.in_proj(torch.cat([torch.cat([x, x], dim=0), static], dim=1).transpose(1, 2))
            kvs = []
            for layer, block in enumerate(est.blocks):
                assert isinstance(block, DiTBlock)
                h, kv, new_conv[step, layer] = self._block(
                    block, h, step, layer, mask, rows, frames2, new_conv[step, layer]
                )
                kvs.append(kv)
            if collected is not None:
                collected.append(kvs)
            elif rows is not None and keep is not None:
                self._keep_history(step, rows, kvs, keep)
            shift, scale = self.final_mods[step]
            out = est.final_layer.linear(_norm_modulate(h, shift, scale))
            guided, free = out.transpose(1, 2).chunk(2, dim=0)
            x = x + self.dts[step] * ((1.0 + cfg.cfg_rate) * guided - cfg.cfg_rate * free)
        valid = torch.arange(t, device=mu.device)[None] < frames[:, None]
        return x * valid[:, None], collected, new_conv

    def _keep_history(
        self, step: int, rows: torch.Tensor, kvs: list[tuple[torch.Tensor, torch.Tensor]], keep: torch.Tensor
    ) -> None:
        """The rows' new history of every block of ``step``, from the blocks' chunk keys and values: one
        compaction for the step's blocks together (a block's history is read only by that block, so the
        update waits for the step's end), not one per block (six kernels each, 160 blocks a chunk)."""
        b, depth = rows.shape[0], len(kvs)
        for cache, j in ((self.est_k, 0), (self.est_v, 1)):
            chunk = torch.stack([kv[j] for kv in kvs])  # [depth, 2B, H, T, D], guided rows first
            chunk = chunk.view(depth, 2, b, *chunk.shape[2:]).permute(2, 0, 1, 3, 4, 5)  # [B, depth, 2, ..]
            hist = cache[step][:, rows].movedim(1, 0)  # [B, depth, 2, H, cap, D]
            cache[step][:, rows] = _compact(hist, chunk, keep).movedim(0, 1)

    def _block(
        self,
        block: DiTBlock,
        h: torch.Tensor,
        step: int,
        layer: int,
        mask: torch.Tensor,
        rows: torch.Tensor | None,
        frames2: torch.Tensor,
        conv: torch.Tensor,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        """One DiT block over ``h [2B, T, C]`` (the guided rows, then the unguided ones), attending to
        the rows' history of this step and block; returns the chunk's keys and values (``[2B, H, T, D]``
        each, for ``_keep_history``). ``conv [B, 2, 2, 2, C]`` (per guidance half, the two convolutions'
        input tails) -> the new tails."""
        cfg = self.cfg
        b2, t, size = h.shape
        b = b2 // 2
        heads, hd = cfg.dit_heads, cfg.dit_head_dim
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m, shift_c, scale_c, gate_c = self.mods[step, layer]
        att = block.attn
        a = _norm_modulate(h, shift_a, scale_a)
        q, k, v = F.linear(a, *self._qkv[layer]).view(b2, t, 3, heads, hd).unbind(2)
        q = att.q_norm(q).transpose(1, 2)
        k = att.k_norm(k).transpose(1, 2)
        v = v.transpose(1, 2)

        # Keys and values as [cfg half, B, H, prompt + history + chunk, D], written by one ``cat`` from
        # views: the prompt's expanded over the rows, the rows' history, the chunk's (no copy before it).
        def context(prompt: torch.Tensor, hist: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
            parts = [prompt[step, layer][:, None].expand(-1, b, -1, -1, -1)]
            if rows is not None:
                parts.append(hist[step, layer, rows].transpose(0, 1))
            parts.append(new.view(2, b, *new.shape[1:]))
            return torch.cat(parts, dim=3).flatten(0, 1)

        keys, values = context(self.p_est[0], self.est_k, k), context(self.p_est[1], self.est_v, v)
        o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        h = torch.addcmul(h, gate_a, att.proj(o.transpose(1, 2).reshape(b2, t, heads * hd)))
        # The causal convolution block; each row keeps the last two valid input frames of both convs.
        # Time-major throughout (``h``'s own layout): no transposes around the convolutions.
        cache = conv.transpose(0, 1).flatten(0, 1)  # [2B, conv1/conv2, 2, C]
        (w1, b1), (w2, b2) = self._convs[layer]
        both1 = torch.cat([cache[:, 0], _norm_modulate(h, shift_c, scale_c)], dim=1)
        y = F.mish(block.conv.block[3](_causal_conv(both1, w1, b1)))
        both2 = torch.cat([cache[:, 1], y], dim=1)
        h = torch.addcmul(h, gate_c, _causal_conv(both2, w2, b2))
        ends = frames2 + 2
        tails = torch.stack([_last_valid(both1, ends, 2, dim=1), _last_valid(both2, ends, 2, dim=1)], dim=1)
        m = _norm_modulate(h, shift_m, scale_m)
        h = torch.addcmul(h, gate_m, block.mlp.fc2(F.gelu(block.mlp.fc1(m), approximate="tanh")))
        return h, (k, v), tails.view(2, b, 2, 2, size).transpose(0, 1)
