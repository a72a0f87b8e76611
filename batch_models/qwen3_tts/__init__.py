"""``qwen3_tts``: Qwen3-TTS 12 Hz CustomVoice as a continuously batched batch plugin.

``plugin``      ``Qwen3TTSPlugin``: requests, prompts, chunks (options in its module docstring)
``generation``  ``BatchedTalker``: per-slot caches at a fixed batch shape and the batched frame step
``talker``      the talker and code predictor modules (``model.safetensors``, ``talker.*``)
``codec``       the speech tokenizer's causal decoder (``speech_tokenizer/model.safetensors``)
``layers``      the Qwen3 transformer pieces they share
``config``      both configs of a checkpoint; tiny and full-size architectures
``loading``     the checkpoint directory, strict loading, the text tokenizer
``testing``     tiny random-weight checkpoints in the public layout
"""

from batch_models.qwen3_tts.plugin import Qwen3TTSPlugin

__all__ = ["Qwen3TTSPlugin"]
