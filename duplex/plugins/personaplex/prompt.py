"""The system-prompt phases of a PersonaPlex session, as a script of forced frames.

Before a conversation starts, PersonaPlex is conditioned on a voice and a persona,
in four phases; every token of every phase is given, none is sampled:

1. **voice prompt**: either a voice file of per-position input embeddings
   (``voices/NAME.pt``: ``{"embeddings": [V, dim], "cache": [1, 17, CT]}``;
   they replace the token embeddings of positions ``0..V-1``, position ``V``
   reads the token cache's whole column of that position, and the cache's next
   column supplies the delayed streams of position ``V + 1``: ``V + 1``
   positions in all), or a WAV recording (``voices/NAME.wav``),
   loudness-normalised, Mimi-encoded and given as agent codes with text PAD and
   the user's sine filler;
2. **0.5 s of silence**: 6 frames of agent ``SILENCE_TOKENS``, text PAD, user ``SINE_TOKENS``;
3. **the persona**: the sentencepiece tokens of ``"<system> {instructions} <system>"``
   (``persona_text``: stripped, and not tagged again if already tagged), one per frame, with
   agent silence and user sine;
4. **0.5 s of silence** again.

``build_prompt`` returns the frames ``[P, 17]`` (frame coordinates:
``[text, agent x 8, user x 8]`` of each frame) and the voice embeddings; the
generator turns them into input columns and runs them in one prefill.

A ``.pt`` voice is the state PersonaPlex's own generator was in after it
recorded the voice: ``V`` embeddings of the positions it ran, and its token
cache, a ring of ``CT`` columns (4 in the published voices) in which the column
of position ``p`` is ``cache[0, :, p % CT]``. Replaying it, PersonaPlex runs the
embeddings, then reads position ``V`` from the cache whole (the voice's last
frame: its delay-0 streams and its predecessor's delay-1 streams), and the
delay-1 streams that go with the first silence frame at ``V + 1`` are those of
the cache's next column. In frame coordinates that is one more voice frame,
frame ``V``, after the ``V`` embedding frames.
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
    last_frame: torch.Tensor | None = None  # [17] the cache's column of position V (read whole)
    next_frame: torch.Tensor | None = None  # [17] its column of position V+1 (delay-1 streams used)
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
        assert voice.last_frame is not None and voice.next_frame is not None, "a .pt voice has its cache"
        frames.extend([[-1] * cfg.num_streams for _ in range(V)])  # their embeddings are read instead
        column_v, column_next = voice.last_frame.tolist(), voice.next_frame.tolist()
        delayed = [d == 1 for d in cfg.delays]
        if V > 0:  # the delayed streams of position V come from frame V-1
            frames[-1] = [int(t) if late else -1 for t, late in zip(column_v, delayed, strict=True)]
        # Frame V: position V's own streams, and the delayed streams of position V+1.
        pairs = zip(column_v, column_next, delayed, strict=True)
        frames.append([int(b if late else a) for a, b, late in pairs])
        phases.extend(["voice"] * (V + 1))
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
