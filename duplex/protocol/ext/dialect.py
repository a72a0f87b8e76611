"""Which client a session talks to: an OpenAI Realtime client, or one written against the seeds.

The wire is one vocabulary, but two kinds of clients read it, and a few of their expectations
cannot both be met by one rendering:

* **GA** (``Dialect.GA``, the default): the official ``openai`` SDK, Pipecat, LiveKit and every
  other OpenAI Realtime client. Strict clients validate events against OpenAI's models, whose
  ``status_details.reason`` admits only ``turn_detected`` / ``client_cancelled`` (cancelled) and
  ``max_output_tokens`` / ``content_filter`` (incomplete); they get OpenAI's reasons, our own ids and
  OpenAI's defaults (24 kHz input).
* **SEEDS** (``Dialect.SEEDS``): a client written against vLLM-Omni's duplex runtime (its
  ``DuplexClient``, its browser clients, OmniInteract). It reads ``status_details.reason`` in the
  duplex vocabulary (``stop``, ``barge_in``, ``output_audio_buffer_clear`` ...), names the assistant
  item ``item_<response_id>`` in its acks, leaves the input rate at 16 kHz when it does not say one,
  expects one ``overlap.decision`` per overlapping append and reads the ``metadata`` of every audio
  delta (``end_of_turn``, ``audio_text_marks``, ``playback``).

Everything else is the same for both: extension fields ride on GA events as extra fields, which
OpenAI's models allow. The server picks the dialect at the handshake (a client that asks for
``duplex=1`` and opens its session with its first message, as every seeds client does) and the
session keeps it for its whole life, across resumes.
"""

from __future__ import annotations

import enum

__all__ = ["Dialect"]


class Dialect(enum.StrEnum):
    """The kind of client a session renders for (see the module docstring)."""

    GA = "ga"
    SEEDS = "seeds"
