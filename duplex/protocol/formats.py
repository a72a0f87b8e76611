"""Audio formats: every accepted spelling, normalised to one ``AudioFormat``.

Clients name formats in three generations:

* GA objects: ``{"type": "audio/pcm", "rate": 24000}``, ``{"type": "audio/pcmu"}``,
  ``{"type": "audio/pcma"}``;
* legacy strings: ``pcm16``, ``pcm_s16le``, ``s16le``, ``pcm_f32le``, ``g711_ulaw``, ``g711_alaw``, ``wav``
  (and their ``audio/...`` and dashed variants);
* vLLM-Omni objects: ``{"format": "pcm16", "sample_rate_hz": 16000}``.

``parse_format`` maps all of them to ``AudioFormat(encoding, rate)`` or raises
``ProtocolError("unsupported_audio_format")``. The rate is an integer in 8-192 kHz; PCM and WAV default
to 24 kHz (OpenAI's rate), G.711 to 8 kHz. ``AudioFormat.to_ga()`` renders the GA object the session
object reports; ``to_beta()`` the legacy string for ``OpenAI-Beta: realtime=v1`` clients.

``AudioFormatSpec`` is the wire struct of a format *object*; it validates itself when decoded, raising
``ValueError("unsupported_audio_format: ...")`` so the codec can name the field at fault.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from duplex.protocol.errors import ProtocolError
from duplex.protocol.limits import Name

__all__ = [
    "DEFAULT_RATES",
    "MAX_RATE",
    "MIN_RATE",
    "AudioFormat",
    "AudioFormatSpec",
    "Encoding",
    "check_rate",
    "parse_format",
]

Encoding = Literal["pcm16", "f32", "pcmu", "pcma", "wav"]

MIN_RATE: Final = 8_000
MAX_RATE: Final = 192_000

DEFAULT_RATES: Final[dict[str, int]] = {
    "pcm16": 24_000,
    "f32": 24_000,
    "pcmu": 8_000,
    "pcma": 8_000,
    "wav": 24_000,
}

# Every spelling we accept, lower-cased (§8.1 plus OpenAI GA's audio/pcmu and audio/pcma).
_SPELLINGS: Final[dict[str, Encoding]] = {
    **dict.fromkeys(
        ("audio/pcm", "pcm", "audio/pcm16", "pcm16", "pcm_s16le", "audio/pcm_s16le", "s16le", "audio/s16le"),
        "pcm16",
    ),
    **dict.fromkeys(("audio/pcm_f32le", "pcm_f32le", "f32le", "audio/f32le", "f32"), "f32"),
    **dict.fromkeys(
        ("audio/pcmu", "pcmu", "g711_ulaw", "audio/g711_ulaw", "g711-ulaw", "ulaw", "mulaw", "mu-law"), "pcmu"
    ),
    **dict.fromkeys(
        ("audio/pcma", "pcma", "g711_alaw", "audio/g711_alaw", "g711-alaw", "alaw", "a-law"), "pcma"
    ),
    **dict.fromkeys(("wav", "audio/wav", "audio/x-wav", "audio/wave"), "wav"),
}

_GA_TYPES: Final[dict[str, str]] = {
    "pcm16": "audio/pcm",
    "f32": "audio/pcm_f32le",
    "pcmu": "audio/pcmu",
    "pcma": "audio/pcma",
    "wav": "audio/wav",
}
_BETA_NAMES: Final[dict[str, str]] = {
    "pcm16": "pcm16",
    "f32": "pcm_f32le",
    "pcmu": "g711_ulaw",
    "pcma": "g711_alaw",
    "wav": "wav",
}


class AudioFormat(msgspec.Struct, frozen=True):
    """A normalised audio format: ``encoding`` and sample ``rate`` in Hz (mono).

    ``pcm16`` is signed 16-bit little-endian, ``f32`` 32-bit float little-endian, ``pcmu``/``pcma``
    G.711 mu-law/A-law (one byte per sample), ``wav`` a RIFF container whose header states the rate.
    """

    encoding: Encoding
    rate: int

    @property
    def bytes_per_sample(self) -> int:
        """Bytes per mono sample; 0 for ``wav`` (a container, not a sample stream)."""
        return {"pcm16": 2, "f32": 4, "pcmu": 1, "pcma": 1, "wav": 0}[self.encoding]

    def to_ga(self) -> AudioFormatSpec:
        """The GA format object; G.711 objects carry no rate, as in OpenAI's schema."""
        if self.encoding in ("pcmu", "pcma"):
            return AudioFormatSpec(type=_GA_TYPES[self.encoding])
        return AudioFormatSpec(type=_GA_TYPES[self.encoding], rate=self.rate)

    def to_beta(self) -> str:
        """The legacy string name (``pcm16``, ``g711_ulaw`` ...)."""
        return _BETA_NAMES[self.encoding]


def check_rate(rate: object, *, field: str = "rate") -> int:
    """Return ``rate`` if it is an integer in 8-192 kHz, else raise ``unsupported_audio_format``."""
    if isinstance(rate, bool) or not isinstance(rate, int) or not MIN_RATE <= rate <= MAX_RATE:
        raise ProtocolError(
            "unsupported_audio_format",
            f"{field} must be an integer between {MIN_RATE} and {MAX_RATE} Hz, got {rate!r}",
            param=field,
        )
    return rate


def parse_format(spec: object, rate: int | None = None, *, param: str = "format") -> AudioFormat:
    """Normalise any accepted format spelling to an ``AudioFormat``.

    ``spec`` is a string, an ``AudioFormatSpec``, a dict (``type``|``format`` and
    ``rate``|``sample_rate_hz``|``sample_rate``) or an ``AudioFormat``. ``rate``, when given, wins over
    the rate inside ``spec`` (an append's ``sample_rate_hz`` beats the format object). Raises
    ``ProtocolError("unsupported_audio_format", param=param)`` for an unknown name or a rate outside
    8-192 kHz.
    """
    if isinstance(spec, AudioFormat):
        name: object = spec.encoding
        inner_rate: object = spec.rate
    elif isinstance(spec, AudioFormatSpec):
        name, inner_rate = spec.type, spec.rate
    elif isinstance(spec, dict):
        name = spec.get("type", spec.get("format"))
        inner_rate = spec.get("rate", spec.get("sample_rate_hz", spec.get("sample_rate")))
    else:
        name, inner_rate = spec, None
    encoding = _SPELLINGS.get(name.lower()) if isinstance(name, str) else None
    if encoding is None:
        raise ProtocolError(
            "unsupported_audio_format",
            f"Unsupported audio format {name!r}; use audio/pcm, audio/pcmu, audio/pcma, pcm16, "
            "pcm_f32le, g711_ulaw, g711_alaw or wav",
            param=param,
        )
    chosen = rate if rate is not None else inner_rate
    if chosen is None:
        return AudioFormat(encoding, DEFAULT_RATES[encoding])
    return AudioFormat(encoding, check_rate(chosen, field=f"{param}.rate"))


class AudioFormatSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A format object on the wire: GA ``{"type": "audio/pcm", "rate": 24000}``.

    Also accepts the vLLM-Omni spellings ``format`` (for ``type``) and ``sample_rate_hz`` /
    ``sample_rate`` (for ``rate``); they are folded into ``type`` and ``rate`` when decoded, so the
    struct always reads the same. Validated on construction: an unknown name or a bad rate raises
    ``ValueError("unsupported_audio_format: ...")``.
    """

    type: Name | None = None
    rate: int | None = None
    format_alias: Name | None = msgspec.field(default=None, name="format")
    sample_rate_hz: int | None = None
    sample_rate: int | None = None

    def __post_init__(self) -> None:
        name = self.type if self.type is not None else self.format_alias
        if name is None:
            name = "audio/pcm"  # GA: the type of a PCM format object may be left out
        rate = next((r for r in (self.rate, self.sample_rate_hz, self.sample_rate) if r is not None), None)
        try:
            parse_format(name, rate)
        except ProtocolError as exc:
            raise ValueError(f"unsupported_audio_format: {exc.message}") from None
        set_ = msgspec.structs.force_setattr
        set_(self, "type", name)
        set_(self, "rate", rate)
        set_(self, "format_alias", None)
        set_(self, "sample_rate_hz", None)
        set_(self, "sample_rate", None)

    def normalised(self) -> AudioFormat:
        """This object as an ``AudioFormat`` (already validated)."""
        return parse_format(self)
