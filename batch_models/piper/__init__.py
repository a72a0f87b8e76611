"""``piper_tts``: Piper voices on the CPU as a batch plugin.

``plugin``  ``PiperTTSPlugin`` (options and behaviour in its module docstring)
``pieces``  ``speech_pieces``: a text cut into bounded pieces that join back exactly
"""

from batch_models.piper.plugin import PiperTTSPlugin

__all__ = ["PiperTTSPlugin"]
