"""The system-prompt phases of a PersonaPlex session, as a script of forced frames.

Before a conversation starts, PersonaPlex is conditioned on a voice and a persona,
in four phases; every token of every phase is given, none is sampled:

1. **voice prompt**: either a voice file of per-position input embeddings
   (``voices/NAME.pt``: ``{"embeddings": [V, dim], "cache": [1, 17, CT]}``;
   they replace the token embeddings of positions ``0..V-1``, and the token
   cache supplies the delayed streams of the voice's last frame), or a WAV
   recording (``voices/NAME.wav``), loudness-normalised, Mimi-encoded and
   given as agent codes with text PAD and the user's sine filler;
2. **0.5 s of silence**: 6 frames of agent ``SILENCE_TOKENS``, text PAD, user ``SINE_TOKENS``;
3. **the persona**: the sentencepiece tokens of ``"<system> {instructions} <system>"``
   (``persona_text``: stripped, and not tagged again if already tagged), one per frame, with
   agent silence and user sine;
4. **0.5 s of silence** again.

``build_prompt`` returns the frames ``[P, 17]`` (frame coordinates:
``[text, agent x 8, user x 8]`` of each frame) and the voice embeddings; the
generator turns them into input columns and runs them in one prefill.

In a ``.pt`` voice's token cache ``[1, 17, CT]``, the column of position ``V``
(``V`` = number of embedding frames) is ``cache[0, :, V % CT]``: this is the
layout of a ring-buffer token cache written while the voice was recorded.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from duplex.plugins.personaplex.config import PersonaPlexConfig

__all__ = ["PromptScript", "VoicePrompt", "build_prompt", "persona_text"]


@dataclass
class VoicePrompt:
    """A loaded voice: embeddings plus the last frame's delayed tokens, or agent codes from a WAV."""

    name: str
    embeddings: torch.Tensor | None = None  # [V, dim]
    last_frame: torch.Tensor | None = None  # [17] tokens of frame V-1 (delay-1 streams are used)
    codes: torch.Tensor | None = None  # [8, V] agent codes (WAV voices)

    @property
    def num_frames(self) -> int:
        if self.embeddings is not None:
            return int(self.embeddings.shape[0])
        assert self.codes is not None
        return int(self.codes.shape[1])


@dataclass
class PromptScript:
    """The frames of a slot's system prompt, ready for ``BatchedGenerator.start_slot``.

    ``tokens [P, 17]`` int64 in frame coordinates; ``embeddings [V, dim]`` replace
    the input embeddings of positions ``0..V-1`` (``None`` without a ``.pt`` voice).
    ``phases`` names the phase of each frame (for tests and logs).
    """

    tokens: torch.Tensor
    embeddings: torch.Tensor | None
    phases: tuple[str, ...]


SYSTEM_TAG = "<system>"


def persona_text(instructions: str) -> str:
    """The persona prompt as PersonaPlex reads it: the stripped text between ``<system>`` tags,
    unless it already begins and ends with one (then it is kept as it is, not tagged twice)."""
    text = instructions.strip()
    if text.startswith(SYSTEM_TAG) and text.endswith(SYSTEM_TAG):
        return text
    return f"{SYSTEM_TAG} {text} {SYSTEM_TAG}"


def _filler_frame(cfg: PersonaPlexConfig, text: int) -> list[int]:
    return [text, *cfg.silence_tokens, *cfg.sine_tokens]


def build_prompt(
    cfg: PersonaPlexConfig,
    voice: VoicePrompt | None,
    text_tokens: list[int],
) -> PromptScript:
    """Lay out the four prompt phases as forced frames (see the module docstring).

    ``text_tokens`` are the tokenizer's ids of ``persona_text(instructions)``.
    """
    A = cfg.num_audio_codebooks
    frames: list[list[int]] = []
    phases: list[str] = []
    embeddings = None
    if voice is not None and voice.embeddings is not None:
        V = voice.num_frames
        filler = [-1] * cfg.num_streams
        frames.extend([list(filler) for _ in range(V)])
        if voice.last_frame is not None and V > 0:
            # Only the delayed streams of the voice's last frame reach the first
            # column after the embeddings; a negative id (never generated) is "no token".
            frames[-1] = [
                max(int(t), -1) if d == 1 else -1
                for t, d in zip(voice.last_frame.tolist(), cfg.delays, strict=True)
            ]
        phases.extend(["voice"] * V)
        embeddings = voice.embeddings
    elif voice is not None and voice.codes is not None:
        codes = voice.codes
        assert codes.shape[0] == A, f"voice codes should be [{A}, V], got {tuple(codes.shape)}"
        for f in range(codes.shape[1]):
            frames.append([cfg.text_pad, *(int(c) for c in codes[:, f].tolist()), *cfg.sine_tokens])
        phases.extend(["voice"] * codes.shape[1])
    silence = [_filler_frame(cfg, cfg.text_pad) for _ in range(cfg.prompt_silence_frames)]
    frames.extend(silence)
    phases.extend(["silence"] * len(silence))
    for tok in text_tokens:
        frames.append(_filler_frame(cfg, int(tok)))
        phases.append("text")
    frames.extend(_filler_frame(cfg, cfg.text_pad) for _ in range(cfg.prompt_silence_frames))
    phases.extend(["silence"] * cfg.prompt_silence_frames)
    tokens = torch.tensor(frames, dtype=torch.long)
    assert tokens.shape[1] == cfg.num_streams
    return PromptScript(tokens=tokens, embeddings=embeddings, phases=tuple(phases))
