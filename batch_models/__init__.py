"""Batch models: requests without a microphone (text in; audio or image chunks out), served as
``batch`` plugins (``duplex.plugins.base.BatchPlugin``) and stepped together across sessions.

Plugins (each in its own subpackage; importing this package loads no model):

``piper``      ``piper_tts``: Piper voices on the CPU, a text spoken piece by piece
``qwen3_tts``  ``qwen3_tts``: Qwen3-TTS (12 Hz, CustomVoice), decode steps batched across requests
``diffusion``  ``sd_turbo``: few-step diffusers text-to-image models, denoising steps batched across
               requests at different timesteps

Shared modules: ``base`` (``SlotBatchPlugin``: lifetime, slots and serve-time options of a batch
plugin), ``requests`` (a request's text and options, and the error codes of a refusal), ``slots``
(which slots are open and which run a request), ``plugin_options`` (serve-time options),
``devices`` (the torch plugins' ``device`` and ``dtype``).
See ``batch_models/README.md`` for each plugin's checkpoint layout, options and limits.
"""
