"""PersonaPlex as its vendor runs it, rebuilt on stock moshi 0.2.13: the parity tests' reference.

The vendor's code is the public repository NVIDIA/personaplex at commit
3428dfd95309a7f3c84fd93259ded0f810d1ff91 (``moshi/moshi/server.py``, ``offline.py`` and the
``LMGen`` of ``moshi/moshi/models/lm.py``: a fork of moshi that is not on PyPI). None of it is
copied or imported here: its rules for a session are restated below in our own words, and run on
the PyPI package ``moshi==0.2.13`` (``loaders.get_moshi_lm`` and ``loaders.get_mimi``, which load
strictly; the stock ``LMGen`` with ``use_sampling=False``; Mimi), the same release the plugin is
built on.

The vendor's rules:

1. **The persona.** The text is stripped; if it already begins and ends with ``<system>`` it is
   kept as it is, otherwise it becomes ``"<system> " + text + " <system>"``. Its sentencepiece ids
   are the prompt's text. (An empty persona has no prompt text and the vendor's prompt loop fails
   on it; the plugin never sends one here.)
2. **The system prompt**, position by position, with a voice file ``{"embeddings": [V, ...],
   "cache": [1, 17, W]}`` (the state of the vendor's token ring, ``W`` columns, after it recorded
   the voice): positions ``0..V-1`` read the stored embeddings instead of token embeddings;
   position ``V`` reads the whole ring column ``V % W``; then come 0.5 s of silence (6 frames of
   text PAD, agent ``SILENCE_TOKENS``, user ``SINE_TOKENS``), the persona's ids one a frame (agent
   silence, user sine), and 0.5 s of silence again, as frames: a frame's delay-0 streams go into
   the column of its own position and its delay-1 streams into the next one's; the delay-1
   streams of position ``V + 1`` are those of ring column ``(V + 1) % W``. Every token of every
   column is given; nothing sampled in the prompt is kept. ``P`` positions in all.
3. **The conversation.** Each call of the vendor's step is given one 80 ms frame of the user's
   audio, Mimi-encoded, and writes its codes into the column *after* the one it runs (the user's
   delay-0 codebook into the next column, the delay-1 ones into the one after that). So call
   ``i`` runs position ``P - 1 + i`` and returns that position's frame: call 0 returns the
   prompt's last frame (silence, all given), and call ``i + 1`` the frame that hears the user's
   frame ``i``. The text and the agent's codebooks of the positions after the prompt are sampled
   (greedy here), each depformer codebook fed the one chosen before it. One Mimi, reset after the
   prompt, encodes the user's frames and decodes every returned frame, the first included.

Driving stock ``LMGen`` to those rules. PersonaPlex's checkpoint has 16 depformer steps (the
agent's 8 codebooks, then its guess of the user's 8), so stock ``LMGen`` takes no user stream and
writes its own 17 tokens into the next column of its token ring (``state.cache``, 3 columns wide)
after each step. The reference writes what the vendor would have there before each step: a whole
prompt column during the prompt; after it, the user's codes over the depformer's guesses, and,
in the first column after the prompt, the prompt's last delay-1 agent tokens over its samples.
Stock ``LMGen`` reads no embeddings, so the voice's positions run through the language model's
temporal transformer directly (the only part of a step that keeps state) and its position counters
are moved past them. Logits and the columns the transformer reads are observed with forward hooks
(``testing.LogitWatch``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from moshi.models import loaders
from moshi.models.lm import LMGen
from moshi.utils.compile import no_compile

from duplex.plugins.personaplex.config import PersonaPlexConfig
from duplex.plugins.personaplex.loading import LM_FILE, MIMI_FILE
from duplex.plugins.personaplex.testing import LogitWatch

__all__ = ["UPSTREAM_COMMIT", "Frame", "Upstream", "UpstreamPrompt", "system_prompt", "wrap_with_system_tags"]

UPSTREAM_COMMIT = "3428dfd95309a7f3c84fd93259ded0f810d1ff91"


def wrap_with_system_tags(text: str) -> str:
    """Rule 1 of the module docstring."""
    stripped = text.strip()
    if stripped.startswith("<system>") and stripped.endswith("<system>"):
        return stripped
    return f"<system> {stripped} <system>"


@dataclass
class UpstreamPrompt:
    """Rule 2: ``embeddings [V, D]`` of positions ``0..V-1``, ``columns [P - V, 17]`` of positions
    ``V..P-1``, and ``last_frame [17]``, the prompt's last frame (its delay-1 streams go into
    position ``P``)."""

    embeddings: torch.Tensor
    columns: torch.Tensor
    last_frame: torch.Tensor

    @property
    def length(self) -> int:
        return int(self.embeddings.shape[0] + self.columns.shape[0])


def system_prompt(
    cfg: PersonaPlexConfig, voice: dict[str, torch.Tensor], persona: list[int]
) -> UpstreamPrompt:
    """The prompt of rule 2 for a voice file's contents and the persona's ids."""
    dim = int(cfg.lm["dim"])
    embeddings = voice["embeddings"].reshape(-1, dim)
    ring = voice["cache"].reshape(cfg.num_streams, -1).to(torch.long)
    V, W = int(embeddings.shape[0]), int(ring.shape[1])
    silence = [cfg.text_pad, *cfg.silence_tokens, *cfg.sine_tokens]
    frames = [silence] * cfg.prompt_silence_frames
    frames += [[int(t), *silence[1:]] for t in persona]
    frames += [silence] * cfg.prompt_silence_frames
    delayed = [d == 1 for d in cfg.delays]
    columns = [ring[:, V % W].tolist()]
    before = ring[:, (V + 1) % W].tolist()  # the delay-1 streams of position V + 1
    for frame in frames:
        columns.append([before[k] if delayed[k] else frame[k] for k in range(cfg.num_streams)])
        before = frame
    return UpstreamPrompt(embeddings, torch.tensor(columns, dtype=torch.long), torch.tensor(frames[-1]))


@dataclass
class Frame:
    """One call's observations: the column the transformer read, the frame returned (text token,
    the agent's 8 codes), the Mimi codes of the user frame it was given and their latent (``None``
    past the audio), the text logits and the agent's 8 depformer logits of the step, and the PCM
    of the returned frame."""

    column: list[int]
    text: int
    agent: list[int]
    user_codes: list[int] | None
    text_logits: np.ndarray
    agent_logits: np.ndarray
    pcm: np.ndarray
    latent: torch.Tensor | None


class Upstream:
    """The checkpoint under ``root`` in stock moshi, one session at a time (as the vendor's server
    runs them), in float32 on the CPU."""

    def __init__(self, root: Path, cfg: PersonaPlexConfig) -> None:
        self.cfg = cfg
        # The published layout: all 16 depformer steps, loaded strictly by moshi's own loaders.
        self.lm = loaders.get_moshi_lm(
            root / LM_FILE, lm_kwargs=dict(cfg.lm), device="cpu", dtype=torch.float32
        )
        self.mimi = loaders.get_mimi(root / MIMI_FILE, dict(cfg.mimi), device="cpu", num_codebooks=8)
        self.gen = LMGen(self.lm, use_sampling=False)
        self.A = cfg.num_audio_codebooks
        self.watch = LogitWatch(self.lm, self.A)

    @torch.no_grad()
    def run(self, prompt: UpstreamPrompt, audio: list[np.ndarray]) -> list[Frame]:
        """Rules 2 and 3 for one session: the prompt, then ``len(audio) + 1`` calls (the last one
        hears the last frame). Returns one ``Frame`` per call."""
        A, K = self.A, self.cfg.num_streams
        user = slice(1 + A, K)
        delayed = torch.tensor([d == 1 for d in self.cfg.delays])
        none = torch.zeros(1, 0, 1, dtype=torch.long)  # stock LMGen takes no user stream here
        out: list[Frame] = []
        # Eager, as the plugin runs on a CPU (moshi would compile a few layers on first use).
        with no_compile(), self.gen.streaming(1), self.mimi.streaming(1):
            state = self.gen._streaming_state
            ring = state.cache.shape[-1]
            V = int(prompt.embeddings.shape[0])
            for e in prompt.embeddings:
                self.lm.transformer(e.view(1, 1, -1).to(torch.float32))
            state.offsets.fill_(V)
            state.offset_cpu = V
            # Positions V..P-2: the prompt's columns; P-1 is run by the conversation's first call.
            for col in prompt.columns[:-1]:
                state.cache[0, :, int(state.offsets[0]) % ring] = col
                self.gen.step(none)
            codes: list[torch.Tensor] = []
            last_delayed = torch.where(delayed, prompt.last_frame, torch.zeros_like(prompt.last_frame))
            for i in range(len(audio) + 1):
                position = int(state.offsets[0]) % ring
                if i == 0:
                    state.cache[0, :, position] = prompt.columns[-1]
                else:
                    col = state.cache[0, :, position]
                    before = codes[i - 2] if i >= 2 else last_delayed[user]
                    col[user] = torch.where(delayed[user], before, codes[i - 1])
                user_codes, latent = None, None
                if i < len(audio):
                    # Mimi.encode, in its two halves so that the latent can be kept.
                    frame = torch.from_numpy(audio[i]).view(1, 1, -1)
                    latent = self.mimi._encode_to_unquantized_latent(frame)
                    codes.append(self.mimi.quantizer.encode(latent)[0, :, 0])
                    user_codes = codes[-1].tolist()
                self.watch.arm()
                tokens = self.gen.step(none)
                assert tokens is not None
                if i == 0:
                    # The prompt's last frame is given whole: its delay-1 agent streams, in the
                    # column after it, replace the depformer's samples there and in the frame returned.
                    agent = slice(1, 1 + A)
                    col = state.cache[0, :, int(state.offsets[0]) % ring]
                    col[agent] = torch.where(delayed[agent], last_delayed[agent], col[agent])
                    given = torch.where(delayed[agent], last_delayed[agent], tokens[0, agent, 0])
                    tokens[0, agent, 0] = given
                pcm = self.mimi.decode(tokens[:, 1 : 1 + A])
                seen = self.watch.take()
                out.append(
                    Frame(
                        column=seen.column[0].tolist(),
                        text=int(tokens[0, 0, 0]),
                        agent=tokens[0, 1 : 1 + A, 0].tolist(),
                        user_codes=user_codes,
                        text_logits=seen.text[0],
                        agent_logits=seen.agent[0],
                        pcm=pcm[0, 0].float().numpy(),
                        latent=latent,
                    )
                )
        return out

    @torch.no_grad()
    def code_margins(self, latent: torch.Tensor) -> list[float]:
        """For each of the 8 codebooks, how much nearer the chosen centroid is than the next one
        (the residual vector quantizers' walk, as Mimi's quantizer encodes ``latent [1, D, 1]``)."""
        margins = []
        quantizer = self.mimi.quantizer
        for rvq in (quantizer.rvq_first, quantizer.rvq_rest):
            residual = rvq.input_proj(latent)
            for layer in rvq.vq.layers[: rvq.n_q]:
                dist = torch.cdist(residual[0].T[None], layer._codebook.embedding[None])[0, 0]
                two = dist.topk(2, largest=False).values
                margins.append(float(two[1] - two[0]))
                residual = residual - layer.decode(layer.encode(residual))
        return margins
